"""`twinrun tune dpo`, `tune ipo` and `tune reward`: preference pairs, two rows each.

`--batch-size` counts pairs. A forward holds one side of `batch_size` pairs — so at batch size 1
each side of a pair goes through its own one-row forward — and `--accumulation` counts pair
groups (each a chosen forward and a rejected forward) per optimizer step.

- DPO: policy = base + LoRA, reference = the same model with the adapter disabled (no grad);
  loss `-logsigmoid(beta * ((pc - rc) - (pr - rr)))` over completion log-prob sums, averaged over
  the step's pairs (`objectives/dpo.py`).
- IPO: the same forwards; each side's log-prob per completion token, loss
  `(h - 1/(2 beta))^2` with `h = (pc - rc) - (pr - rr)` (`objectives/ipo.py`). The record's
  `pair_loss` names the loss, `per_token` the division.
- Reward: a scalar head on the final-norm hidden state of the last real token
  (`model/reward_head.py`), Bradley–Terry loss `-logsigmoid(s_chosen - s_rejected)`, averaged over
  the step's pairs (`objectives/reward.py`). The head trains with the adapter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from twinrun.capture.batch import OptimizerBatch
from twinrun.config.resolved import EpochPlan, Examples, Preference
from twinrun.config.run import RunConfig
from twinrun.data.batching import StepPlan, pad_rows, plan_steps
from twinrun.data.pairs import EncodedPair, encode_pairs
from twinrun.model.lora import lora_disabled
from twinrun.objectives.dpo import sequence_logprob
from twinrun.objectives.registry import objective, pair_loss_of
from twinrun.objectives.reward import bradley_terry_loss
from twinrun.train.distributed import in_global_order, is_root
from twinrun.train.driver import drive, make_loop, spikes_of
from twinrun.train.faults import unseeded_plans
from twinrun.train.loop import Forward, StepForwards, StepOutcome, StepRecipe
from twinrun.train.recipes.sft import Padded
from twinrun.train.session import ModelSession, Session, finish_session, open_session
from twinrun.train.sharding import forward_slots


@dataclass
class PairBatch:
    """One step's data: pair indices per group, the pairs, and each group's padded chosen and
    rejected sides (chosen first)."""

    indices: tuple[tuple[int, ...], ...]
    epoch: int
    groups: list[list[EncodedPair]]
    sides: list[Padded]


def train_pairs(cfg: RunConfig) -> dict[str, Any]:
    """Run DPO, IPO or reward modelling (`cfg.objective`) end to end; the sidecar record."""
    session, pairs = open_session(
        cfg,
        lambda run, tok, raw, max_len: encode_pairs(
            tok, raw, run.record(Examples).templated, max_len
        ),
    )
    run = session.run  # as the session resolved it (the device under torchrun)
    cfg = run.config
    head = None
    if objective(cfg.objective).head:  # reward: a scalar head trains with the adapter
        from twinrun.model.reward_head import new_reward_head

        head = new_reward_head(session.model.hidden_size, run.seed).to(cfg.device)
        assert isinstance(head.weight, torch.nn.Parameter)  # typed as a Tensor by torch
        session.params = [*session.params, ("reward_head.score.weight", head.weight)]
    epochs = run.record(EpochPlan)
    plans = plan_steps(len(pairs), epochs.epochs, run.batch_size, epochs.accumulation, run.seed)
    recipe = PairRecipe(session, pairs, unseeded_plans(session.faults, plans, len(pairs)), head)
    loop = make_loop(session, len(plans))
    drive(session, loop, recipe)
    last = loop.metrics[-1]
    summary = {
        "final_loss": last["loss"],
        "steps": len(plans),
        "final_accuracy": last["accuracy"],
        "spikes": spikes_of(loop),
    }
    extra = None
    if head is not None and is_root():
        from twinrun.model.reward_head import HEAD_FILE, HEAD_KEY, save_reward_head

        save_reward_head(head, session.out)
        extra = {"reward_head": {"file": HEAD_FILE, "key": HEAD_KEY}}
    return finish_session(session, loop.metrics, summary, extra)


def pad_sides(groups: list[list[EncodedPair]], pad_id: int) -> list[Padded]:
    """Each group's chosen rows padded, then its rejected rows."""
    return [pad_rows([p.chosen if k == 0 else p.rejected for p in g], pad_id)
            for g in groups for k in (0, 1)]  # fmt: skip


@dataclass
class PairRecipe(StepRecipe):
    s: Session
    pairs: list[EncodedPair]
    plans: list[StepPlan]
    head: torch.nn.Module | None

    def prepare(self, step: int) -> PairBatch:
        plan = self.plans[step]
        groups = [[self.pairs[i] for i in fw] for fw in plan.forwards]
        return PairBatch(plan.forwards, plan.epoch, groups, pad_sides(groups, self.s.tok.pad_id))

    def forwards(self, step: int, batch: PairBatch) -> StepForwards:
        outcome = yield from pair_forwards(self.s, batch.groups, step, self.head, batch.sides)
        indices = torch.tensor([i for fw in batch.indices for i in fw])
        outcome.leaves = {"batch.sample_indices": indices, **outcome.leaves}
        outcome.metrics = {"epoch": batch.epoch, **outcome.metrics}
        return outcome


def completion_tokens(padded: Padded) -> torch.Tensor:
    """Each row's number of completion tokens whose log-probs `sequence_logprob` sums, [B]."""
    return padded[2][:, 1:].sum(-1).to(torch.float32)


def side_forward(
    s: ModelSession, padded: Padded, head: torch.nn.Module | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One forward over one side of the pairs: (values [B], ids, logits, reference values)."""
    ids, attn, mask = (t.to(s.run.config.device) for t in padded)
    invariant = s.run.config.batch_invariant
    if head is not None:
        from twinrun.model.reward_head import scores

        values = scores(s.model, head, ids, attn)  # type: ignore[arg-type]  # the head is a Linear
        return values, ids, values, None
    logits = s.model(ids, attn)
    with torch.no_grad(), lora_disabled(s.model):
        ref = sequence_logprob(s.model(ids, attn), ids, mask, batch_invariant=invariant)
    return sequence_logprob(logits, ids, mask, batch_invariant=invariant), ids, logits, ref


def pair_forwards(
    s: ModelSession,
    groups: list[list[EncodedPair]],
    step: int,
    head: torch.nn.Module | None,
    sides: list[Padded] | None = None,
) -> StepForwards:
    """A chosen and a rejected forward per group, one loss per group, for one step (replay runs
    this); `sides` are the padded chosen/rejected tensors per group (else padded here)."""
    if sides is None:
        sides = pad_sides(groups, s.tok.pad_id)
    total = sum(len(fw) for fw in groups)
    if head is None:  # a preference loss against the reference (dpo, ipo)
        pair_loss = pair_loss_of(s.run.config.objective)
        per_token = objective(s.run.config.objective).per_token
    parts = []  # (loss sum, correct, margin) of this process's groups (all without torchrun)
    for g, padding in forward_slots(len(groups), s.model):
        fw = groups[g]
        chosen, c_ids, c_logits, c_ref = side_forward(s, sides[2 * g], head)
        rejected, r_ids, r_logits, r_ref = side_forward(s, sides[2 * g + 1], head)
        if head is None:
            assert c_ref is not None and r_ref is not None  # reference forwards ran
            if per_token:  # each side's log-prob per completion token (TRL's IPO)
                nc, nr = completion_tokens(sides[2 * g]), completion_tokens(sides[2 * g + 1])
                chosen, c_ref, rejected, r_ref = chosen / nc, c_ref / nc, rejected / nr, r_ref / nr
            pref = pair_loss(chosen, rejected, c_ref, r_ref, s.run.record(Preference).beta)
            losses, accuracy = pref.losses, pref.accuracy
            margin = float(pref.reward_margin) * len(fw)
        else:
            bt = bradley_terry_loss(chosen, rejected)
            losses, accuracy, margin = bt.losses, bt.accuracy, float(bt.margin) * len(fw)
        yield Forward(
            losses.sum() / total, losses / total, [c_ids, r_ids], [c_logits, r_logits], padding
        )
        if padding:
            continue
        parts.append((losses.detach().double().sum().cpu(), float(accuracy) * len(fw), margin))
    loss_sum = torch.zeros((), dtype=torch.float64)
    correct = margin = 0.0
    for part_loss, part_correct, part_margin in in_global_order(parts):  # group 0 first
        loss_sum += part_loss
        correct += part_correct
        margin += part_margin
    loss = loss_sum / total
    rows = [p.chosen if side == 0 else p.rejected for fw in groups for side in (0, 1) for p in fw]
    return StepOutcome(
        loss=float(loss),
        tokens=sum(r.targets for r in rows),
        rows=2 * total,
        metrics={"pairs": total, "accuracy": correct / total, "reward_margin": margin / total},
        batch=OptimizerBatch(
            objective=s.run.config.objective,
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
