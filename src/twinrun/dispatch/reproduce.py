"""`twinrun reproduce RUN_DIR --output DIR`: re-run a recorded run from its sidecar alone.

The sidecar (`twinrun.json`) holds every number that shaped the run (`train`), the paths it read
(`inputs`), the SHA256 of the model, the examples and the adapter it wrote, and the environment
it ran in (`determinism`, `runtime`). Reproducing is:

1. the run's configuration rebuilt from `train` and `inputs` (nothing else is read: no flags,
   no TOML); a value the sidecar redacted (a secret in an environment argument) cannot be
   re-run and is said so;
2. the inputs checked before anything runs: a missing file, or a model directory or examples
   file whose SHA256 moved, is "could not run" (exit 2), naming the file and both digests;
3. the run, on one process (a run made under torchrun reproduces on one: its bytes do not
   depend on the process count), into `--output`;
4. the verdict: the same adapter bytes (and reward head) is "reproduced" (exit 0); otherwise
   "diverged" (exit 1) with the recorded facts that differ between the two sidecars (versions,
   CPU kernels, threads, device, world size) and, where both runs wrote diag.jsonl, the first
   (step, leaf) where they part with its advice.
   After the run, the inputs record the re-run wrote (tokenizer, corpus, evaluation examples,
   initial adapter digests) is compared with the recorded one: a moved input is exit 2 too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from twinrun.config.run import RunConfig
from twinrun.core.errors import ConfigError, DataError, TwinrunError
from twinrun.core.redact import REDACTED
from twinrun.data.examples import examples_sha256
from twinrun.diag.recorded import (
    RecordedDifference,
    format_difference,
    read_sidecar,
    recorded_differences,
    sidecars_differ_in,
)
from twinrun.model.loading import model_sha256

REPRODUCED, DIVERGED, COULD_NOT_RUN = 0, 1, 2
INPUTS_RECORD = "twinrun.inputs.json"
INPUT_DIGESTS = (
    "model_sha256", "tokenizer_sha256", "data_sha256", "eval_sha256", "init_adapter_sha256",
)  # fmt: skip
SIDECAR = "twinrun.json"


@dataclass
class Reproduction:
    """The verdict, its exit code and the lines that explain it."""

    exit_code: int
    headline: str
    lines: list[str] = field(default_factory=list)
    differences: list[RecordedDifference] = field(default_factory=list)


def config_from_sidecar(
    sidecar: dict[str, Any], output: Path, quiet: bool, overwrite: bool = False
) -> RunConfig:
    """The run's configuration from its sidecar's `train` and `inputs` sections."""
    train = sidecar.get("train")
    inputs = sidecar.get("inputs")
    if not isinstance(train, dict) or not isinstance(inputs, dict) or "objective" not in train:
        raise DataError(
            "the sidecar has no train/inputs sections", "reproduce reads a training run's sidecar"
        )
    names = {f.name for f in dataclasses.fields(RunConfig)}
    reserved = sorted(k for k in train if k in _NOT_TRAIN)
    if reserved:
        raise DataError(
            f"the sidecar's train section holds {', '.join(reserved)}, which a run never "
            "records there (paths are in inputs; the output is --output)",
            "give the directory a run wrote, with its twinrun.json unedited",
        )
    values = {k: v for k, v in train.items() if k in names}
    wrong = sorted(k for k, v in values.items() if not _recorded_type(k, v))
    if wrong:
        raise DataError(
            f"the sidecar's train section holds a value of the wrong type for {', '.join(wrong)}",
            "give the directory a run wrote, with its twinrun.json unedited",
        )
    if isinstance(values.get("adam_betas"), list):
        values["adam_betas"] = tuple(values["adam_betas"])
    redacted = [k for k, v in values.items() if REDACTED in repr(v)]
    redacted += [k for k, v in inputs.items() if REDACTED in repr(v)]
    if redacted:
        raise DataError(
            f"the sidecar redacted {', '.join(sorted(redacted))} (it held a secret)",
            "re-run the original command with the secret instead",
        )
    paths = {k: inputs[k] for k in ("model", "examples", "corpus", "eval_examples") if k in inputs}
    try:
        return RunConfig(
            **values, **paths, **_defaults_taken(sidecar), output=str(output), quiet=quiet,
            overwrite=overwrite,
        )  # fmt: skip
    except TwinrunError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError) as exc:
        raise DataError(
            f"the sidecar's train/inputs sections do not make a run: {type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:200]}",
            "give the directory a run wrote, with its twinrun.json unedited",
        ) from None


def _defaults_taken(sidecar: dict[str, Any]) -> dict[str, Any]:
    """Where the run's numbers came from (its `--defaults` and the settings it took), as the
    sidecar's `defaults` section records it, so the re-run records it too ({} when none)."""
    from twinrun.config.run import SETTINGS
    from twinrun.config.trl_defaults import CHOICES

    record = sidecar.get("defaults")
    if not isinstance(record, dict) or record.get("from") not in CHOICES:
        return {}
    taken = record.get("taken")
    if not isinstance(taken, dict) or not all(name in SETTINGS for name in taken):
        raise DataError(
            "the sidecar's defaults section names settings twinrun does not have",
            "give the directory a run wrote, with its twinrun.json unedited",
        )
    return {"defaults": record["from"], "taken": tuple(taken)}


def _recorded_type(name: str, value: Any) -> bool:
    """Whether a sidecar's `train` value has the JSON type its setting's kind records."""
    from twinrun.config.run import SETTINGS

    s = SETTINGS.get(name)
    if s is None or value is None:
        return True
    number = (int, float)
    if s.kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if s.kind == "float":
        return isinstance(value, number) and not isinstance(value, bool)
    if s.kind == "bool":
        return isinstance(value, bool)
    if s.kind == "str":
        return (
            isinstance(value, list) and all(isinstance(v, str) for v in value)
            if s.multiple
            else isinstance(value, str)
        )
    if s.kind in ("list[str]", "targets"):
        return isinstance(value, str) or (
            isinstance(value, list) and all(isinstance(v, str) for v in value)
        )
    if s.kind == "list[int]":
        return isinstance(value, list) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        )
    if s.kind == "pair":
        return (
            isinstance(value, list)
            and len(value) == 2
            and all(isinstance(v, number) and not isinstance(v, bool) for v in value)
        )
    if s.kind == "table":
        return isinstance(value, dict)
    return True


# keys of RunConfig that a sidecar's `train` never holds (they come from `inputs` or the command)
_NOT_TRAIN = frozenset(
    {"output", "model", "examples", "corpus", "eval_examples", "quiet", "overwrite"}
)


def recorded_plugin(cfg: RunConfig) -> str | None:
    """The plugin `module.path:factory` the run's `env` names, or None for a built-in
    environment, a reward source, a tool environment or a factory twinrun declares. Any other
    function, twinrun's own included, is a plugin the user must name."""
    from twinrun.rl.environments import environment_kind
    from twinrun.rl.plugin_trust import DECLARED_FACTORIES, PLUGIN_NAME

    env = getattr(cfg, "env", None)
    if not isinstance(env, str) or environment_kind(env) != "plugin" or not PLUGIN_NAME.match(env):
        return None
    return None if env in DECLARED_FACTORIES else env


def check_named_plugin(cfg: RunConfig, named: str | None) -> None:
    """A run directory is data: its sidecar's plugin runs only when the user names the same one
    on the command line (`twinrun reproduce RUN --env NAME`). Checked before anything is
    imported."""
    plugin = recorded_plugin(cfg)
    if named is not None and named != (plugin or cfg.env):
        raise ConfigError(
            f"--env {named!r} is not the environment the run recorded ({cfg.env!r})",
            "--env only confirms the recorded plugin; it cannot change the environment",
        )
    if plugin is not None and named is None:
        raise ConfigError(
            f"the run's twinrun.json names the environment plugin {plugin!r}: code that "
            "reproduce does not import or run because a file names it",
            f"if you trust it, name it yourself: twinrun reproduce RUN --env {plugin} ...",
        )


def _missing_input(cfg: RunConfig) -> str | None:
    given = [("model directory", cfg.model), ("examples file", cfg.examples)]
    given += [("corpus file", p) for p in cfg.corpus or []]
    given += [("evaluation examples file", cfg.eval_examples)]
    given += [("initial adapter", cfg.init_adapter)]
    for what, path in given:
        if path is not None and not Path(path).exists():
            return f"the recorded {what} {path} is missing"
    return None


def _moved_input(cfg: RunConfig, sidecar: dict[str, Any]) -> str | None:
    """The model directory's or examples file's digest against the sidecar's."""
    checks: list[tuple[str, str | None, str, Callable[[str], str]]] = [
        ("model directory", cfg.model, "model", model_sha256)
    ]
    if cfg.examples is not None:
        checks.append(("examples file", cfg.examples, "data", examples_sha256))
    for what, path, section, digest in checks:
        want = (sidecar.get(section) or {}).get("sha256")
        if path is None or want is None:
            continue
        got = digest(path)
        if got != want:
            return f"the {what} {path} changed: recorded sha256 {want}, now {got}"
    return None


def _moved_record(run_dir: Path, output: Path) -> str | None:
    from twinrun.core.jsonlimits import load_json_file

    old_path, new_path = run_dir / INPUTS_RECORD, output / INPUTS_RECORD
    if not old_path.is_file() or not new_path.is_file():
        return None
    old = load_json_file(old_path, what="the run's inputs record")
    new = load_json_file(new_path, what="the re-run's inputs record")
    for key in INPUT_DIGESTS:
        if isinstance(old, dict) and isinstance(new, dict) and old.get(key) != new.get(key):
            what = key.removesuffix("_sha256").replace("_", " ")
            return f"the {what} changed: recorded sha256 {old.get(key)}, now {new.get(key)}"
    return None


def _outputs_equal(recorded: dict[str, Any], rerun: dict[str, Any]) -> list[str]:
    """The outputs whose digests differ (adapter, reward head)."""
    differ = []
    for section in ("adapter", "reward_head"):
        a = (recorded.get(section) or {}).get("sha256")
        b = (rerun.get(section) or {}).get("sha256")
        if a != b:
            differ.append(f"{section} sha256 recorded {a}, re-run {b}")
    return differ


def _first_divergence(
    run_dir: Path, output: Path, differences: list[RecordedDifference]
) -> list[str]:
    from twinrun.diag.advice import advice_for
    from twinrun.diag.compare import compare, divergence_line

    a, b = run_dir / "diag.jsonl", output / "diag.jsonl"
    if not a.is_file() or not b.is_file():
        return ["  (no diag.jsonl in both runs: run the original with --diag to see the step)"]
    result = compare(a, b, bitwise=True)
    if result.first is None and result.digests_skipped:
        return [
            "  diag.jsonl: every recorded leaf's checksum agrees exactly (the original's rows "
            f"are {result.formats[0] if result.formats else 'another format'}, whose digests "
            "this version does not compare)"
        ]
    if result.first is None:
        return ["  diag.jsonl: every recorded leaf agrees bit for bit"]
    first = result.first
    advice = advice_for(first.leaf).one_line()
    return [divergence_line(first),
            f"advice: {first.leaf}: {sidecars_differ_in(differences, advice)}{advice}"]  # fmt: skip


def native_note(sidecar: dict[str, Any], rerun: dict[str, Any]) -> list[str]:
    """Why a run made with the machine's own kernels on another kind of CPU may not reproduce,
    and how to get bytes that do."""

    def kernels(doc: dict[str, Any]) -> dict[str, Any]:
        found = (doc.get("determinism") or {}).get("cpu_kernels")
        return found if isinstance(found, dict) else {}

    was, now = kernels(sidecar), kernels(rerun)
    keys = ("cpu_model", "aten_capability", "native_capability", "mkl_cbwr")
    if was.get("mode") != "native" or all(was.get(k) == now.get(k) for k in keys):
        return []
    return [
        f"why: the run used --cpu-kernels native on {was.get('cpu_model', 'another CPU')} "
        f"({was.get('aten_capability', '?')} kernels): the machine's own matrix products and "
        "vector maths, whose bytes hold on that kind of CPU and thread count only; train it "
        "with --cpu-kernels portable for bytes every x86-64 CPU writes"
    ]


def reproduce(
    run_dir: str | Path,
    output: str | Path,
    quiet: bool = True,
    overwrite: bool = False,
    env: str | None = None,
) -> Reproduction:
    """Re-run `run_dir` into `output` and judge the result (see the module docstring)."""
    from twinrun.core.portable import unpin_environment
    from twinrun.model.adapter_check import check_run_adapter
    from twinrun.train.outputs.run_dir import check_output_dir, config_inputs

    run_dir, output = Path(run_dir), Path(output)
    try:
        sidecar = read_sidecar(run_dir)
        if sidecar is None:
            raise DataError(f"{run_dir} has no {SIDECAR}", "give the directory a run wrote")
        if (sidecar.get("train") or {}).get("cpu_kernels") == "native":
            # a native re-run takes the machine's kernels, which ATen chooses at its first
            # kernel: the adapter check below is one, so the portable pin goes first
            unpin_environment()
        check_run_adapter(run_dir, sidecar)  # the directory's own bytes, before anything runs
        cfg = config_from_sidecar(sidecar, output, quiet, overwrite)
        check_named_plugin(cfg, env)  # before anything the sidecar names is imported
        # before the inputs are hashed and the model loads; never the run it checks, or in it
        check_output_dir(output, overwrite, {"run being reproduced": run_dir, **config_inputs(cfg)})
        problem = _missing_input(cfg) or _moved_input(cfg, sidecar)
        if problem:
            return Reproduction(COULD_NOT_RUN, f"reproduce: could not run — {problem}")
        from twinrun.train.recipes import train  # torch: only once the run can be re-run

        rerun = train(cfg)
    except TwinrunError as exc:
        return Reproduction(COULD_NOT_RUN, f"reproduce: could not run — {exc.one_line()}")
    moved = _moved_record(run_dir, output)
    if moved:
        return Reproduction(COULD_NOT_RUN, f"reproduce: could not run — {moved}")
    rerun = read_sidecar(output) or rerun  # as written, with the inputs record's digests
    differences = recorded_differences(sidecar, rerun)
    facts = [f"  {format_difference(d, ('recorded', 're-run'))}" for d in differences]
    differ = _outputs_equal(sidecar, rerun)
    steps = (rerun.get("metrics") or {}).get("steps")
    if not differ:
        sha = (rerun.get("adapter") or {}).get("sha256")
        head = f"reproduce: REPRODUCED bit for bit — adapter sha256 {sha} ({steps} steps)"
        extra = ["recorded facts that differ (they did not move the bytes):", *facts]
        return Reproduction(REPRODUCED, head, extra if facts else [], differences)
    lines = ["  " + d for d in differ]
    same = "recorded facts: all equal (same versions, CPU kernels, threads, device)"
    lines += ["recorded facts that differ:", *facts] if facts else [same]
    lines += _first_divergence(run_dir, output, differences)
    lines += native_note(sidecar, rerun)
    return Reproduction(DIVERGED, "reproduce: DIVERGED — the re-run wrote other bytes", lines,
                        differences)  # fmt: skip
