"""`twinrun explain CONFIG.toml`: every check a run would make, without building a model.

For a replay config these are the seven ordered checks of `capture/checks.py`, each with its
result and, for a digest, `Expected sha256 … Got …`; a check whose inputs are not trusted
(after an earlier failure) is shown as skipped. For a source config: the config itself, its inputs
checked by the list every run is checked by (`train.setup.preflight`), and the capture
preconditions (initialization state, one step, no checkpoints, one device), skipped when the
inputs did not pass.

explain builds nothing and runs no user code: a GRPO plugin environment is located, never
imported (`rl/plugin_trust.py`, rules 1 and 2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twinrun.capture.checks import Check, run_checks
from twinrun.config.toml import TomlRun, load_toml
from twinrun.core.errors import TwinrunError
from twinrun.objectives.registry import objective


def explain_config(path: str | Path) -> dict[str, Any]:
    """The explain report (JSON-able); `ok` is true when every check passed."""
    run = load_toml(path)
    report: dict[str, Any] = {"config": str(path), "trainer": run.trainer}
    if run.trainer == "optimizer_replay":
        checks, v = run_checks(run, stop=False)
        if v.manifest:
            m = v.manifest
            report["capture"] = {
                "manifest": str(v.manifest_path),
                "manifest_sha256": v.manifest_sha256,
                "objective": m["objective"],
                "step": m["step"],
                "rows": m.get("rows"),
                "tokens": m.get("tokens"),
                "logical_batch_sha256": m["logical_batch_sha256"],
                "declared_differences": list(run.extras.allow_config_differences),
                "observed_differences": v.observed,
            }
    else:
        checks = [Check("config", "pass", f"{run.trainer}: keys and values valid")]
        inputs, examples = run_preflight(run)
        checks.append(inputs)
        from twinrun.capture.source import source_problems

        what = "capture_steps" if run.cfg.capture_steps else "v1 capture"
        name = f"{what} preconditions" if run.cfg.capture else "steps"
        if examples is None:  # an epoch run's steps are made from the rows the checks read
            checks.append(Check(name, "skip", "not trusted: inputs did not pass"))
        else:
            try:
                problems = source_problems(run, examples)
            except TwinrunError as exc:
                problems = [exc.one_line()]
            checks.append(
                Check(
                    name,
                    "fail" if problems else "pass",
                    "; ".join(problems) or "initial state, steps, checkpoints, device",
                )
            )
    report["checks"] = [c.as_dict() for c in checks]
    report["ok"] = all(c.status == "pass" for c in checks)
    return report


def run_preflight(run: TomlRun) -> tuple[Check, int | None]:
    """What `twinrun run` checks before it builds a model, by the same list (`preflight`): the
    planted faults, the output location, the model's files, the device, every examples row (and,
    for GRPO, against a built-in environment), the schedule, the initial adapter. Returns the
    check and the count of rows read (None when the check failed)."""
    from twinrun.train.setup.preflight import preflight

    try:
        data = preflight(run.training())
        if objective(run.trainer).samples:
            check_environment(run.cfg, data.items)
    except TwinrunError as exc:
        return Check("inputs", "fail", exc.one_line()), None
    rows = len(data.items)
    return Check("inputs", "pass", f"model, {rows} examples rows, output"), rows


def check_environment(cfg: Any, rows: list[Any]) -> None:
    """The run's environment opened as the run opens it (`open_environment`: its turn and time
    limits checked against its kind; a loopback URL checked by its form, no request sent), the
    rest of a tool environment's settings checked, and every examples row checked by it — but a
    plugin is only located (`check_plugin_name`: its form, not the standard library, its module
    found): explain never imports a plugin, so none of its code runs."""
    from twinrun.rl.environments import environment_kind, open_environment
    from twinrun.rl.plugin_trust import check_plugin_name
    from twinrun.rl.tool_settings import check_tool_run

    name, args = cfg.env or "", cfg.env_args or {}
    if environment_kind(name) == "plugin":
        check_plugin_name(name, args)
        return
    env = open_environment(name, args, max_turns=cfg.max_turns, timeout_s=cfg.tool_timeout)
    if env.plan.tool_turns:
        check_tool_run(env=name, chat_template=cfg.chat_template, inject=cfg.inject or [])
    env.check_rows(rows, cfg.seed)


def render(report: dict[str, Any]) -> str:
    """A table: one line per check (result, name, detail); digests on their own line."""
    width = max(len(c["name"]) for c in report["checks"])
    lines = [f"explain {report['config']} ({report['trainer']})"]
    for c in report["checks"]:
        mark = {"pass": "pass", "fail": "FAIL", "skip": "skip"}[c["status"]]
        detail = c.get("detail", "")
        if "expected" in c:
            detail = detail.split(": Expected sha256")[0]
            detail += f"\n{'':{width + 8}}Expected sha256 {c['expected']}  Got {c['got']}"
        lines.append(f"  {mark:4}  {c['name']:{width}}  {detail}")
    cap = report.get("capture")
    if cap:
        lines.append(
            f"capture: {cap['objective']} step {cap['step']}, {cap['rows']} rows, "
            f"{cap['tokens']} tokens; logical {cap['logical_batch_sha256']}"
        )
    failed = sum(c["status"] == "fail" for c in report["checks"])
    lines.append("all checks pass" if report["ok"] else f"{failed} check(s) failed")
    return "\n".join(lines)
