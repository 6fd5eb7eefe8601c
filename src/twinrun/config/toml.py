"""TOML run configs (DESIGN §5 "TOML run configs") mapped onto the one config tree.

Every `RunConfig` field names its TOML key (`training.learning_rate`, `backend.options.threads`,
...), so the flags, a TOML file and the sidecar are the same tree. The few keys that are not
training numbers (`inference.engine`, the replay pins, the `[evidence]` tolerances) live in
`RunExtras`. Loading rejects unknown keys (naming the nearest valid key), wrong types and missing
keys, and reports every problem of a file in one error. `resolved_tree` is the resolved config,
redacted (DESIGN §7), as it is recorded and hashed.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from twinrun.config.run import REQUIRED_BY_OBJECTIVE, RunConfig, fields_meta, validate
from twinrun.core.errors import ConfigError, TwinrunError
from twinrun.core.redact import REDACTED, redact

TRAINERS = ("sft", "dpo", "reward", "grpo", "optimizer_replay")
EPOCH_TRAINERS = ("sft", "dpo", "reward")
ENGINES = ("pytorch",)
FREE_FORM = ("environment.args",)  # tables passed on as they are (and redacted when recorded)
HEX64 = re.compile(r"^[0-9a-f]{64}$")


def _x(toml: str, default: Any = None, doc: str = "") -> Any:
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"toml": toml, "doc": doc})
    return field(default=default, metadata={"toml": toml, "doc": doc})


@dataclass(kw_only=True)
class RunExtras:
    """TOML keys beyond the training numbers."""

    engine: str = _x("inference.engine", "pytorch", "pytorch (the only engine)")
    replay_path: str | None = _x("optimizer_batch.replay_path", doc="the source manifest")
    expected_logical_sha256: str | None = _x("optimizer_batch.expected_logical_sha256")
    expected_manifest_sha256: str | None = _x("optimizer_batch.expected_manifest_sha256")
    allow_config_differences: list[str] = _x("optimizer_batch.allow_config_differences", [])
    min_update_cosine: float | None = _x("evidence.min_update_cosine")
    max_relative_delta_l2: float | None = _x("evidence.max_relative_delta_l2")


@dataclass
class TomlRun:
    """A loaded TOML config: the training numbers, the extras, and what the file said."""

    path: Path
    trainer: str
    cfg: RunConfig
    extras: RunExtras
    max_steps: int | None  # training.max_steps (grpo: also cfg.steps)
    given: set[str]  # TOML keys present in the file


def _kind(annotation: Any) -> str:
    text = str(annotation).replace(" | None", "").replace("None | ", "")
    kinds = {
        "str": "str",
        "int": "int",
        "float": "float",
        "bool": "bool",
        "list[str]": "list[str]",
        "list[int]": "list[int]",
        "dict[str, Any]": "table",
        "tuple[float, float]": "pair",
    }
    return kinds[text]


def schema() -> dict[str, tuple[str, str, str]]:
    """TOML key -> (owner "cfg" | "extras", field name, kind)."""
    out: dict[str, tuple[str, str, str]] = {"training.trainer": ("cfg", "objective", "str")}
    for owner, cls in (("cfg", RunConfig), ("extras", RunExtras)):
        for f in dataclasses.fields(cls):
            key = f.metadata.get("toml")
            if key and key not in out:
                out[key] = (owner, f.name, _kind(f.type))
    return out


def _type_ok(kind: str, value: Any) -> bool:
    def number(v: Any) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool)

    def integer(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    return {
        "str": lambda v: isinstance(v, str),
        "int": integer,
        "float": number,
        "bool": lambda v: isinstance(v, bool),
        "list[str]": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
        "list[int]": lambda v: isinstance(v, list) and all(integer(x) for x in v),
        "table": lambda v: isinstance(v, dict),
        "pair": lambda v: isinstance(v, list) and len(v) == 2 and all(number(x) for x in v),
    }[kind](value)


KIND_WORDS = {
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "true/false",
    "list[str]": "a list of strings",
    "list[int]": "a list of integers",
    "table": "a table",
    "pair": "a list of two numbers",
}


def _flatten(doc: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in doc.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and path not in FREE_FORM:
            out |= _flatten(value, path + ".")
        else:
            out[path] = value
    return out


def nearest(key: str, valid: list[str]) -> str:
    match = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    if not match:  # a misspelt section: compare the last part within every section
        last = key.rsplit(".", 1)[-1]
        tails = {k.rsplit(".", 1)[-1]: k for k in valid}
        close = difflib.get_close_matches(last, list(tails), n=1, cutoff=0.6)
        match = [tails[close[0]]] if close else []
    return f" (did you mean {match[0]}?)" if match else ""


def flag_to_key(message: str) -> str:
    """Rewrite `--flag` names in a validation message as the TOML keys they map to."""
    names = {
        m["flag"].split("/")[0]: m["toml"]
        for m in fields_meta().values()
        if m.get("flag") and m.get("toml")
    }
    return re.sub(r"--[a-z][a-z-]*", lambda m: names.get(m[0], m[0]), message)


def load_toml(path: str | Path, output: str | None = None) -> TomlRun:
    """Read and check a TOML config; every problem in one ConfigError."""
    p = Path(path)
    try:
        doc = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {p}", "check the path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {p}: {exc}", "check the file") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML ({exc})", "fix the syntax") from exc
    except RecursionError:  # arrays nested thousands deep
        raise ConfigError(f"{p}: values nested too deeply", "fix the config") from None
    keys = schema()
    flat = _flatten(doc)
    problems: list[str] = []
    values: dict[str, dict[str, Any]] = {"cfg": {}, "extras": {}}
    for key, value in flat.items():
        if key not in keys:
            problems.append(f"unknown key {key}{nearest(key, sorted(keys))}")
            continue
        owner, name, kind = keys[key]
        if not _type_ok(kind, value):
            problems.append(f"{key} must be {KIND_WORDS[kind]}, got {value!r}"[:200])
            continue
        values[owner][name] = tuple(value) if kind == "pair" else value
    trainer = values["cfg"].get("objective")
    if trainer not in TRAINERS:
        problems.append(f"training.trainer must be one of {', '.join(TRAINERS)}, got {trainer!r}")
    problems += _missing(trainer, set(flat), keys)
    if problems:
        raise ConfigError(f"{p}: {_count(problems)}: " + "; ".join(problems), _HINT)
    cfg_values = values["cfg"]
    max_steps = cfg_values.get("steps")
    if trainer != "grpo":
        cfg_values.pop("steps", None)
    if output is not None:
        cfg_values["output"] = output
    run = TomlRun(
        p, trainer, RunConfig(**cfg_values), RunExtras(**values["extras"]), max_steps, set(flat)
    )
    problems = value_problems(run)
    if problems:
        raise ConfigError(f"{p}: {_count(problems)}: " + "; ".join(problems), _HINT)
    return run


_HINT = "see DESIGN §5 'TOML run configs' for the keys and their meaning"


def _count(problems: list[str]) -> str:
    return "1 problem" if len(problems) == 1 else f"{len(problems)} problems"


def _missing(trainer: Any, given: set[str], keys: dict[str, tuple[str, str, str]]) -> list[str]:
    if trainer == "optimizer_replay":
        need = [
            "training.seed",
            "model.path",
            "logging.dir",
            "resume.from",
            "optimizer_batch.replay_path",
            "optimizer_batch.expected_logical_sha256",
            "optimizer_batch.expected_manifest_sha256",
        ]
    elif trainer in TRAINERS:
        by_objective = REQUIRED_BY_OBJECTIVE.get(trainer, ())
        meta = fields_meta()
        need = [
            m["toml"]
            for name, m in meta.items()
            if m.get("toml") and m.get("flag") and (m.get("required") or name in by_objective)
        ]
    else:
        need = []
    return [f"missing {k}" for k in need if k not in given and k in keys]


def value_problems(run: TomlRun) -> list[str]:
    """Value checks: the training numbers' own (as TOML keys), then the TOML-only rules."""
    cfg, x = run.cfg, run.extras
    problems: list[str] = []
    if run.trainer != "optimizer_replay":
        try:
            validate(cfg)
        except TwinrunError as exc:
            problems += [flag_to_key(m) for m in exc.message.split("; ")]
    elif cfg.seed is not None and not 0 <= cfg.seed < 2**63:
        problems.append(f"training.seed must be in [0, 2**63), got {cfg.seed}")
    if x.engine not in ENGINES:
        problems.append(f"inference.engine must be pytorch, got {x.engine!r}")
    if "," in cfg.device or cfg.device.strip() != cfg.device:
        problems.append(f"backend.devices must name exactly one device, got {cfg.device!r}")
    if run.max_steps is not None and run.max_steps < 1:
        problems.append(f"training.max_steps must be >= 1, got {run.max_steps}")
    if cfg.capture_steps is not None and not cfg.capture:
        problems.append("optimizer_batch.capture_steps needs optimizer_batch.capture = true")
    if cfg.capture_steps is not None and (
        not cfg.capture_steps
        or min(cfg.capture_steps) < 0
        or len(set(cfg.capture_steps)) != len(cfg.capture_steps)
    ):
        problems.append("optimizer_batch.capture_steps must be distinct steps >= 0")
    replay_keys = [
        k
        for k in ("replay_path", "expected_logical_sha256", "expected_manifest_sha256")
        if getattr(x, k) is not None
    ]
    if run.trainer == "optimizer_replay":
        problems += _replay_problems(run)
    elif replay_keys or x.allow_config_differences:
        problems.append(
            f"optimizer_batch.{(replay_keys or ['allow_config_differences'])[0]} "
            'only applies to trainer = "optimizer_replay"'
        )
    if x.min_update_cosine is not None and not -1 <= x.min_update_cosine <= 1:
        problems.append(f"evidence.min_update_cosine must be in [-1, 1], got {x.min_update_cosine}")
    if x.max_relative_delta_l2 is not None and not x.max_relative_delta_l2 >= 0:
        problems.append("evidence.max_relative_delta_l2 must be >= 0")
    return problems


def _replay_problems(run: TomlRun) -> list[str]:
    cfg, x = run.cfg, run.extras
    problems = []
    for key in ("expected_logical_sha256", "expected_manifest_sha256"):
        if not HEX64.match(getattr(x, key) or ""):
            problems.append(f"optimizer_batch.{key} must be 64 lowercase hex digits")
    if run.max_steps not in (None, 1):
        problems.append(
            f"a replay is exactly one update: training.max_steps must be 1, got {run.max_steps}"
        )
    if cfg.checkpoint_every not in (None, 0):
        problems.append("a replay writes no checkpoints: training.save_every must be 0")
    if cfg.capture:
        problems.append("a replay cannot capture: set optimizer_batch.capture = false")
    if len(set(x.allow_config_differences)) != len(x.allow_config_differences):
        problems.append("optimizer_batch.allow_config_differences lists a key twice")
    return problems


def resolved_tree(run: TomlRun) -> dict[str, Any]:
    """The resolved config (every key with a value, defaults included), redacted."""
    flat: dict[str, Any] = {"training.trainer": run.trainer}
    for key, (owner, name, _) in schema().items():
        if key == "training.trainer":
            continue
        value = getattr(run.cfg if owner == "cfg" else run.extras, name)
        if key == "training.max_steps":
            value = run.max_steps
        if value is not None:
            flat[key] = list(value) if isinstance(value, tuple) else value
    return nest_redacted(flat)


def nest_redacted(flat: dict[str, Any]) -> dict[str, Any]:
    """Nest dotted keys into tables; free-form tables keep their keys, lose their values."""
    tree: dict[str, Any] = {}
    for key, value in sorted(flat.items()):
        if key in FREE_FORM and isinstance(value, dict):
            value = {k: REDACTED for k in value}
        node = tree
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return redact(tree)
