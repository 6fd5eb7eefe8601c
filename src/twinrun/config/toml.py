"""TOML run configs mapped onto the one config tree.

Every `RunConfig` field declares its TOML key (`training.learning_rate`, `backend.options.threads`,
...), so the flags, a TOML file and the sidecar are the same tree. The few keys that are not
training numbers (`inference.engine`, the replay pins, the `[evidence]` tolerances) live in
`RunExtras`. Loading rejects unknown keys (naming the nearest valid key), wrong types and missing
keys, and reports every problem of a file in one error. `resolved_tree` is the resolved config,
redacted, as it is recorded and hashed.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from twinrun.config.resolved import ReplayPins, ValidRun, replay_pins, validate
from twinrun.config.run import SETTINGS, RunConfig, Settings, required_fields
from twinrun.config.setting import (
    KIND_WORDS,
    Setting,
    declare,
    settings_of,
    type_name,
    type_ok,
)
from twinrun.config.trl_defaults import fill_defaults
from twinrun.config.values import parse_lora_targets
from twinrun.core import reading
from twinrun.core.errors import ConfigError, TwinrunError
from twinrun.core.redact import REDACTED, redact
from twinrun.objectives.registry import NAMES, names

TRAINERS = (*NAMES, "optimizer_replay")
EPOCH_TRAINERS = names(counts="epochs")
ENGINES = ("pytorch",)
FREE_FORM = ("environment.args",)  # tables passed on as they are (and redacted when recorded)
HEX64 = re.compile(r"^[0-9a-f]{64}$")


def _x(kind: Any, toml: str, default: Any = None, help: str = "", **more: Any) -> Any:
    return declare(Setting(kind=kind, toml=toml, default=default, help=help, **more))


@dataclass(kw_only=True)
class RunExtras:
    """TOML keys beyond the training numbers."""

    engine: str = _x("str", "inference.engine", "pytorch", "pytorch (the only engine)",
                     choices=("pytorch",))  # fmt: skip
    replay_path: str | None = _x("str", "optimizer_batch.replay_path", help="the source manifest")
    expected_logical_sha256: str | None = _x("str", "optimizer_batch.expected_logical_sha256")
    expected_manifest_sha256: str | None = _x("str", "optimizer_batch.expected_manifest_sha256")
    allow_config_differences: list[str] = _x(
        "list[str]", "optimizer_batch.allow_config_differences", []
    )
    min_update_cosine: float | None = _x("float", "evidence.min_update_cosine", low=-1, high=1)
    max_relative_delta_l2: float | None = _x("float", "evidence.max_relative_delta_l2", low=0)


@dataclass
class TomlRun:
    """A loaded TOML config: the training numbers, the extras, and what the file said."""

    path: Path
    trainer: str
    cfg: RunConfig
    extras: RunExtras
    max_steps: int | None  # training.max_steps (grpo: also cfg.steps)
    given: set[str]  # TOML keys present in the file
    resolved: ValidRun | ReplayPins | None = None  # what `load_toml` checked: see `training`

    def training(self) -> ValidRun:
        """A training config's validated run; RuntimeError (a bug) for a replay config."""
        if not isinstance(self.resolved, ValidRun):
            raise RuntimeError(f"a {self.trainer} config has no validated training run")
        return self.resolved

    def pins(self) -> ReplayPins:
        """A replay config's required inputs; RuntimeError (a bug) for a training config."""
        if not isinstance(self.resolved, ReplayPins):
            raise RuntimeError(f"a {self.trainer} config is not a replay's")
        return self.resolved


def schema() -> dict[str, tuple[str, str, str]]:
    """TOML key -> (owner "cfg" | "extras", field name, kind)."""
    out: dict[str, tuple[str, str, str]] = {}
    for owner, cls in (("cfg", RunConfig), ("extras", RunExtras)):
        for name, s in settings_of(cls).items():
            if s.toml and s.toml not in out:
                out[s.toml] = (owner, name, s.kind)
    return out


def settings() -> dict[str, Setting]:
    """TOML key -> its declaration."""
    out: dict[str, Setting] = {}
    for cls in (RunConfig, RunExtras):
        for s in settings_of(cls).values():
            if s.toml:
                out.setdefault(s.toml, s)
    return out


MAX_TABLE_DEPTH = 32  # the deepest key twinrun reads is 3 tables deep


def _flatten(doc: dict[str, Any], prefix: str = "", depth: int = 1) -> dict[str, Any]:
    """Dotted key -> value, in the file's order; ConfigError past MAX_TABLE_DEPTH (checked
    before descending, so the recursion stays shallow)."""
    if depth > MAX_TABLE_DEPTH:
        raise ConfigError(f"tables nested deeper than {MAX_TABLE_DEPTH} levels", "fix the config")
    out: dict[str, Any] = {}
    for key, value in doc.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and path not in FREE_FORM:
            out |= _flatten(value, path + ".", depth + 1)
        else:
            out[path] = value
    return out


MAX_CONFIG_BYTES = 4 << 20  # a config is a few hundred bytes
NEAREST_MAX_CHARS = 200  # longer than any valid key by far: compared by a prefix only
NEAREST_MAX_UNKNOWN = 20  # unknown keys given a suggestion; the rest are only named


def nearest(key: str, valid: list[str]) -> str:
    """The " (did you mean K?)" for the valid key nearest to `key`, or "". Only the first
    NEAREST_MAX_CHARS characters are compared, so the cost per key is bounded."""
    key = key[:NEAREST_MAX_CHARS]
    match = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    if not match:  # a misspelt section: compare the last part within every section
        last = key.rsplit(".", 1)[-1]
        tails = {k.rsplit(".", 1)[-1]: k for k in valid}
        close = difflib.get_close_matches(last, list(tails), n=1, cutoff=0.6)
        match = [tails[close[0]]] if close else []
    return f" (did you mean {match[0]}?)" if match else ""


def _shown(key: str) -> str:
    """A key as an error names it: cut after NEAREST_MAX_CHARS characters."""
    return key if len(key) <= NEAREST_MAX_CHARS else key[:NEAREST_MAX_CHARS] + "..."


OTHER_FORMATS = {".yaml": "YAML", ".yml": "YAML", ".json": "JSON"}


def _read_flat(p: Path) -> dict[str, Any]:
    """The config file's keys, dotted, and their values, in the file's order; ConfigError, naming
    the file, when it is too large, not text, not valid TOML or nested too deeply."""
    text = reading.read_text(p, "config file", MAX_CONFIG_BYTES, ConfigError)
    try:
        doc = tomllib.loads(text.removeprefix("\ufeff"))  # TOML allows a UTF-8 BOM
    except tomllib.TOMLDecodeError as exc:
        kind = OTHER_FORMATS.get(p.suffix.lower())
        if kind is not None:  # a YAML or JSON config, as other trainers take
            raise ConfigError(
                f"{p}: a {kind} file; `twinrun run` reads TOML configs",
                "write the config in TOML (examples/*.toml show every trainer's)",
            ) from exc
        raise ConfigError(f"{p}: not valid TOML ({exc})", "fix the syntax") from exc
    except RecursionError:  # arrays nested thousands deep
        raise ConfigError(f"{p}: values nested too deeply", "fix the config") from None
    try:
        return _flatten(doc)
    except ConfigError as exc:
        raise ConfigError(f"{p}: {exc.message}", exc.hint) from None


def _key_problem(key: str, value: Any, kind: str) -> str | None:
    """What is wrong with a known key's value (a NUL byte, or the wrong type), if anything."""
    if any("\0" in v for v in (value if isinstance(value, list) else [value])
           if isinstance(v, str)):  # fmt: skip
        return f"{key} contains a NUL byte"
    if not type_ok(kind, value):
        return f"{key} must be {KIND_WORDS[kind]} (got {type_name(value)})"
    return None


def _sorted_values(
    flat: dict[str, Any], keys: dict[str, tuple[str, str, str]]
) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """The problems of the file's keys (unknown ones, the first NEAREST_MAX_UNKNOWN with the
    nearest valid key, then wrong values), and the good values by owner (`cfg` or `extras`)
    and field name."""
    problems: list[str] = []
    values: dict[str, dict[str, Any]] = {"cfg": {}, "extras": {}}
    unknown = 0
    for key, value in flat.items():
        if key not in keys:
            unknown += 1
            if unknown <= NEAREST_MAX_UNKNOWN:
                problems.append(f"unknown key {_shown(key)}{nearest(key, sorted(keys))}")
            continue
        owner, name, kind = keys[key]
        problem = _key_problem(key, value, kind)
        if problem is not None:
            problems.append(problem)
            continue
        if kind == "targets":
            value = parse_lora_targets(value)
        values[owner][name] = tuple(value) if kind == "pair" else value
    if unknown > NEAREST_MAX_UNKNOWN:
        problems.append(f"{unknown - NEAREST_MAX_UNKNOWN} more unknown keys")
    return problems, values


def _trainer_problem(trainer: Any) -> list[str]:
    """training.trainer's problem, if it is not one of TRAINERS (a short string is shown)."""
    if trainer in TRAINERS:
        return []
    shown = f", got {trainer!r}" if isinstance(trainer, str) and len(trainer) <= 16 else ""
    return [f"training.trainer must be one of {', '.join(TRAINERS)}{shown}"]


def load_toml(path: str | Path, output: str | None = None, quiet: bool = False) -> TomlRun:
    """Read and check a TOML config; every problem in one ConfigError. `output` and `quiet`
    (the command line's) override the file's."""
    p = Path(reading.check_path_text(path, "config", ConfigError))
    flat = _read_flat(p)
    keys = schema()
    problems, values = _sorted_values(flat, keys)
    trainer = values["cfg"].get("objective")
    problems += _trainer_problem(trainer)
    cfg_values = values["cfg"]
    max_steps = cfg_values.get("steps")
    if trainer not in names(counts="steps"):
        cfg_values.pop("steps", None)
    if output is not None:
        cfg_values["output"] = output
    if quiet:
        cfg_values["quiet"] = True
    cfg = fill_defaults(RunConfig(**cfg_values))  # what `training.defaults` takes is given
    problems += _missing(trainer, set(flat) | {SETTINGS[n].toml for n in cfg.taken}, keys)
    if problems:
        raise ConfigError(f"{p}: {_count(problems)}: " + "; ".join(problems), _HINT)
    run = TomlRun(
        p,
        trainer,  # type: ignore[arg-type]  # one of TRAINERS: checked above
        cfg,
        RunExtras(**values["extras"]),
        max_steps,
        set(flat),
    )
    problems, valid = checked_values(run)
    if problems:
        raise ConfigError(f"{p}: {_count(problems)}: " + "; ".join(problems), _HINT)
    return replace(run, resolved=valid or replay_pins(run.cfg))


_HINT = "docs/training.md lists every key and its meaning"


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
        known = settings_of(RunConfig)
        need = [known[name].toml for name in required_fields(trainer) if known[name].flag]
    else:
        need = []
    return [f"missing {k}" for k in need if k not in given and k in keys]


def checked_values(run: TomlRun) -> tuple[list[str], ValidRun | None]:
    """Value checks: the training numbers' own (as TOML keys), then the TOML-only rules; and a
    training config's validated run (None for a replay's, or when its numbers have problems)."""
    cfg, x = run.cfg, run.extras
    problems: list[str] = []
    valid = None
    if run.trainer != "optimizer_replay":
        try:
            valid = validate(cfg, source="toml")
        except TwinrunError as exc:
            problems += exc.message.split("; ")
    else:  # a replay takes its numbers from the source; what it gives must still be sound
        problems += given_value_problems(run)
    problems += extras_problems(x)
    if "," in cfg.device or cfg.device.strip() != cfg.device:
        problems.append(f"backend.devices must name exactly one device, got {cfg.device!r}")
    if run.max_steps is not None and (
        p := settings()["training.max_steps"].problem(run.max_steps, "toml")
    ):
        problems.append(p)
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
    return problems, valid


def given_value_problems(run: TomlRun) -> list[str]:
    """Each training number the file gives, against its declaration (no required keys)."""
    known = settings()
    problems = []
    for key in sorted(run.given):
        owner, name, _ = schema().get(key, ("", "", ""))
        if owner != "cfg" or key == "training.trainer":
            continue
        value = getattr(run.cfg, name)
        if value is not None and (p := known[key].problem(value, "toml")) is not None:
            problems.append(p)
    return problems


def extras_problems(x: RunExtras) -> list[str]:
    problems = []
    for name, s in settings_of(RunExtras).items():
        value = getattr(x, name)
        if value is not None and (p := s.problem(value, "toml")) is not None:
            problems.append(p)
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
    """The resolved config (every key with a value, defaults included — a training config's
    numbers taken from `training.defaults` too), redacted."""
    settings: Settings = run.training() if isinstance(run.resolved, ValidRun) else run.cfg
    return settings_tree(run.trainer, settings, run.extras, run.max_steps)


def settings_tree(
    trainer: str, settings: Settings, extras: RunExtras, max_steps: int | None
) -> dict[str, Any]:
    """The redacted config tree of `settings` (a `RunConfig` as given, or a validated run) and
    `extras`: every key with a value."""
    flat: dict[str, Any] = {"training.trainer": trainer}
    for key, (owner, name, _) in schema().items():
        if key == "training.trainer":
            continue
        value = settings.value(name) if owner == "cfg" else getattr(extras, name)
        if key == "training.max_steps":
            value = max_steps
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
