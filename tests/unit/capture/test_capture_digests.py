"""Logical and effective-rows digests: a golden value for a hand-written batch (recomputed here
from the framing rule with `struct`), and sensitivity to row order and to one ulp."""

from __future__ import annotations

import copy
import hashlib
import struct

import numpy as np

from tests.unit.capture.test_capture_payload import grpo_batch
from twinrun.capture.batch import OptimizerBatch
from twinrun.capture.digests import effective_rows_sha256, logical_sha256, padding_fraction
from twinrun.capture.payload import BatchArrays

GOLDEN_LOGICAL = "68996e4c467c5cc948caafbd03433fa6b964f236d44e6dbfd003d7a88885c0fe"


def logical(batch: OptimizerBatch) -> str:
    return logical_sha256(BatchArrays.from_batch(batch))


def test_golden_logical_digest() -> None:
    assert logical(grpo_batch()) == GOLDEN_LOGICAL


def test_golden_follows_the_framing_rule() -> None:
    """u64be(len(name)) name u64be(len(data)) data, per frame; int64/float64 big-endian."""
    h = hashlib.sha256()

    def frame(name: str, data: bytes) -> None:
        h.update(struct.pack(">Q", len(name)) + name.encode())
        h.update(struct.pack(">Q", len(data)) + data)

    frame("format", b"twinrun.optimizer-batch.v1/logical")
    frame("objective", b"grpo")
    frame("denominator", struct.pack(">q", 3))
    frame("row_offsets", struct.pack(">3q", 0, 4, 7))
    frame("tokens", struct.pack(">7q", 1, 5, 7, 9, 1, 5, 8))
    frame("loss_mask", bytes([0, 0, 1, 1, 0, 0, 1]))
    frame("floats.advantages:row", struct.pack(">2d", 0.75, -0.75))
    frame("floats.old_logprobs:token", struct.pack(">7d", 0, 0, -1.25, -0.5, 0, 0, -2.0))
    frame("floats.weights:row", struct.pack(">2d", 1.0, 1.0))
    frame("ints.prompt_lengths:row", struct.pack(">2q", 2, 2))
    assert h.hexdigest() == GOLDEN_LOGICAL


def swapped(batch: OptimizerBatch) -> OptimizerBatch:
    out = copy.deepcopy(batch)
    assert out.update is not None
    columns = [values for _, values in out.update.columns().values()]
    for seq in (out.rows, out.loss_masks, *columns):
        seq.reverse()
    return out


def test_row_order_changes_the_digest() -> None:
    assert logical(swapped(grpo_batch())) != GOLDEN_LOGICAL
    assert logical(swapped(swapped(grpo_batch()))) == GOLDEN_LOGICAL


def test_one_ulp_changes_the_digest() -> None:
    for where in ("old_logprobs", "advantages"):
        batch = grpo_batch()
        assert batch.update is not None
        values = getattr(batch.update, where)
        if where == "old_logprobs":
            values[0][2] = float(np.nextafter(values[0][2], 0.0))
        else:
            values[1] = float(np.nextafter(values[1], -1.0))
        assert logical(batch) != GOLDEN_LOGICAL, where
    batch = grpo_batch()
    assert batch.update is not None
    batch.update.old_logprobs[0][0] = -0.0  # same value, other bits
    assert logical(batch) != GOLDEN_LOGICAL


def test_tokens_masks_and_denominator_count() -> None:
    for change in (
        lambda b: b.rows[1].__setitem__(2, 9),
        lambda b: b.loss_masks[0].__setitem__(2, 0),
        lambda b: setattr(b, "denominator", 4),
        lambda b: b.update.prompt_lengths.__setitem__(0, 1),
    ):
        batch = grpo_batch()
        change(batch)
        assert logical(batch) != GOLDEN_LOGICAL


def test_effective_rows_see_the_forward_split_and_padding() -> None:
    one = BatchArrays.from_batch(grpo_batch())
    split = grpo_batch()
    split.forward_sizes = [1, 1]
    two = BatchArrays.from_batch(split)
    assert logical_sha256(one) == logical_sha256(two)  # same rows ...
    assert effective_rows_sha256(one, 0) != effective_rows_sha256(two, 0)  # ... used otherwise
    assert effective_rows_sha256(one, 0) != effective_rows_sha256(one, 2)  # another pad id
    assert effective_rows_sha256(one, 0) == effective_rows_sha256(one, 0)
    assert padding_fraction(one) == 1 - 7 / 8 and padding_fraction(two) == 0.0


def test_effective_rows_padded_like_the_trainers() -> None:
    from twinrun.capture.digests import forwards
    from twinrun.data.batching import pad_rows
    from twinrun.data.examples import EncodedRow

    batch = grpo_batch()
    (fw,) = forwards(BatchArrays.from_batch(batch), pad_id=0)
    pairs = zip(batch.rows, batch.loss_masks, strict=True)
    rows = [EncodedRow(tuple(r), tuple(m)) for r, m in pairs]
    ids, attn, mask = pad_rows(rows, 0)
    assert (fw["ids"] == ids.numpy()).all() and (fw["attention"] == attn.numpy()).all()
    assert (fw["mask"] == mask.numpy()).all()
    assert fw["floats.old_logprobs"].tolist() == [[0, 0, -1.25, -0.5], [0, 0, -2.0, 0]]
