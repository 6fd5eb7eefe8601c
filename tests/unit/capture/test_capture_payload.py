"""The capture payload codec: exact round trips (values and dtypes), and every invariant that
decode refuses to let through."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch
from safetensors.torch import save

from twinrun.capture.batch import OptimizerBatch, UpdateColumns
from twinrun.capture.payload import BatchArrays, decode, encode, pack_meta, unpack_meta
from twinrun.core.errors import DataError


def grpo_batch() -> OptimizerBatch:
    return OptimizerBatch(
        objective="grpo",
        step=0,
        rows=[[1, 5, 7, 9], [1, 5, 8]],
        loss_masks=[[0, 0, 1, 1], [0, 0, 1]],
        forward_sizes=[2],
        denominator=3,
        update=UpdateColumns(
            old_logprobs=[[0.0, 0.0, -1.25, -0.5], [0.0, 0.0, -2.0]],
            advantages=[0.75, -0.75],
            weights=[1.0, 1.0],
            prompt_lengths=[2, 2],
        ),
    )


def pair_batch() -> OptimizerBatch:
    return OptimizerBatch(
        objective="dpo", step=4, rows=[[1, 2, 3], [1, 2], [1, 4], [1, 4, 4, 5]],
        loss_masks=[[0, 1, 1], [0, 1], [0, 1], [0, 0, 1, 1]], forward_sizes=[1, 1, 1, 1],
        denominator=2,
    )  # fmt: skip


def rng() -> dict[str, object]:
    gen = torch.Generator().manual_seed(3)
    return {"cpu": gen.get_state(), "cuda": [gen.get_state()]}


@pytest.mark.parametrize("make", [grpo_batch, pair_batch])
def test_round_trip_is_exact(make: object) -> None:
    batch = make()  # type: ignore[operator]
    data = encode(BatchArrays.from_batch(batch), rng(), seed=2**63 - 1)
    out = decode(data, "p")
    assert out.arrays.to_batch() == batch
    assert out.seed == 2**63 - 1
    assert torch.equal(out.rng["cpu"], rng()["cpu"]) and len(out.rng["cuda"]) == 1
    from safetensors.torch import load

    raw = load(data)
    assert raw["tokens"].dtype == torch.int64 and raw["loss_mask"].dtype == torch.uint8
    assert raw["row_offsets"].tolist() == [0, *np.cumsum([len(r) for r in batch.rows]).tolist()]
    assert raw["active_counts"].tolist() == [sum(m) for m in batch.loss_masks]
    if batch.objective == "grpo":
        assert raw["floats.old_logprobs"].dtype == torch.float64
        assert raw["floats.advantages"].tolist() == [0.75, -0.75]
        assert raw["ints.prompt_lengths"].dtype == torch.int64


def test_round_trip_keeps_float_bits() -> None:
    batch = grpo_batch()
    tiny = [5e-324, -0.0, np.nextafter(-1.25, 0.0), 1e308]
    assert batch.update is not None
    batch.update.old_logprobs[0] = tiny
    out = decode(encode(BatchArrays.from_batch(batch), rng(), 1), "p").arrays.to_batch()
    assert out.update is not None
    got = out.update.old_logprobs[0]
    assert [struct.pack(">d", x) for x in got] == [struct.pack(">d", x) for x in tiny]


def test_encoding_is_deterministic() -> None:
    """Same batch, same bytes — every time (safetensors orders several metadata keys anew on
    every call, hence one key)."""
    a = encode(BatchArrays.from_batch(grpo_batch()), rng(), 1)
    assert all(a == encode(BatchArrays.from_batch(grpo_batch()), rng(), 1) for _ in range(20))


def tampered(**changes: object) -> bytes:
    """Payload bytes with some tensors replaced (or removed with None) / metadata changed."""
    from safetensors.torch import load

    data = encode(BatchArrays.from_batch(grpo_batch()), rng(), 1)
    tensors = load(data)
    meta = unpack_meta(data)
    for key, value in changes.items():
        key = key.replace("__", ".")
        if key.startswith("meta_"):
            meta[key[5:]] = value
        elif value is None:
            del tensors[key]
        else:
            tensors[key] = value  # type: ignore[assignment]
    return save(tensors, metadata=pack_meta(meta))


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"meta_format": "other.v9"}, "format is 'other.v9'"),
        ({"meta_layout": {"floats.weights": "col"}}, "layout"),
        ({"meta_objective": "ppo"}, "unknown objective"),
        ({"extra": torch.zeros(1, dtype=torch.int64)}, "unexpected \\['extra'\\]"),
        ({"floats__weights": None}, "missing \\['floats.weights'\\]"),
        ({"tokens": torch.zeros(7, dtype=torch.float64)}, "tokens must be a 1-D int64 tensor"),
        ({"tokens": torch.zeros(7, dtype=torch.int32)}, "'tokens': unsupported"),
        ({"tokens": torch.zeros(1, 7, dtype=torch.int64)}, "tokens must be a 1-D int64 tensor"),
        ({"loss_mask": torch.tensor([0, 0, 1, 2, 0, 0, 1], dtype=torch.uint8)}, "0/1"),
        ({"active_counts": torch.tensor([2, 2])}, "active_counts do not match"),
        ({"forward_sizes": torch.tensor([1])}, "sum to the 2 rows"),
        ({"row_offsets": torch.tensor([0, 4, 4, 7])}, "row_offsets"),
        ({"denominator": torch.tensor([4])}, "denominator 4 is not the 3 loss tokens"),
        ({"floats__advantages": torch.tensor([0.5, float("nan")], dtype=torch.float64)},
         "non-finite"),
        ({"floats__advantages": torch.tensor([0.5], dtype=torch.float64)}, "layout 'row'"),
        ({"ints__prompt_lengths": torch.tensor([2, 3])}, "prompt_lengths"),
        ({"stream_position": torch.tensor([1, 5])}, "stream_position"),
    ],
)  # fmt: skip
def test_decode_refuses(changes: dict[str, object], match: str) -> None:
    with pytest.raises(DataError, match=match):
        decode(tampered(**changes), "payload.safetensors")


def test_decode_refuses_non_safetensors() -> None:
    import io

    buf = io.BytesIO()
    torch.save({"tokens": torch.zeros(3)}, buf)  # a pickle: must never be loaded
    with pytest.raises(DataError, match="payload.safetensors: invalid payload"):
        decode(buf.getvalue(), "payload.safetensors")
    with pytest.raises(DataError, match="shorter than a safetensors header"):
        decode(b"abc", "p")


def test_reader_agrees_with_safetensors() -> None:
    """The zero-copy reader sees what the safetensors library sees, and refuses bad spans."""
    from safetensors.torch import load

    from twinrun.capture.tensorfile import read

    data = encode(BatchArrays.from_batch(grpo_batch()), rng(), 1)
    ours, meta = read(data)
    theirs = load(data)
    assert set(ours) == set(theirs) and "twinrun" in meta
    for name, array in ours.items():
        assert (
            np.array_equal(array, theirs[name].numpy())
            and array.dtype == theirs[name].numpy().dtype
        )
        assert not array.flags.writeable  # a view on the verified bytes
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + n])
    header["tokens"]["data_offsets"][1] -= 8  # shape no longer fills the span
    raw = json.dumps(header).encode()
    bad = struct.pack("<Q", len(raw)) + raw + data[8 + n :]
    with pytest.raises(DataError, match="does not fill its byte span"):
        decode(bad, "p")
    with pytest.raises(DataError, match="bytes after the last tensor"):
        read(data + b"\0")


def test_pair_batches_need_matching_sides() -> None:
    batch = pair_batch()
    batch.forward_sizes = [2, 1, 1]
    from twinrun.capture.payload import validate

    with pytest.raises(DataError, match="chosen/rejected"):
        validate(BatchArrays.from_batch(batch))
