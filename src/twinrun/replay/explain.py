"""`twinrun explain CONFIG.toml`: every check a run would make, without building a model.

For a replay config these are the seven ordered checks of `capture/checks.py`, each with its
result and, for a digest, `Expected sha256 … Got …`; a check whose inputs are not trusted
(after an earlier failure) is shown as skipped. For a source config: the config itself and the
capture preconditions (initialization state, one step, no checkpoints, one device).

explain builds nothing and runs no user code: a GRPO plugin environment is located, never
imported (`rl/plugin_trust.py`, rules 1 and 2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from twinrun.capture.checks import Check, run_checks
from twinrun.config.toml import load_toml
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
        checks.append(run_preflight(run))
        from twinrun.capture.source import source_problems

        try:
            problems = source_problems(run)
        except TwinrunError as exc:
            problems = [exc.one_line()]
        what = "capture_steps" if run.cfg.capture_steps else "v1 capture"
        name = f"{what} preconditions" if run.cfg.capture else "steps"
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


def run_preflight(run: Any) -> Check:
    """What `twinrun run` checks before it builds a model, by the same functions: the config's
    numbers, the output location, the model's config.json and tokenizer, every examples row
    (and, for GRPO, against a built-in environment), the initial adapter."""
    from dataclasses import replace

    from twinrun.config.resolved import validate
    from twinrun.data.examples import load_rows
    from twinrun.model.loading import read_model_config
    from twinrun.train.outputs.run_dir import check_output_dir
    from twinrun.train.step.faults import parse_faults

    cfg = replace(run.cfg, objective=run.trainer)
    try:
        validate(cfg)
        parse_faults(cfg.inject, cfg.objective)
        from twinrun.core.paths import output_path

        output_path(cfg.output)
        if not cfg.resume:
            check_output_dir(cfg.output, cfg.overwrite)
        read_model_config(cfg.model)
        rows = load_rows(cfg.examples)
        if objective(run.trainer).samples:
            check_environment(cfg, rows)
        if cfg.init_adapter is not None:
            from twinrun.capture.state import read_trainer_state

            read_trainer_state(cfg.init_adapter)
    except TwinrunError as exc:
        return Check("inputs", "fail", exc.one_line())
    return Check("inputs", "pass", f"model, {len(rows)} examples rows, output")


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
