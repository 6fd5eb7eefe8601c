"""Op traces (format `twinrun.optrace.v1`): every torch op of a run, its shapes and its output's
digest, in execution order — to name the first op that moved when bytes differ across machines.

`OpTrace()` is a context manager (a `TorchDispatchMode`): while it is open, each aten op that
runs (forward, backward and the optimizer; the portable kernels' own inner ops included, since
they are torch ops too) appends one entry:

    [op, input_shapes, dtype, digest, site]

- `op`: the overload name, e.g. `aten.mm.default`;
- `input_shapes`: the shapes of its tensor arguments (lists);
- `dtype`: the first output's dtype;
- `digest`: the first 16 hex digits of the SHA256 of every floating output's bytes (contiguous,
  in order), "-" when the op returns no floating tensor;
- `site`: `file:line` of the innermost Python frame outside torch and this module that led to
  the op (a transformers layer, twinrun's AdamW, ...), or "" when none.

`compare_op_traces(reference, here)` returns the first entry where two traces part (op, shapes
or digest) — each op is judged on its own inputs only in the sense that everything before it
agreed, so the first mismatch is the op whose kernel computed differently.
"""

from __future__ import annotations

import hashlib
import traceback
from dataclasses import dataclass
from typing import Any

FORMAT = "twinrun.optrace.v1"
_SKIP: tuple[str, ...] = ("/torch/", "/twinrun/golden/op_trace.py")
_SKIP += ("/twinrun/core/portable_ops.py", "/twinrun/core/exact_matmul.py")
_SKIP += ("/twinrun/core/portable_math.py", "/twinrun/core/digit_kernels.py")
_QUIET = {"detach", "view", "_unsafe_view", "t", "transpose", "expand", "alias", "empty"}


def _site() -> str:
    for frame in reversed(traceback.extract_stack(limit=40)):
        name = frame.filename.replace("\\", "/")
        if not any(s in name for s in _SKIP) and "<frozen" not in name:
            parts = name.rsplit("/site-packages/", 1)
            short = parts[-1] if len(parts) > 1 else name.rsplit("/src/", 1)[-1]
            return f"{short}:{frame.lineno}"
    return ""


def _digest(out: Any) -> tuple[str, str]:
    import torch

    tensors = [t for t in _flatten(out) if isinstance(t, torch.Tensor)]
    floats = [t for t in tensors if t.is_floating_point() and t.device.type == "cpu"]
    dtype = str(tensors[0].dtype).removeprefix("torch.") if tensors else "-"
    if not floats:
        return dtype, "-"
    h = hashlib.sha256()
    for t in floats:
        h.update(t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return dtype, h.hexdigest()[:16]


def _flatten(x: Any) -> list[Any]:
    if isinstance(x, (list, tuple)):
        return [y for item in x for y in _flatten(item)]
    return [x]


def _mode_base() -> type:
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


class OpTrace:
    """Record every aten op run while open (`entries`)."""

    def __init__(self) -> None:
        self.entries: list[list[Any]] = []
        self._mode: Any = None

    def __enter__(self) -> OpTrace:
        import torch

        entries = self.entries
        base = _mode_base()

        class _Mode(base):  # type: ignore[misc,valid-type]  # a base found at run time (lazy torch)
            def __torch_dispatch__(
                self, func: Any, types: Any, args: Any = (), kwargs: Any = None
            ) -> Any:
                out = func(*args, **(kwargs or {}))
                name = func.overloadpacket.__name__
                if name not in _QUIET:
                    shapes = [
                        list(a.shape) for a in _flatten(list(args)) if isinstance(a, torch.Tensor)
                    ]
                    dtype, digest = _digest(out)
                    entries.append([str(func), shapes, dtype, digest, _site()])
                return out

        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._mode.__exit__(*exc)


@dataclass(frozen=True)
class OpMismatch:
    index: int
    reference: list[Any] | None
    here: list[Any] | None

    def describe(self) -> str:
        if self.reference is None or self.here is None:
            which = "the reference" if self.reference is None else "this machine's trace"
            return f"op {self.index}: {which} ends here (the traces ran different op counts)"
        op, shapes, _, ref_digest, site = self.reference
        if self.here[0] != op or self.here[1] != shapes:
            return (
                f"op {self.index}: the reference ran {op} {shapes}, this machine "
                f"{self.here[0]} {self.here[1]} (at {self.here[4] or 'an unknown site'})"
            )
        return (
            f"op {self.index}: {op} on {shapes} computed other bytes "
            f"({ref_digest} vs {self.here[3]}), called from {site or 'an unknown site'}"
        )


def compare_op_traces(reference: list[list[Any]], here: list[list[Any]]) -> OpMismatch | None:
    for i in range(max(len(reference), len(here))):
        a = reference[i] if i < len(reference) else None
        b = here[i] if i < len(here) else None
        if a is None or b is None or a[:4] != b[:4]:
            return OpMismatch(i, a, b)
    return None


def trace_callable(fn: Any) -> list[list[Any]]:
    """Run fn() under an OpTrace; its entries."""
    with OpTrace() as trace:
        fn()
    return trace.entries
