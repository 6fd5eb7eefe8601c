"""Step traces (format `twinrun.trace.v1`): per-module checksums of one step, in execution order.

`--trace-step K` runs step K inside `StepTrace(model, run_dir / "trace.jsonl", K)`. While it is
open, every module of the model (leaves and containers alike, from `named_modules()`) and every
trainable parameter is watched, and one entry is appended per event, in the order the events
happen:

- `["forward", module, call, checksum]` when a module's forward returns: the exact sum of
  squares (`twinrun.diag.checksum.sumsq`) of its output (all tensors of a tuple/dict output,
  merged). `call` counts that module's forwards in this step (0, 1, ... — gradient
  accumulation, a module used twice, or the recompute of gradient checkpointing).
- `["backward", module, call, checksum]` when the gradient with respect to that output is
  ready (a tensor hook on the output): `call` is the forward call the output came from. A
  backward that reaches the same output several times (`retain_graph`, one backward per row)
  gives one entry per arrival. An output tensor other than the first of a tuple/dict is named
  `module[i]`.
- `["param_grad", parameter, k, checksum]` each time autograd has accumulated into a trainable
  parameter's `.grad` (`register_post_accumulate_grad_hook`; `k` counts the arrivals): the
  checksum of the accumulated `.grad` at that moment.
- `["final_grad", parameter, 0, checksum]` at exit, for every trainable parameter in
  `named_parameters()` order: its `.grad` as the optimizer will see it (`null` when it has none).

Forward hooks fire when a module returns, so a container comes after its children, and one
output tensor shared by several modules (an MLP returns its `down_proj`'s tensor) is recorded
under each of them, child first. Module names are `named_modules()` names (twinrun's Llama
matches Hugging Face's: `model.layers.2.self_attn.o_proj.lora_B`); the model itself is
`(model)`.

On a clean exit one row is written to `path`:

    {"format": "twinrun.trace.v1", "step": 3, "phase": "train",
     "entries": [["forward", "model.embed_tokens", 0, 12.5], ...]}

The file is rewritten whole, atomically (temporary file, fsync, rename, directory fsync): a
reader sees the old file or the new one. A row for the same (phase, step) already in the file
(a resumed or rerun step) is replaced, so the file holds the trace of the step that counted.
Checksums are written with `repr` (bit-exact when read back); non-finite ones as the strings
"NaN", "Infinity", "-Infinity". If the step raises, nothing is written and the hooks are removed.

`compare_traces` finds the first entry where two traces part (`twinrun diff` uses it at the first
divergent step); `read_trace` loads one row. Hooks compute checksums synchronously: a traced
step is slower than the others (it is meant for one step).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twinrun.core import reading
from twinrun.core.errors import DataError
from twinrun.core.jsonlimits import DIAG
from twinrun.diag.rows import decode_float, encode_float

__all__ = [
    "TRACE_FILENAME",
    "TRACE_FORMAT",
    "ROOT_NAME",
    "StepTrace",
    "TraceDivergence",
    "compare_traces",
    "direction",
    "read_trace",
    "trace_path_for",
]

TRACE_FORMAT = "twinrun.trace.v1"
TRACE_FILENAME = "trace.jsonl"
ROOT_NAME = "(model)"
KINDS = ("forward", "backward", "param_grad", "final_grad")
_HINT = "trace.jsonl rows are written by twinrun --trace-step"


def direction(kind: str) -> str:
    """The direction of an entry kind: forward outputs vs gradients (outputs or parameters)."""
    return "forward" if kind == "forward" else "backward"


def _tensors(out: Any) -> list[Any]:
    """The tensors of a module output, in a fixed order (tensor, tuple/list, dict/ModelOutput)."""
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    found: list[Any] = []
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, list | tuple):
        for item in out:
            if isinstance(item, torch.Tensor):
                found.append(item)
            elif isinstance(item, list | tuple | dict):
                found.extend(_tensors(item))
    return found


def _sumsq(tensors: list[Any]) -> float | None:
    """Merged exact sum of squares of the tensors (None when none has a supported dtype)."""
    import torch

    from twinrun.diag.checksum import SumSq

    acc = SumSq()
    used = False
    with torch.no_grad():
        for t in tensors:
            try:
                acc.add(t.detach())
            except TypeError:  # complex, float8, ...: not checksummed
                continue
            used = True
    return acc.value() if used else None


class StepTrace:
    """Context manager recording one step's per-module checksums (see the module docstring).

    `model` is any `torch.nn.Module`; `path` the trace.jsonl file (a directory means
    `path/trace.jsonl`); `step`/`phase` label the row. The hooks only record while the trace is
    open; `entries` holds what was recorded (also after exit)."""

    def __init__(
        self, model: Any, path: str | os.PathLike[str], step: int, phase: str = "train"
    ) -> None:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"trace step must be a non-negative integer, got {step!r}")
        p = Path(path)
        if p.is_dir():
            p = p / TRACE_FILENAME
        self.model = model
        self.path = p
        self.step = step
        self.phase = phase
        self.entries: list[list[Any]] = []
        self._handles: list[Any] = []
        self._calls: dict[str, int] = {}
        self._grad_calls: dict[str, int] = {}
        self._active = False
        self._params: list[tuple[str, Any]] = []

    # -- hooks -------------------------------------------------------------------------------

    def _forward_hook(self, name: str) -> Any:
        def hook(module: Any, args: Any, output: Any) -> None:
            if not self._active:
                return
            import torch

            call = self._calls.get(name, 0)
            self._calls[name] = call + 1
            tensors = _tensors(output)
            self.entries.append(["forward", name, call, _sumsq(tensors)])
            if not torch.is_grad_enabled():
                return
            index = 0
            for t in tensors:
                if t.is_floating_point() and t.requires_grad:
                    label = name if index == 0 else f"{name}[{index}]"
                    self._handles.append(t.register_hook(self._backward_hook(label, call)))
                    index += 1

        return hook

    def _backward_hook(self, label: str, call: int) -> Any:
        def hook(grad: Any) -> None:
            if self._active and grad is not None:
                self.entries.append(["backward", label, call, _sumsq([grad])])

        return hook

    def _grad_hook(self, name: str) -> Any:
        def hook(param: Any) -> None:
            if not self._active:
                return
            k = self._grad_calls.get(name, 0)
            self._grad_calls[name] = k + 1
            grad = param.grad
            self.entries.append(["param_grad", name, k, None if grad is None else _sumsq([grad])])

        return hook

    # -- context -----------------------------------------------------------------------------

    def __enter__(self) -> StepTrace:
        for name, module in self.model.named_modules():
            hook = self._forward_hook(name or ROOT_NAME)
            self._handles.append(module.register_forward_hook(hook))
        self._params = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        for name, param in self._params:
            self._handles.append(param.register_post_accumulate_grad_hook(self._grad_hook(name)))
        self._active = True
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._active = False
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if exc_type is not None:
            return
        for name, param in self._params:
            grad = param.grad
            self.entries.append(["final_grad", name, 0, None if grad is None else _sumsq([grad])])
        write_trace_row(self.path, self.row())

    def row(self) -> dict[str, Any]:
        """The JSON row for this trace (entries as recorded so far)."""
        return {
            "format": TRACE_FORMAT,
            "step": self.step,
            "phase": self.phase,
            "entries": [
                [k, n, c, None if v is None else encode_float(v)] for k, n, c, v in self.entries
            ],
        }


def write_trace_row(path: Path, row: dict[str, Any]) -> None:
    """Replace any row of the same (phase, step) in `path` by `row`, atomically."""
    from twinrun.core.fileio import atomic_write_text

    kept: list[str] = []
    if path.is_file():
        for _, raw in reading.iter_lines(path, "trace file", DIAG.max_bytes, DIAG.max_file_bytes):
            line = raw.decode("utf-8", "replace")
            if not line.strip():
                continue
            try:
                old = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn line from a killed writer of an older version: drop it
            same = old.get("step") == row["step"] and old.get("phase", "train") == row["phase"]
            if not same:
                kept.append(line)
    kept.append(json.dumps(row, allow_nan=False))
    atomic_write_text(path, "".join(line + "\n" for line in kept))


# -- reading and comparing --------------------------------------------------------------------


def trace_path_for(run: str | os.PathLike[str]) -> Path:
    """The trace.jsonl beside a run: `run/trace.jsonl` for a directory, else in the same
    directory as the given (diag.jsonl) file."""
    p = Path(run)
    return p / TRACE_FILENAME if p.is_dir() else p.parent / TRACE_FILENAME


Entry = tuple[str, str, int, float | None]


def _iter_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    for lineno, raw in reading.iter_lines(path, "trace file", DIAG.max_bytes, DIAG.max_file_bytes):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise DataError(f"{path}:{lineno}: not a valid JSON row", _HINT) from exc
        if type(obj) is dict and obj.get("format") == TRACE_FORMAT:
            yield lineno, obj


def read_trace(path: str | os.PathLike[str], step: int, phase: str = "train") -> list[Entry] | None:
    """The entries of the trace row for (phase, step) in `path` (the last such row), or None
    when the file or the row does not exist. DataError names the file and line of a bad row."""
    p = Path(path)
    if not p.is_file():
        return None
    found: tuple[int, dict[str, Any]] | None = None
    for lineno, obj in _iter_rows(p):
        if obj.get("step") == step and obj.get("phase", "train") == phase:
            found = (lineno, obj)
    if found is None:
        return None
    lineno, obj = found
    raw = obj.get("entries")
    if type(raw) is not list:
        raise DataError(f"{p}:{lineno}: 'entries' must be a list", _HINT)
    out: list[Entry] = []
    for e in raw:
        if (
            type(e) is not list
            or len(e) != 4
            or e[0] not in KINDS
            or type(e[1]) is not str
            or type(e[2]) is not int
        ):
            raise DataError(f"{p}:{lineno}: malformed trace entry {e!r}", _HINT)
        v = None if e[3] is None else decode_float(e[3], p, lineno, e[1])
        out.append((e[0], e[1], e[2], v))
    return out


@dataclass(frozen=True)
class TraceDivergence:
    """The first entry at which two traces of one step part.

    `kind`: the entry kind in run A (or B when A's trace ended); `direction`: "forward" or
    "backward"; `module`/`call`: what the entry names; `a`/`b`: the checksums (None: missing);
    `rel`: their relative difference (inf when the entries do not correspond); `position`: the
    entry index (execution order); `structural`: the two traces list different events here
    (`other` describes run B's entry); `within_tol`: every entry agrees within the tolerances
    and this is the first that differs at all; `first_of_kind`: no earlier entry of this kind
    exists (e.g. the first gradient of the backward)."""

    phase: str
    step: int
    kind: str
    direction: str
    module: str
    call: int
    a: float | None
    b: float | None
    rel: float
    position: int
    structural: bool = False
    other: str | None = None
    within_tol: bool = False
    first_of_kind: bool = False


def _same(a: float | None, b: float | None, rel_tol: float, abs_tol: float, exact: bool) -> bool:
    from twinrun.diag.tolerance import values_equal

    if a is None or b is None:
        return a is None and b is None
    if exact:
        return a == b or (math.isnan(a) and math.isnan(b))
    return values_equal(a, b, rel_tol, abs_tol)


def _describe(e: Entry | None) -> str:
    return "nothing more" if e is None else f"{e[0]} {e[1]} call {e[2]}"


def compare_traces(
    ta: list[Entry],
    tb: list[Entry],
    *,
    step: int,
    phase: str = "train",
    rel_tol: float = 1e-5,
    abs_tol: float = 1e-7,
    exact: bool = False,
) -> TraceDivergence | None:
    """The first entry, in execution order, where the traces part; None if they agree.

    Entries are compared position by position: a different (kind, module, call) is a structural
    divergence; otherwise the checksums are compared with the tolerances (`exact`: bit for bit).
    When nothing differs beyond the tolerances but some checksum differs at all, the first such
    entry is returned with `within_tol=True`."""
    from twinrun.diag.tolerance import relative_difference

    first_exact: TraceDivergence | None = None
    seen: set[str] = set()
    for i in range(max(len(ta), len(tb))):
        ea = ta[i] if i < len(ta) else None
        eb = tb[i] if i < len(tb) else None
        ref = ea if ea is not None else eb
        assert ref is not None
        first_of_kind = ref[0] not in seen
        seen.add(ref[0])
        if ea is None or eb is None or ea[:3] != eb[:3]:
            return TraceDivergence(
                phase, step, ref[0], direction(ref[0]), ref[1], ref[2],
                None if ea is None else ea[3], None if eb is None else eb[3], math.inf, i,
                structural=True, other=_describe(eb), first_of_kind=first_of_kind,
            )  # fmt: skip
        a, b = ea[3], eb[3]
        if _same(a, b, rel_tol, abs_tol, exact):
            if first_exact is None and not _same(a, b, 0.0, 0.0, True):
                rel = relative_difference(a, b) if a is not None and b is not None else math.inf
                first_exact = TraceDivergence(
                    phase, step, ea[0], direction(ea[0]), ea[1], ea[2], a, b, rel, i,
                    within_tol=True, first_of_kind=first_of_kind,
                )  # fmt: skip
            continue
        rel = relative_difference(a, b) if a is not None and b is not None else math.inf
        return TraceDivergence(
            phase, step, ea[0], direction(ea[0]), ea[1], ea[2], a, b, rel, i,
            first_of_kind=first_of_kind,
        )  # fmt: skip
    return first_exact
