"""The chunked and threaded digests equal the reference ones: a `Framed` frame converted to
big-endian in chunks equals the frame built from `astype(...).tobytes()` in one piece, for every
dtype a capture hashes and for sizes on both sides of a chunk boundary; and `PayloadDigests`
(file digest on one thread, decode and logical digest on another) gives exactly
`hashlib.sha256(bytes)`, `logical_sha256` of the batch, and decode's own refusals."""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest
import torch

from tests.unit.capture.test_capture_payload import grpo_batch, rng, tampered
from twinrun.capture import digests
from twinrun.capture.digests import Framed, logical_sha256
from twinrun.capture.hashing import PayloadDigests
from twinrun.capture.payload import BatchArrays, decode, encode
from twinrun.core.errors import DataError

CHUNK = 5  # elements per conversion in these tests: boundaries at 5, 10, ...


def reference(name: str, values: np.ndarray, dtype: str) -> str:
    """One frame by the framing rule, with the whole array converted in one piece."""
    data = np.ascontiguousarray(values).reshape(-1).astype(dtype).tobytes()
    label = name.encode()
    return hashlib.sha256(
        struct.pack(">Q", len(label)) + label + struct.pack(">Q", len(data)) + data
    ).hexdigest()


def values(dtype: str, size: int) -> np.ndarray:
    gen = np.random.default_rng(size)
    if dtype == "<f8":  # every bit pattern counts: -0.0, inf, a NaN and subnormals among them
        out = gen.standard_normal(size)
        special = [-0.0, np.inf, np.nan, 5e-324, -1.5]
        out[: min(size, len(special))] = special[:size]
        return out
    if dtype == "<i8":
        return gen.integers(-(2**63), 2**63 - 1, size, dtype=np.int64, endpoint=True)
    return gen.integers(0, 2, size, dtype=np.uint8)


@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK, 3 * CHUNK + 2])
@pytest.mark.parametrize(("dtype", "big"), [("<i8", ">i8"), ("<f8", ">f8"), ("u1", "u1")])
def test_chunked_frame_equals_the_reference(
    dtype: str, big: str, size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(digests, "CHUNK", CHUNK)
    a = values(dtype, size)
    h = Framed()
    h.frame("x", a, big)
    assert h.hexdigest() == reference("x", a, big)
    if dtype != "u1":  # the converted bytes are big-endian: not the little-endian ones
        assert size == 0 or h.hexdigest() != reference("x", a, dtype)


def test_strided_and_2d_input_is_hashed_in_row_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(digests, "CHUNK", CHUNK)
    a = values("<i8", 4 * CHUNK + 3)
    strided, square = a[::3], a[:16].reshape(4, 4).T  # neither is C-contiguous
    for x in (strided, square):
        h = Framed()
        h.frame("x", x, ">i8")
        assert h.hexdigest() == reference("x", x, ">i8")


def big_batch(rows: int, length: int) -> BatchArrays:
    """A GRPO batch whose arrays span many conversion chunks."""
    gen = np.random.default_rng(rows)
    total = rows * length
    mask = np.ones(total, dtype=np.uint8)
    mask.reshape(rows, length)[:, :2] = 0
    return BatchArrays(
        objective="grpo", step=3, offsets=np.arange(rows + 1, dtype=np.int64) * length,
        tokens=gen.integers(0, 50_000, total, dtype=np.int64), loss_mask=mask,
        forward_sizes=np.full(rows, 1, dtype=np.int64), denominator=int(mask.sum()),
        extras={"floats.old_logprobs": ("token", -gen.random(total) * mask),
                "floats.advantages": ("row", gen.standard_normal(rows)),
                "floats.weights": ("row", np.ones(rows)),
                "ints.prompt_lengths": ("row", np.full(rows, 2, dtype=np.int64))},
    )  # fmt: skip


@pytest.mark.parametrize(("rows", "length"), [(1, 3), (2, CHUNK), (7, 3 * CHUNK + 1)])
def test_payload_digests_equal_the_single_threaded_ones(
    rows: int, length: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    arrays = big_batch(rows, length)
    expected = logical_sha256(arrays)  # the reference: default chunks, on this thread
    data = encode(arrays, rng(), 11)
    monkeypatch.setattr(digests, "CHUNK", CHUNK)
    digest = PayloadDigests(memoryview(data).toreadonly(), "p")
    assert digest.sha256 == hashlib.sha256(data).hexdigest()
    assert digest.logical() == expected
    decoded = digest.decoded()
    assert np.array_equal(decoded.arrays.tokens, arrays.tokens) and decoded.seed == 11
    assert logical_sha256(decode(data, "p").arrays) == digest.logical()


def test_payload_digests_small_batch_golden() -> None:
    from tests.unit.capture.test_capture_digests import GOLDEN_LOGICAL

    data = encode(BatchArrays.from_batch(grpo_batch()), rng(), 1)
    assert PayloadDigests(memoryview(data), "p").logical() == GOLDEN_LOGICAL


def test_payload_digests_raise_what_decode_raises() -> None:
    bad = tampered(loss_mask=torch.tensor([0, 0, 1, 2, 0, 0, 1], dtype=torch.uint8))
    with pytest.raises(DataError) as direct:
        decode(bad, "payload.safetensors")
    digest = PayloadDigests(memoryview(bad), "payload.safetensors")
    assert digest.sha256 == hashlib.sha256(bad).hexdigest()  # the file digest still comes
    for wait in (digest.decoded, digest.logical):
        with pytest.raises(DataError) as threaded:
            wait()
        assert threaded.value.one_line() == direct.value.one_line()
        assert "loss_mask must be 0/1" in threaded.value.one_line()
