"""A 2-turn GRPO row: the tool's tokens are in the row but out of the loss, the logprob ratio
and the token count — checked against numbers computed by hand."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from twinrun.capture.batch import OptimizerBatch
from twinrun.capture.payload import BatchArrays
from twinrun.config.resolved import PolicyUpdate
from twinrun.objectives.grpo import grpo_loss
from twinrun.train.recipes.grpo import Rollout, optimizer_batch, rows_from_batch, update_rows

# prompt [5, 6]; turn 0 sampled [7, 8]; the tool's reply [9, 10]; turn 1 sampled [11]
ROW = Rollout(
    example=0, k=0, step=0, prompt_ids=[5, 6], completion=[7, 8, 9, 10, 11],
    old_logprobs=[-1.0, -2.0, 0.0, 0.0, -0.5], reward=1.0, advantage=1.0,
    model_mask=[1, 1, 0, 0, 1],
).update_row()  # fmt: skip


def session(token_cap: int = 16) -> SimpleNamespace:
    update = PolicyUpdate(clip_eps=0.2, temperature=1.0, token_cap=token_cap)
    return SimpleNamespace(
        tok=SimpleNamespace(pad_id=0), run=SimpleNamespace(record=lambda _: update)
    )


def test_tool_tokens_are_not_kept() -> None:
    u = update_rows(session(), [ROW])
    # predicted tokens ids[1:] = 6 7 8 9 10 11: kept where the model sampled them
    assert u.kept.tolist() == [[False, True, True, False, False, True]]
    assert u.denominator == 3
    assert u.old[0].tolist() == [0.0, -1.0, -2.0, 0.0, 0.0, -0.5]


def test_two_turn_loss_by_hand() -> None:
    u = update_rows(session(), [ROW])
    # current logprobs: 0.125 (exact in binary) above the old ones on the model's tokens; far
    # off on the tool's tokens and the prompt (were they counted, the ratio e^5 would be
    # clipped and the count 5)
    logp = u.old.clone() + torch.tensor([[5.0, 0.125, 0.125, 5.0, 5.0, 0.125]], dtype=torch.float64)
    out = grpo_loss(logp, u.old, u.advantages, u.kept, u.denominator, 0.2, u.weights)
    # rho = e^0.125 = 1.13315 < 1.2 on each of the 3 kept tokens, A = 1:
    # loss = -(3 * e^0.125) / 3 = -e^0.125 (to the last bit of exp)
    assert float(out.loss) == pytest.approx(-math.exp(0.125), rel=4e-16)
    assert out.active_tokens == 3 and out.clipped_tokens == 0


def test_token_cap_counts_model_tokens_only() -> None:
    u = update_rows(session(token_cap=2), [ROW])
    assert u.kept.tolist() == [[False, True, True, False, False, False]]
    assert u.denominator == 2


def test_capture_keeps_the_model_mask() -> None:
    u = update_rows(session(), [ROW])
    batch = optimizer_batch([ROW], u, 0, 1)
    assert batch.update is not None
    assert batch.update.model_mask == [[0, 0, 1, 1, 0, 0, 1]]
    assert "ints.model_mask" in BatchArrays.from_batch(batch).extras
    assert batch.loss_masks == [[0, 0, 1, 1, 0, 0, 1]]
    back = rows_from_batch(batch)[0]
    assert back == ROW  # every field the update reads, and nothing else
    assert update_rows(session(), [back]).kept.tolist() == u.kept.tolist()


def test_single_turn_batches_have_no_model_mask() -> None:
    plain = Rollout(0, 0, 0, [5, 6], [7, 8], [-1.0, -2.0], 1.0, advantage=1.0).update_row()
    batch: OptimizerBatch = optimizer_batch([plain], update_rows(session(), [plain]), 0, 1)
    assert batch.update is not None and batch.update.model_mask is None
    assert "ints.model_mask" not in BatchArrays.from_batch(batch).extras
    assert rows_from_batch(batch) == [plain]
