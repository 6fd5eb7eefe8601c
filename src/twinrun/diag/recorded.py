"""What two runs' sidecars (`twinrun.json`) state differently: their recorded differences.

A sidecar records the facts a run was made from: every setting (`train`), the inputs' SHA256
(`model`, `data`, `eval`), the strict-mode provenance (`determinism`) and the library versions
(`runtime`). When two runs part, a fact they record differently is the first thing to name —
before any guess from the leaf that diverged. `recorded_differences(a, b)` compares two sidecar
dicts key by key; nested dicts are flattened to dotted keys (`determinism.cpu_kernels.mode`),
lists are compared whole, and a key one sidecar lacks counts as null. Each difference is one of:

- **setting** — the `train` section (and any section this module does not know);
- **input** — what was read: `model`, `data`, `eval`, `tokenizer`, `init_adapter`, and a
  replay's `replay` section (the captured step it read);
- **environment** — `determinism` and `runtime`, and the sidecar's own `format`.

Not facts, never compared: `metrics` (results, wall times among them), `adapter` (the outcome),
`inputs` (the paths given: they differ between any two runs). `determinism.torch_seed` is derived
from `train.seed`: it is reported only when the seeds agree (then the derivation itself changed).
`train.init_adapter` is a path: it counts only when one run started from an adapter and the other
did not; `init_adapter.sha256` says whether two adapters are the same.

`read_sidecar(run)` loads the `twinrun.json` beside a run's diag.jsonl (a run directory, or the
diag file's directory), and adds the tokenizer and initial-adapter SHA256 from the run's
`twinrun.inputs.json` when it has one. A run without a sidecar (a bare diag file) has no facts:
None, not an error. `bearing_on(diffs, advice)` picks the differences that bear on an advice
text (threads on advice about a thread count; kernels, torch or the CPU on advice about
kernels), which `twinrun diff` and `twinrun check` name first. Imports neither torch nor numpy.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from twinrun.core.errors import DataError

__all__ = [
    "KINDS",
    "RecordedDifference",
    "bearing_on",
    "classify",
    "flatten",
    "format_difference",
    "format_value",
    "read_sidecar",
    "recorded_between",
    "recorded_differences",
    "sidecar_path",
    "sidecars_differ_in",
]

SIDECAR = "twinrun.json"
INPUTS_RECORD = "twinrun.inputs.json"

Kind = Literal["setting", "input", "environment"]
KINDS: tuple[Kind, ...] = ("setting", "input", "environment")

_SECTIONS: dict[str, Kind | None] = {
    "train": "setting",
    "model": "input",
    "data": "input",
    "eval": "input",
    "tokenizer": "input",
    "init_adapter": "input",
    "replay": "input",
    "determinism": "environment",
    "runtime": "environment",
    "format": "environment",
    "metrics": None,
    "adapter": None,
    "inputs": None,
}
#: derived key -> the key it is derived from: reported only when the source agrees
DERIVED = {"determinism.torch_seed": "train.seed"}
#: keys holding a path: only whether one was given is a fact
PATHS = frozenset({"train.init_adapter"})


@dataclass(frozen=True, slots=True)
class RecordedDifference:
    """One dotted key two sidecars state differently; `a`/`b` are None where a sidecar lacks it."""

    key: str
    kind: Kind
    a: Any
    b: Any

    @property
    def section(self) -> str:
        return self.key.split(".", 1)[0]

    def values(self) -> str:
        """`1 vs 2`, as the text output writes them."""
        return f"{format_value(self.a)} vs {format_value(self.b)}"

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: key, section, kind, and the two sidecars' values, in that order."""
        return {name: getattr(self, name) for name in ("key", "section", "kind", "a", "b")}


def classify(key: str) -> Kind | None:
    """The kind of a dotted sidecar key; None for what is not a fact (results, paths given)."""
    section = key.split(".", 1)[0]
    return _SECTIONS.get(section, "setting")


def flatten(record: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as dotted keys, in the record's order (an empty dict is a value itself)."""
    out: dict[str, Any] = {}
    for k, v in record.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _same(a: Any, b: Any) -> bool:
    """JSON equality: a bool is not a number, 8 equals 8.0, NaN equals NaN, lists item by item."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, list | tuple) or isinstance(b, list | tuple):
        return False
    return bool(a == b)


def recorded_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[RecordedDifference]:
    """Every setting, input and environment fact sidecars `a` and `b` state differently, in
    the order of `a`'s keys (then `b`'s own). Identical facts: an empty list."""
    fa, fb = flatten(a), flatten(b)
    out: list[RecordedDifference] = []
    for key in [*fa, *(k for k in fb if k not in fa)]:
        kind = classify(key)
        va, vb = fa.get(key), fb.get(key)
        if kind is None or _same(va, vb):
            continue
        if key in DERIVED and not _same(fa.get(DERIVED[key]), fb.get(DERIVED[key])):
            continue
        if key in PATHS and va is not None and vb is not None:
            continue
        out.append(RecordedDifference(key, kind, va, vb))
    return out


# -- reading a run's sidecar -----------------------------------------------------------------


def sidecar_path(run: str | os.PathLike[str]) -> Path:
    """`run/twinrun.json` for a run directory, else the twinrun.json beside the given file."""
    p = Path(run)
    return p / SIDECAR if p.is_dir() else p.parent / SIDECAR


def read_sidecar(run: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The sidecar of a run directory (or of the diag file's directory), None when it has none.

    The run's `twinrun.inputs.json`, when present, adds `tokenizer.sha256` and
    `init_adapter.sha256` (where the sidecar has no such section). DataError when a file is
    there but is not a JSON object."""
    from twinrun.core.jsonlimits import check_sidecar, load_json_file

    path = sidecar_path(run)
    if not path.is_file():
        return None
    record = check_sidecar(load_json_file(path, what="the run's sidecar"), str(path))
    inputs_path = path.with_name(INPUTS_RECORD)
    if inputs_path.is_file():
        inputs = load_json_file(inputs_path, what="the run's inputs record")
        if not isinstance(inputs, dict):
            raise DataError(f"{inputs_path}: must be a JSON object", "point at a twinrun run")
        for section in ("tokenizer", "init_adapter"):
            sha = inputs.get(f"{section}_sha256")
            if sha is not None and section not in record:
                record[section] = {"sha256": sha}
    return record


def recorded_between(
    run_a: str | os.PathLike[str], run_b: str | os.PathLike[str]
) -> list[RecordedDifference] | None:
    """The recorded differences of two runs; None when either has no sidecar (nothing to say)."""
    a, b = read_sidecar(run_a), read_sidecar(run_b)
    if a is None or b is None:
        return None
    return recorded_differences(a, b)


# -- which differences bear on an advice -----------------------------------------------------

#: (recorded keys — exact, or a prefix ending in "." or "_" — , words in an advice they bear on)
_TOPICS: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (("train.threads", "determinism.threads", "determinism.interop_threads"), ("thread",)),
    (
        (
            "determinism.cpu_kernels.",
            "determinism.cpu_kernels",
            "determinism.device_name",
            "determinism.torch",
            "determinism.cuda",
            "runtime.torch",
            "runtime.platform",
        ),
        ("kernel", "libm", "machine", "device"),
    ),
    (("train.device", "determinism.device"), ("device", "kernel")),
    (("train.precision",), ("precision",)),
    (("train.attention", "determinism.attention"), ("attention",)),
    (("train.batch_size", "train.batch_invariant", "train.accumulation"), ("batch",)),
    (
        (
            "train.strict",
            "determinism.strict",
            "determinism.deterministic_algorithms",
            "determinism.cudnn_",
            "determinism.cublas_workspace_config",
        ),
        ("strict", "deterministic", "cublas"),
    ),
    (("train.chat_template", "train.max_length"), ("chat template", "max length", "tokenizer")),
    (
        ("train.learning_rate", "train.warmup_steps", "train.lr_schedule", "train.decay_steps"),
        ("learning rate", "learning-rate", "schedule"),
    ),
    (("train.epochs", "train.steps", "train.stop_after"), ("steps", "epochs", "schedule")),
    (("train.adam_", "train.weight_decay"), ("optimizer", "betas", "weight decay")),
)
#: advice phrases that point at a whole kind of fact: any difference of that kind bears on it
_POINTERS: tuple[tuple[str, tuple[Kind, ...]], ...] = (
    ("compare the two twinrun.json sidecars", KINDS),
    ("determinism provenance", ("environment",)),
    ("`train` section", ("setting",)),
    ("flags in twinrun.json", ("setting",)),
    ("optimizer contract", ("setting",)),
)
#: keys that bear on any divergence: another seed, or a fault planted on purpose
_ANY = frozenset({"train.seed", "train.inject", "format"})


def _matches(key: str, patterns: Iterable[str]) -> bool:
    return any(key == p or (p.endswith((".", "_")) and key.startswith(p)) for p in patterns)


def bearing_on(diffs: Sequence[RecordedDifference], advice: str) -> list[RecordedDifference]:
    """The differences that bear on an advice text (its cause and fix), in `diffs`' order:
    any input, another seed or a planted fault; a fact the advice names (threads, kernels,
    device, precision, attention, batch shape, strict mode, ...); or every fact of a kind the
    advice points at ("compare the two twinrun.json sidecars")."""
    text = advice.lower()
    kinds = {k for phrase, ks in _POINTERS if phrase in text for k in ks}
    named = [keys for keys, words in _TOPICS if any(re.search(rf"\b{w}", text) for w in words)]
    return [
        d
        for d in diffs
        if d.kind == "input"
        or d.key in _ANY
        or d.kind in kinds
        or any(_matches(d.key, keys) for keys in named)
    ]


SHOWN = 3


def sidecars_differ_in(diffs: Sequence[RecordedDifference], advice: str) -> str:
    """What an advice line says first: `the runs' sidecars differ in K (a vs b) and K2 (a vs b): `
    for the differences bearing on `advice` (the first SHOWN, then how many more); "" for none."""
    bearing = bearing_on(diffs, advice)
    if not bearing:
        return ""
    named = [f"{d.key} ({d.values()})" for d in bearing[:SHOWN]]
    if len(bearing) > SHOWN:
        named.append(f"{len(bearing) - SHOWN} more")
    listed = named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]
    return f"the runs' sidecars differ in {listed}: "


# -- text ------------------------------------------------------------------------------------

_DIGEST = re.compile(r"^[0-9a-f]{40,}$")
DIGEST_SHOWN = 12


def format_value(v: Any) -> str:
    """A value as JSON (`1`, `"2.13.0+cpu"`, `null`, `["q_proj"]`); a hex digest as its first
    DIGEST_SHOWN characters and `...` (the --json output has it whole)."""
    if isinstance(v, str) and _DIGEST.match(v):
        return v[:DIGEST_SHOWN] + "..."
    return json.dumps(v, allow_nan=True, default=str)


def format_difference(d: RecordedDifference, labels: tuple[str, str] = ("run_A", "run_B")) -> str:
    """`determinism.threads: run_A=1 run_B=2 (environment)`."""
    a, b = labels
    return f"{d.key}: {a}={format_value(d.a)} {b}={format_value(d.b)} ({d.kind})"
