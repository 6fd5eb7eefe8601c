"""`twinrun tune dpo`, `tune ipo`, `tune simpo` and `tune reward`: preference pairs, two rows each.

`--batch-size` counts pairs. A forward holds one side of `batch_size` pairs — so at batch size 1
each side of a pair goes through its own one-row forward — and `--accumulation` counts pair
groups (each a chosen forward and a rejected forward) per optimizer step.

What tells the objectives apart is their `PairLoss`, a strategy: whether it needs the frozen
reference (the model with the adapter disabled, no grad), whether each side's log-prob is taken
per completion token, the settings record it reads, and the loss over the two sides.
- DPO: loss `-logsigmoid(beta * ((pc - rc) - (pr - rr)))` over completion log-prob sums,
  averaged over the step's pairs (`objectives/dpo.py`).
- IPO: the same forwards; each side's log-prob per completion token, loss
  `(h - 1/(2 beta))^2` with `h = (pc - rc) - (pr - rr)` (`objectives/ipo.py`).
- SimPO: no reference; each side's log-prob per completion token, loss
  `-logsigmoid(beta * (pc - pr) - gamma)` (`objectives/simpo.py`).
- Reward: a scalar head on the final-norm hidden state of the last real token
  (`model/reward_head.py`), Bradley–Terry loss `-logsigmoid(s_chosen - s_rejected)`, averaged over
  the step's pairs (`objectives/reward.py`). The head trains with the adapter.
A new pair loss is a loss function, a `PairLoss` and a recipe class of three lines here.

With `--lora-dropout` the policy's forwards drop (the reference's never do), a row's masks keyed
by its pair's index among the step's pairs and its side (`recipes.base.dropout_for`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import torch

from twinrun.capture.batch import OptimizerBatch
from twinrun.config.resolved import Examples, Margin, Preference, ValidRun
from twinrun.data.batching import StepPlan, pad_rows
from twinrun.data.pairs import EncodedPair, encode_pairs
from twinrun.model.head_chunks import chunks_head, completion_nll_by_chunks
from twinrun.model.lora import lora_disabled
from twinrun.objectives.dpo import DPOOut, dpo_loss, sequence_logprob
from twinrun.objectives.ipo import ipo_loss
from twinrun.objectives.reward import bradley_terry_loss
from twinrun.objectives.simpo import simpo_loss
from twinrun.train.parallel.distributed import in_global_order, is_root
from twinrun.train.parallel.sharding import forward_slots
from twinrun.train.recipes.base import (
    Recipe,
    Rows,
    dropout_for,
    epoch_plans,
    row_starts,
)
from twinrun.train.recipes.sft import Padded, chunked_forward
from twinrun.train.setup.session import ModelSession, Session
from twinrun.train.step.loop import Forward, StepForwards, StepOutcome

if TYPE_CHECKING:
    from pathlib import Path

    from twinrun.model.tokens import CheckpointTokenizer


@dataclass
class PairBatch:
    """One step's data: pair indices per group, the pairs, and each group's padded chosen and
    rejected sides (chosen first)."""

    indices: tuple[tuple[int, ...], ...]
    epoch: int
    groups: list[list[EncodedPair]]
    sides: list[Padded]


@dataclass(frozen=True)
class PairSides:
    """One group's values per side — log-probs (per token when the loss says so) or the head's
    scores — and the reference's (None without a reference), [P] each."""

    chosen: torch.Tensor
    rejected: torch.Tensor
    ref_chosen: torch.Tensor | None
    ref_rejected: torch.Tensor | None


class PairOut(NamedTuple):
    """A pair loss's result: per-pair losses (with grad), accuracy and mean margin (detached)."""

    losses: torch.Tensor
    accuracy: torch.Tensor
    margin: torch.Tensor


@dataclass(frozen=True)
class PairLoss:
    """How a pair objective scores its pairs (see the module docstring)."""

    needs_reference: bool
    """Runs the frozen reference's forwards (no grad, adapter disabled) beside the policy's."""
    per_token: bool
    """Each side's log-prob is divided by its completion tokens (TRL's IPO), not the sum."""
    settings: tuple[type, ...]
    """The settings records the loss reads (`run.record(kind)`): what its objective's record
    declares it takes (`settings` in objectives/registry.py)."""
    loss: Callable[[PairSides, ValidRun], PairOut]


def _against_reference(
    fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], DPOOut],
) -> Callable[[PairSides, ValidRun], PairOut]:
    """A preference loss of the policy against the reference at `--beta` (DPO's signature)."""

    def loss(sides: PairSides, run: ValidRun) -> PairOut:
        assert sides.ref_chosen is not None and sides.ref_rejected is not None  # reference ran
        out = fn(
            sides.chosen, sides.rejected, sides.ref_chosen, sides.ref_rejected,
            run.record(Preference).beta,
        )  # fmt: skip
        return PairOut(out.losses, out.accuracy, out.reward_margin)

    return loss


def _simpo(sides: PairSides, run: ValidRun) -> PairOut:
    out = simpo_loss(sides.chosen, sides.rejected, run.record(Preference).beta,
                     run.record(Margin).gamma)  # fmt: skip
    return PairOut(out.losses, out.accuracy, out.reward_margin)


def _bradley_terry(sides: PairSides, run: ValidRun) -> PairOut:
    bt = bradley_terry_loss(sides.chosen, sides.rejected)
    return PairOut(bt.losses, bt.accuracy, bt.margin)


DPO = PairLoss(
    needs_reference=True, per_token=False, settings=(Preference,),
    loss=_against_reference(dpo_loss),
)  # fmt: skip
IPO = PairLoss(
    needs_reference=True, per_token=True, settings=(Preference,),
    loss=_against_reference(ipo_loss),
)  # fmt: skip
SIMPO = PairLoss(needs_reference=False, per_token=True, settings=(Preference, Margin), loss=_simpo)
BRADLEY_TERRY = PairLoss(needs_reference=False, per_token=False, settings=(), loss=_bradley_terry)


def pad_sides(groups: list[list[EncodedPair]], pad_id: int) -> list[Padded]:
    """Each group's chosen rows padded, then its rejected rows."""
    return [pad_rows([p.chosen if k == 0 else p.rejected for p in g], pad_id)
            for g in groups for k in (0, 1)]  # fmt: skip


@dataclass
class PairRecipe(Recipe):
    """A pair objective's run: the planned groups of pairs, one plan per step; `loss` is the
    objective's `PairLoss`; the session's `head` is the reward head (objectives whose record has
    `head`)."""

    loss: ClassVar[PairLoss]
    s: Session
    pairs: list[EncodedPair]
    plans: list[StepPlan]

    @classmethod
    def encode(
        cls, run: ValidRun, tok: CheckpointTokenizer, raw: Any, max_length: int, context: Any
    ) -> list[Any]:
        return encode_pairs(tok, raw, run.record(Examples).templated, max_length)

    @classmethod
    def open(cls, session: Session, encoded: list[Any], context: Any) -> PairRecipe:
        return cls(session, encoded, epoch_plans(session, len(encoded)))

    @classmethod
    def save_head(cls, head: torch.nn.Linear | None, folder: Path) -> dict[str, Any] | None:
        if head is None:
            return None
        from twinrun.core.digest import sha256_file
        from twinrun.model.reward_head import HEAD_FILE, HEAD_KEY, save_reward_head

        save_reward_head(head, folder)
        sha = sha256_file(folder / HEAD_FILE)  # reproduce and export check the file by it
        return {"reward_head": {"file": HEAD_FILE, "key": HEAD_KEY, "sha256": sha}}

    @classmethod
    def replay_forwards(cls, s: ModelSession, batch: OptimizerBatch, step: int) -> StepForwards:
        return pair_forwards(s, pairs_from_batch(batch), step, cls.name, cls.loss, s.head)

    def summary(self, metrics: Rows, spikes: Rows) -> dict[str, Any]:
        last = metrics[-1]
        return {
            "final_loss": last["loss"],
            "steps": self.total_steps,
            "final_accuracy": last["accuracy"],
            "spikes": spikes,
        }

    def finish(self, session: Session) -> dict[str, Any] | None:
        return self.save_head(session.head, session.out) if is_root() else None

    def prepare(self, step: int) -> PairBatch:
        plan = self.plans[step]
        groups = [[self.pairs[i] for i in fw] for fw in plan.forwards]
        return PairBatch(plan.forwards, plan.epoch, groups, pad_sides(groups, self.s.tok.pad_id))

    def forwards(self, step: int, batch: PairBatch) -> StepForwards:
        outcome = yield from pair_forwards(
            self.s, batch.groups, step, self.name, self.loss, self.s.head, batch.sides
        )
        indices = torch.tensor([i for fw in batch.indices for i in fw])
        outcome.leaves = {"batch.sample_indices": indices, **outcome.leaves}
        outcome.metrics = {"epoch": batch.epoch, **outcome.metrics}
        return outcome


@dataclass
class DpoRecipe(PairRecipe):
    name: ClassVar[str] = "dpo"
    loss: ClassVar[PairLoss] = DPO


@dataclass
class IpoRecipe(PairRecipe):
    name: ClassVar[str] = "ipo"
    loss: ClassVar[PairLoss] = IPO


@dataclass
class SimpoRecipe(PairRecipe):
    name: ClassVar[str] = "simpo"
    loss: ClassVar[PairLoss] = SIMPO


@dataclass
class RewardRecipe(PairRecipe):
    name: ClassVar[str] = "reward"
    loss: ClassVar[PairLoss] = BRADLEY_TERRY


PAIR_RECIPES: tuple[type[PairRecipe], ...] = (DpoRecipe, IpoRecipe, SimpoRecipe, RewardRecipe)


def completion_tokens(padded: Padded) -> torch.Tensor:
    """Each row's number of completion tokens whose log-probs `sequence_logprob` sums, [B]."""
    return padded[2][:, 1:].sum(-1).to(torch.float32)


def side_forward(
    s: ModelSession,
    padded: Padded,
    head: torch.nn.Module | None,
    reference: bool,
    dropout: AbstractContextManager[None],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """One forward over one side of the pairs: (values [B], ids, logits, reference values —
    None unless `reference`). With a head the values are its scores, else the sequence
    log-probs; rows longer than one head chunk take them from the hidden states by chunks
    (`model/head_chunks.py`), their logits made whole only for `--diag` (else None).
    `dropout`: the LoRA dropout of the policy's forward (the reference runs without)."""
    ids, attn, mask = (t.to(s.run.backend.device) for t in padded)
    invariant = s.run.backend.batch_invariant
    if head is not None:
        from twinrun.model.reward_head import scores

        with dropout:
            values = scores(s.model, head, ids, attn)  # type: ignore[arg-type]  # a Linear head
        return values, ids, values, None
    if chunks_head(s.model, ids.shape[1] - 1):  # long rows: the head and loss by chunks
        with dropout:
            sums, logits = chunked_forward(s, ids, attn, mask)
        ref = None
        if reference:
            with torch.no_grad(), lora_disabled(s.model):
                ref = -completion_nll_by_chunks(s.model, ids, attn, mask)[0]
        return -sums, ids, logits[0] if logits else None, ref
    with dropout:
        whole = s.model(ids, attn)
    ref = None
    if reference:
        with torch.no_grad(), lora_disabled(s.model):
            ref = sequence_logprob(s.model(ids, attn), ids, mask, batch_invariant=invariant)
    return sequence_logprob(whole, ids, mask, batch_invariant=invariant), ids, whole, ref


def group_sides(
    s: ModelSession,
    chosen: Padded,
    rejected: Padded,
    loss: PairLoss,
    head: torch.nn.Module | None,
    dropout: tuple[AbstractContextManager[None], AbstractContextManager[None]],
) -> tuple[PairSides, list[torch.Tensor], list[torch.Tensor]]:
    """A group's chosen and rejected forwards: the sides as the loss reads them, their ids and
    logits (chosen first); `dropout`: the LoRA dropout of each side's policy forward."""
    need_ref = loss.needs_reference
    c, c_ids, c_logits, c_ref = side_forward(s, chosen, head, need_ref, dropout[0])
    r, r_ids, r_logits, r_ref = side_forward(s, rejected, head, need_ref, dropout[1])
    if loss.per_token:  # each side's log-prob per completion token (TRL's IPO)
        nc, nr = completion_tokens(chosen), completion_tokens(rejected)
        c, r = c / nc, r / nr
        c_ref = None if c_ref is None else c_ref / nc
        r_ref = None if r_ref is None else r_ref / nr
    logits = [x for x in (c_logits, r_logits) if x is not None]
    return PairSides(c, r, c_ref, r_ref), [c_ids, r_ids], logits


def pair_forwards(
    s: ModelSession,
    groups: list[list[EncodedPair]],
    step: int,
    name: str,
    loss: PairLoss,
    head: torch.nn.Module | None,
    sides: list[Padded] | None = None,
) -> StepForwards:
    """A chosen and a rejected forward per group, one loss per group, for one step of objective
    `name` (replay runs this); `sides` are the padded chosen/rejected tensors per group (else
    padded here)."""
    if sides is None:
        sides = pad_sides(groups, s.tok.pad_id)
    total = sum(len(fw) for fw in groups)
    starts = row_starts(len(fw) for fw in groups)  # each group's first pair
    parts = []  # (loss sum, correct, margin) of this process's groups (all without torchrun)
    for g, padding in forward_slots(len(groups), s.model):
        fw = groups[g]
        pairs = range(starts[g], starts[g] + len(fw))
        chosen, rejected = (dropout_for(s, step, [(i, side) for i in pairs]) for side in (0, 1))
        values, ids, logits = group_sides(
            s, sides[2 * g], sides[2 * g + 1], loss, head, (chosen, rejected)
        )
        out = loss.loss(values, s.run)
        losses = out.losses
        yield Forward(losses.sum() / total, losses / total, ids, logits, padding)
        if padding:
            continue
        parts.append((
            losses.detach().double().sum().cpu(),
            float(out.accuracy) * len(fw),
            float(out.margin) * len(fw),
        ))  # fmt: skip
    loss_sum = torch.zeros((), dtype=torch.float64)
    correct = margin = 0.0
    for part_loss, part_correct, part_margin in in_global_order(parts):  # group 0 first
        loss_sum += part_loss
        correct += part_correct
        margin += part_margin
    rows = [p.chosen if side == 0 else p.rejected for fw in groups for side in (0, 1) for p in fw]
    return StepOutcome(
        loss=float(loss_sum / total),
        tokens=sum(r.targets for r in rows),
        rows=2 * total,
        metrics={"pairs": total, "accuracy": correct / total, "reward_margin": margin / total},
        batch=OptimizerBatch(
            objective=name,
            step=step,
            rows=[list(r.input_ids) for r in rows],
            loss_masks=[list(r.loss_mask) for r in rows],
            forward_sizes=[len(fw) for fw in groups for _ in (0, 1)],
            denominator=total,
        ),
    )


def pairs_from_batch(batch: OptimizerBatch) -> list[list[EncodedPair]]:
    """The groups of a captured pair batch: each chosen forward is followed by its rejected."""
    from twinrun.data.examples import EncodedRow

    rows = [
        EncodedRow(tuple(r), tuple(m)) for r, m in zip(batch.rows, batch.loss_masks, strict=True)
    ]
    groups, start = [], 0
    for n in batch.forward_sizes[::2]:
        chosen, rejected = rows[start : start + n], rows[start + n : start + 2 * n]
        groups.append([EncodedPair(c, r) for c, r in zip(chosen, rejected, strict=True)])
        start += 2 * n
    return groups
