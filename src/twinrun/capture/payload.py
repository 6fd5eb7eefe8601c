"""The capture payload: one optimizer batch and the RNG state, as safetensors bytes.

Ragged rows are stored flat: `row_offsets` [N+1] and `tokens` [T] (int64), with the per-token
`loss_mask` (uint8), per-row `active_counts` (int64), the loss `denominator` and the
`forward_sizes` (rows per forward, in order). Per-objective data is the OptimizerBatch's `update`
columns (`UpdateColumns`): `floats.<name>` (float64) and `ints.<name>` (int64), each either per
token ([T], aligned with `tokens`) or per row ([N]) — the `layout` in the metadata says which
(the metadata is one key, `twinrun`, holding canonical JSON: format, objective, layout). Then the
torch generator states (`rng.cpu`, `rng.cuda.<i>`, uint8) and twinrun's stream position
(`stream_position` = seed, step: every twinrun draw is keyed by them, so they are the whole
generator position).

`decode` trusts nothing: every name, dtype, shape and invariant is checked, and a failure is a
`DataError` naming what is wrong. safetensors only — a payload can never execute code.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from twinrun.capture.batch import (
    OPTIONAL_UPDATE_COLUMNS,
    UPDATE_COLUMNS,
    OptimizerBatch,
    UpdateColumns,
)
from twinrun.core.errors import DataError
from twinrun.core.jsonlimits import SMALL, parse_json
from twinrun.objectives.registry import BY_NAME, NAMES, Batch

FORMAT = "twinrun.optimizer-batch.v1"
META_KEY = "twinrun"
# what each batch shape's update needs beyond rows and masks: name -> layout
REQUIRED_EXTRAS: dict[str, dict[str, str]] = {
    "rollouts": {key: layout for _, key, layout in UPDATE_COLUMNS},
}
# what a batch shape may hold besides: rollouts of a tool environment hold tool and environment
# tokens, which `ints.model_mask` (1 on the model's sampled tokens) keeps out of the update
OPTIONAL_EXTRAS: dict[str, dict[str, str]] = {
    "rollouts": {key: layout for _, key, layout in OPTIONAL_UPDATE_COLUMNS},
}
BASE: tuple[str, ...] = (
    "row_offsets",
    "tokens",
    "loss_mask",
    "active_counts",
    "denominator",
    "forward_sizes",
)
BASE += ("step", "stream_position")


@dataclass
class BatchArrays:
    """An OptimizerBatch as flat numpy arrays (what is stored, hashed and validated)."""

    objective: str
    step: int
    offsets: np.ndarray  # int64 [N+1]
    tokens: np.ndarray  # int64 [T]
    loss_mask: np.ndarray  # uint8 [T]
    forward_sizes: np.ndarray  # int64 [F]
    denominator: int
    extras: dict[str, tuple[str, np.ndarray]] = field(default_factory=dict)  # name -> (layout, a)

    @property
    def rows(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @classmethod
    def from_batch(cls, batch: OptimizerBatch) -> BatchArrays:
        lengths = np.array([len(r) for r in batch.rows], dtype=np.int64)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        extras: dict[str, tuple[str, np.ndarray]] = {}
        columns = batch.update.columns() if batch.update is not None else {}
        for key, (layout, value) in columns.items():
            dtype = np.float64 if key.startswith("floats.") else np.int64
            flat = [x for row in value for x in row] if layout == "token" else list(value)
            extras[key] = (layout, np.array(flat, dtype))
        return cls(
            objective=batch.objective,
            step=batch.step,
            offsets=offsets,
            tokens=np.array([t for r in batch.rows for t in r], dtype=np.int64),
            loss_mask=np.array([m for r in batch.loss_masks for m in r], dtype=np.uint8),
            forward_sizes=np.array(batch.forward_sizes, dtype=np.int64),
            denominator=int(batch.denominator),
            extras=extras,
        )

    def to_batch(self) -> OptimizerBatch:
        bounds = self.offsets.tolist()
        tokens, mask = self.tokens.tolist(), self.loss_mask.tolist()

        def split(flat: list[Any]) -> list[list[Any]]:
            return [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

        columns = {
            key: split(a.tolist()) if layout == "token" else a.tolist()
            for key, (layout, a) in self.extras.items()
        }
        return OptimizerBatch(
            objective=self.objective,
            step=self.step,
            rows=split(tokens),
            loss_masks=split(mask),
            forward_sizes=self.forward_sizes.tolist(),
            denominator=self.denominator,
            update=UpdateColumns.from_columns(columns) if columns else None,
        )


@dataclass
class Decoded:
    """A decoded, validated payload."""

    arrays: BatchArrays
    rng: dict[str, Any]  # {"cpu": uint8 tensor, "cuda": [uint8 tensors]} for restore_torch_rng
    seed: int


def encode(arrays: BatchArrays, rng: dict[str, Any], seed: int) -> bytes:
    """The payload bytes (deterministic for the same inputs)."""
    import torch

    from twinrun.core.safetensors_io import tensors_bytes

    def t(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a))

    tensors = {
        "row_offsets": t(arrays.offsets),
        "tokens": t(arrays.tokens),
        "loss_mask": t(arrays.loss_mask),
        "active_counts": t(active_counts(arrays)),
        "denominator": torch.tensor([arrays.denominator], dtype=torch.int64),
        "forward_sizes": t(arrays.forward_sizes),
        "step": torch.tensor([arrays.step], dtype=torch.int64),
        "stream_position": torch.tensor([seed, arrays.step], dtype=torch.int64),
        "rng.cpu": rng["cpu"].contiguous(),
    }
    for i, state in enumerate(rng.get("cuda", [])):
        tensors[f"rng.cuda.{i}"] = state.contiguous()
    layout = {}
    for key, (kind, a) in arrays.extras.items():
        tensors[key] = t(a)
        layout[key] = kind
    metadata = pack_meta({"format": FORMAT, "objective": arrays.objective, "layout": layout})
    return tensors_bytes(tensors, metadata)


def active_counts(arrays: BatchArrays) -> np.ndarray:
    """Loss-mask tokens per row."""
    starts = arrays.offsets[:-1]
    if len(arrays.loss_mask) and np.all(np.diff(arrays.offsets) > 0):
        # a uint32 sum is exact (no row holds 2**32 tokens when no array does) and ~6x faster
        # than numpy's int64 reduceat over uint8
        wide = np.uint32 if len(arrays.loss_mask) < 2**32 else np.int64
        return np.add.reduceat(arrays.loss_mask, starts, dtype=wide).astype(np.int64)
    csum = np.zeros(len(arrays.loss_mask) + 1, dtype=np.int64)  # rows may be empty: slower path
    np.cumsum(arrays.loss_mask, dtype=np.int64, out=csum[1:])
    return csum[arrays.offsets[1:]] - csum[starts]


def pack_meta(meta: dict[str, Any]) -> dict[str, str]:
    """safetensors metadata as ONE key holding canonical JSON (the payload format): the library
    alone writes several keys in an order that changes from call to call, and a capture must be
    the same bytes every time."""
    return {META_KEY: json.dumps(meta, sort_keys=True, separators=(",", ":"))}


def unpack_meta(data: bytes | memoryview) -> dict[str, Any]:
    from twinrun.capture.tensorfile import header

    raw = (header(data)[0].get("__metadata__") or {}).get(META_KEY)
    meta = parse_json(raw, "payload metadata", SMALL) if isinstance(raw, str) else None
    if not isinstance(meta, dict):
        raise DataError(f"metadata has no '{META_KEY}' JSON object")
    return meta


def decode(data: bytes | memoryview, where: str) -> Decoded:
    """Decode and validate payload bytes; any problem is a DataError naming `where`."""
    try:
        return _decode(data)
    except DataError as exc:
        raise DataError(f"{where}: invalid payload: {exc.message}", "re-capture the step") from exc


def _decode(data: bytes | memoryview) -> Decoded:
    import torch

    from twinrun.capture.tensorfile import read

    meta = unpack_meta(data)
    if meta.get("format") != FORMAT:
        raise DataError(f"format is {meta.get('format')!r}, expected {FORMAT!r}")
    objective = meta.get("objective")
    if objective not in NAMES:
        raise DataError(f"unknown objective {objective!r}")
    layout = meta.get("layout")
    if not isinstance(layout, dict) or not all(v in ("token", "row") for v in layout.values()):
        raise DataError("metadata 'layout' must map names to 'token' or 'row'")
    a, _ = read(data)  # read-only views on the verified bytes
    cuda = sorted(k for k in a if k.startswith("rng.cuda."))
    expected = {*BASE, "rng.cpu", *layout, *cuda}
    if set(a) != expected or cuda != [f"rng.cuda.{i}" for i in range(len(cuda))]:
        missing, extra = sorted(expected - set(a)), sorted(set(a) - expected)
        raise DataError(f"tensor names do not match (missing {missing}, unexpected {extra})")
    u8, i64, f64 = np.dtype("u1"), np.dtype("<i8"), np.dtype("<f8")
    want = {"loss_mask": u8, "rng.cpu": u8, **dict.fromkeys(cuda, u8)}
    for name, array in a.items():
        dtype = want.get(name, f64 if name.startswith("floats.") else i64)
        if array.dtype != dtype or array.ndim != 1:
            raise DataError(f"{name} must be a 1-D {dtype.name} tensor, got {array.dtype.name} "
                            f"{tuple(array.shape)}")  # fmt: skip
    for key in ("denominator", "step"):
        if len(a[key]) != 1:
            raise DataError(f"{key} must hold one value")
    arrays = BatchArrays(
        objective=objective,
        step=int(a["step"][0]),
        offsets=a["row_offsets"],
        tokens=a["tokens"],
        loss_mask=a["loss_mask"],
        forward_sizes=a["forward_sizes"],
        denominator=int(a["denominator"][0]),
        extras={key: (str(kind), a[key]) for key, kind in layout.items()},
    )
    validate(arrays, a["active_counts"])
    position = a["stream_position"]
    if len(position) != 2 or int(position[1]) != arrays.step or int(position[0]) < 0:
        raise DataError("stream_position must be (seed >= 0, step)")
    rng = {
        "cpu": torch.from_numpy(a["rng.cpu"].copy()),
        "cuda": [torch.from_numpy(a[k].copy()) for k in cuda],
    }
    return Decoded(arrays=arrays, rng=rng, seed=int(position[0]))


def validate(arrays: BatchArrays, counts: np.ndarray | None = None) -> None:
    """Every invariant an optimizer batch keeps; a DataError for the first broken one."""
    if arrays.objective not in BY_NAME:
        raise DataError(f"unknown objective {arrays.objective!r}")
    _check_common(arrays, counts)
    SHAPE_CHECKS[BY_NAME[arrays.objective].batch](arrays)
    if arrays.step < 0:
        raise DataError("step must be >= 0")


def _check_common(arrays: BatchArrays, counts: np.ndarray | None) -> None:
    """The checks every batch shape shares: row offsets, loss mask, active counts (when given)
    and forward sizes."""
    off, n, total = arrays.offsets, arrays.rows, len(arrays.tokens)
    if n < 1 or int(off[0]) != 0 or int(off[-1]) != total:
        raise DataError("row_offsets must start at 0 and end at the token count")
    if np.any(np.diff(off) < 1):
        raise DataError("row_offsets must increase (every row has a token)")
    if len(arrays.loss_mask) != total or np.any(arrays.loss_mask > 1):
        raise DataError("loss_mask must be 0/1, one per token")
    if counts is not None and (len(counts) != n or np.any(counts != active_counts(arrays))):
        raise DataError("active_counts do not match the loss mask")
    sizes = arrays.forward_sizes
    if len(sizes) < 1 or np.any(sizes < 1) or int(sizes.sum()) != n:
        raise DataError(f"forward_sizes must be positive and sum to the {n} rows")


def _check_token_denominator(arrays: BatchArrays, *, need_tokens: bool) -> None:
    """The denominator is the loss-mask token count (1 when there is none, which only a shape
    that does not `need_tokens` may have)."""
    kept = int(arrays.loss_mask.sum(dtype=np.int64))
    if arrays.denominator != max(1, kept) or (need_tokens and kept < 1):
        raise DataError(f"denominator {arrays.denominator} is not the {kept} loss tokens")


def _check_extras(arrays: BatchArrays, shape: Batch) -> None:
    """The per-objective arrays are the ones `shape` needs (and may hold), each with one value
    per token or per row as its layout says, and the floats finite."""
    n, total = arrays.rows, len(arrays.tokens)
    need = REQUIRED_EXTRAS.get(shape, {})
    may = OPTIONAL_EXTRAS.get(shape, {})
    got = {key: layout for key, (layout, _) in arrays.extras.items()}
    if {k: v for k, v in got.items() if may.get(k) != v} != need:
        raise DataError(f"{arrays.objective} needs {need}, the payload has {got}")
    for key, (layout, a) in arrays.extras.items():
        if len(a) != (total if layout == "token" else n):
            raise DataError(f"{key} has {len(a)} values for layout {layout!r}")
        if key.startswith("floats.") and not np.all(np.isfinite(a)):
            raise DataError(f"{key} holds a non-finite value")


def _check_rows_shape(arrays: BatchArrays) -> None:
    """Token rows: at least one loss token, which the denominator counts."""
    _check_token_denominator(arrays, need_tokens=True)
    _check_extras(arrays, "rows")


def _check_pairs_shape(arrays: BatchArrays) -> None:
    """Preference pairs: chosen/rejected forwards of equal size, one denominator per pair."""
    sizes = arrays.forward_sizes
    pairs = sizes[0::2]
    if len(sizes) % 2 or np.any(pairs != sizes[1::2]) or arrays.denominator != arrays.rows // 2:
        raise DataError(
            "pair batches need chosen/rejected forwards of equal size and denominator = pairs"
        )
    _check_extras(arrays, "pairs")


def _check_rollouts_shape(arrays: BatchArrays) -> None:
    """Sampled rollouts: the denominator counts the loss tokens, every row keeps a completion
    token past its prompt, and a model mask (when present) covers the loss mask."""
    _check_token_denominator(arrays, need_tokens=False)
    _check_extras(arrays, "rollouts")
    prompt = arrays.extras["ints.prompt_lengths"][1]
    if np.any(prompt < 1) or np.any(prompt >= arrays.lengths):
        raise DataError("prompt_lengths must leave at least one completion token per row")
    if "ints.model_mask" in arrays.extras:
        _check_model_mask(arrays, prompt)


def _check_model_mask(arrays: BatchArrays, prompt: np.ndarray) -> None:
    """`ints.model_mask` is 0/1, 0 on every prompt token, and 1 wherever the loss mask is."""
    model = arrays.extras["ints.model_mask"][1]
    total = len(arrays.tokens)
    in_prompt = np.arange(total) < np.repeat(arrays.offsets[:-1] + prompt, arrays.lengths)
    if np.any((model != 0) & (model != 1)) or np.any(model[in_prompt] != 0):
        raise DataError("model_mask must be 0/1 and 0 on every prompt token")
    if np.any(arrays.loss_mask > model):
        raise DataError("loss_mask keeps a token that model_mask says is not the model's")


# the checks of each batch shape (`Objective.batch`), after the shared ones
SHAPE_CHECKS: dict[Batch, Callable[[BatchArrays], None]] = {
    "rows": _check_rows_shape,
    "pairs": _check_pairs_shape,
    "rollouts": _check_rollouts_shape,
}
