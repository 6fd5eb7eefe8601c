"""`twinrun tune sft`: LoRA supervised fine-tuning with completion-only loss (objectives/sft.py),
shuffled per epoch by `stream(seed, "shuffle", epoch)`, AdamW, warmup then cosine to zero.

A step is `accumulation` forwards of `batch_size` rows; each forward's loss is its rows'
completion NLL sums divided by the step's completion-token count, so the forwards' gradients sum
to the gradient of the step's mean token loss. With `--lora-dropout` a row's masks are keyed by
its index among the step's rows (`recipes.base.dropout_for`). Rows longer than one head chunk
(every row under `--attention blockwise`) run the output layer and loss by position chunks from
the final hidden states (`model/head_chunks.py`): no [B, T, V] logits.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from twinrun.capture.batch import OptimizerBatch
from twinrun.config.resolved import Examples, ValidRun
from twinrun.data.batching import StepPlan, pad_rows, padding_fraction
from twinrun.data.examples import EncodedRow, SourcedRow, encode_sft_rows
from twinrun.model.head_chunks import chunks_head, completion_nll_by_chunks
from twinrun.objectives.sft import completion_nll
from twinrun.rl.tool_calls import ToolFieldsWarning, dropped_tool_fields
from twinrun.train.parallel.distributed import in_global_order
from twinrun.train.parallel.sharding import forward_slots
from twinrun.train.recipes.base import (
    Recipe,
    Rows,
    dropout_for,
    epoch_plans,
    row_starts,
)
from twinrun.train.setup.session import ModelSession, Session
from twinrun.train.step.loop import Forward, StepForwards, StepOutcome

if TYPE_CHECKING:
    from twinrun.model.tokens import CheckpointTokenizer

Padded = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


@dataclass
class SftBatch:
    """One step's data: example indices per forward, their rows, and the rows padded."""

    indices: tuple[tuple[int, ...], ...]
    epoch: int
    forwards: list[list[EncodedRow]]
    padded: list[Padded]


@dataclass
class SftRecipe(Recipe):
    """SFT: the planned forwards of example rows, one plan per step."""

    name: ClassVar[str] = "sft"
    s: Session
    rows: list[EncodedRow]
    plans: list[StepPlan]

    @classmethod
    def encode(
        cls, run: ValidRun, tok: CheckpointTokenizer, raw: Any, max_length: int, context: Any
    ) -> list[Any]:
        templated, all_tokens = run.record(Examples).templated, run.build.messages_loss == "all"
        return encode_tool_checked(tok, raw, templated, max_length, all_tokens)

    @classmethod
    def open(cls, session: Session, encoded: list[Any], context: Any) -> SftRecipe:
        return cls(session, encoded, epoch_plans(session, len(encoded)))

    @classmethod
    def replay_forwards(cls, s: ModelSession, batch: OptimizerBatch, step: int) -> StepForwards:
        return sft_forwards(s, rows_from_batch(batch), step, cls.name)

    def summary(self, metrics: Rows, spikes: Rows) -> dict[str, Any]:
        return {"final_loss": metrics[-1]["loss"], "steps": self.total_steps, "spikes": spikes}

    def prepare(self, step: int) -> SftBatch:
        plan = self.plans[step]
        forwards = [[self.rows[i] for i in fw] for fw in plan.forwards]
        padded = [pad_rows(b, self.s.tok.pad_id) for b in forwards]
        return SftBatch(plan.forwards, plan.epoch, forwards, padded)

    def forwards(self, step: int, batch: SftBatch) -> StepForwards:
        outcome = yield from sft_forwards(self.s, batch.forwards, step, self.name, batch.padded)
        indices = torch.tensor([i for fw in batch.indices for i in fw])
        outcome.leaves = {"batch.sample_indices": indices, **outcome.leaves}
        outcome.metrics["epoch"] = batch.epoch
        return outcome


def sft_forwards(
    s: ModelSession,
    forwards: list[list[EncodedRow]],
    step: int,
    objective: str,
    padded: list[Padded] | None = None,
) -> StepForwards:
    """The forwards of one step over these rows (also what replay runs, and a text run's
    windows: `objective` names the batch); `padded` are the rows already padded (by
    `prepare`), else they are padded here."""
    device = s.run.backend.device
    total = sum(r.targets for fw in forwards for r in fw)
    if padded is None:
        padded = [pad_rows(batch, s.tok.pad_id) for batch in forwards]
    starts = row_starts(len(fw) for fw in forwards)
    sums_of: list[torch.Tensor] = []  # this process's forwards (all of them without torchrun)
    for i, padding in forward_slots(len(forwards), s.model):
        ids, attn, mask = (t.to(device) for t in padded[i])
        rows = [(starts[i] + r,) for r in range(len(forwards[i]))]
        if chunks_head(s.model, ids.shape[1] - 1):  # long rows: no [B, T, V] logits
            with dropout_for(s, step, rows):
                sums, logits = chunked_forward(s, ids, attn, mask)
        else:
            with dropout_for(s, step, rows):
                logits = [s.model(ids, attn)]
            sums, _ = completion_nll(
                logits[0], ids, mask, batch_invariant=s.run.backend.batch_invariant
            )
        yield Forward(sums.sum() / total, sums / total, [ids], logits, padding=padding)
        if not padding:
            sums_of.append(sums.detach().double().sum().cpu())
    loss_sum = torch.zeros((), dtype=torch.float64)
    for part in in_global_order(sums_of):  # from zero, forward 0 first, on any process count
        loss_sum += part
    pad = [padding_fraction(batch) for batch in forwards]
    loss = loss_sum / total
    flat = [r for fw in forwards for r in fw]
    return StepOutcome(
        loss=float(loss),
        tokens=total,
        rows=len(flat),
        metrics={"padding_fraction": sum(pad) / len(pad)},
        batch=OptimizerBatch(
            objective=objective,
            step=step,
            rows=[list(r.input_ids) for r in flat],
            loss_masks=[list(r.loss_mask) for r in flat],
            forward_sizes=[len(fw) for fw in forwards],
            denominator=total,
        ),
    )


def chunked_forward(
    s: ModelSession, ids: torch.Tensor, attn: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One forward of long rows: the final hidden states, then the output layer and loss by
    chunks (`model.head_chunks`). The logits are made whole only for `--diag` (without a
    graph: one [B, T, V] copy)."""
    sums, _, logits = completion_nll_by_chunks(s.model, ids, attn, mask, s.run.switches.diag)
    return sums, [] if logits is None else [logits]


def rows_from_batch(batch: OptimizerBatch) -> list[list[EncodedRow]]:
    """The forwards of a captured SFT batch, as rows."""
    rows = [
        EncodedRow(tuple(r), tuple(m)) for r, m in zip(batch.rows, batch.loss_masks, strict=True)
    ]
    return [rows[a:b] for a, b in batch.forwards()]


def encode_tool_checked(
    tok: CheckpointTokenizer,
    raw: list[SourcedRow],
    templated: bool,
    max_length: int,
    all_tokens: bool = False,
) -> list[EncodedRow]:
    """`encode_sft_rows`, with a warning (`ToolFieldsWarning`, once) when the chat template drops
    the rows' `tools` or assistant `tool_calls`."""
    if templated:
        found = dropped_tool_fields(str(tok.chat_template or ""), [r.data for r in raw])
        if found:
            warnings.warn(found, ToolFieldsWarning, stacklevel=2)
    return encode_sft_rows(tok, raw, templated, max_length, all_tokens)
