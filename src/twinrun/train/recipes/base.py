"""What a recipe is: one objective's run, as a class that the step loop drives in training and in
replay alike.

A recipe class is registered under its objective's name (`RECIPES` in this package, one entry per
record of objectives/registry.py) and says:
- `context(run)` and `encode(run, tok, raw, max_length, context)`: what the run builds before
  anything is written (GRPO: its environment), and how its data — as the input checks read it
  (`train/setup/run_data.py`) — is encoded (checked, tokenized with the opened tokenizer); the
  session is built over the encoded data (`train` in this package says the order);
- `open(session, encoded, context)`: the recipe of a training run over the encoded data, with
  `total_steps` and its checkpointed state (`objective_state`, GRPO's replay buffer); the
  session holds the objective's head (`session.head`, built with the model: the reward head)
  and its parameter;
- `prepare(step)` / `collect(step, plan)` / `forwards(step, batch)` / `after_update(step,
  outcome)`: the step protocol of train/step/loop.py (only GRPO collects: it samples; the other
  objectives' plans are their batches);
- `summary(metrics, spikes)` and `finish(session)`: the sidecar's metrics and any record of its
  own files (the reward head's, written by `save_head`, which replay calls too);
- `from_batch(session, batch)`: the recipe of one captured step (replay): the batch is the
  captured `OptimizerBatch`, already collected (nothing is sampled), the forwards the
  objective's own (`replay_forwards`) — no data is read.

A recipe's forwards whose gradient is taken run under `dropout_for` (the LoRA dropout of
`--lora-dropout`, keyed by each row's place in the step, which a captured batch keeps).
"""

from __future__ import annotations

import itertools
from abc import abstractmethod
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from twinrun.train.step.loop import StepForwards, StepRecipe

if TYPE_CHECKING:
    from pathlib import Path

    import torch

    from twinrun.capture.batch import OptimizerBatch
    from twinrun.config.resolved import ValidRun
    from twinrun.data.batching import StepPlan
    from twinrun.model.dropout import RowKey
    from twinrun.model.tokens import CheckpointTokenizer
    from twinrun.train.hooks.checkpoint import ObjectiveState
    from twinrun.train.setup.session import ModelSession, Session

Rows = list[dict[str, Any]]  # metrics rows, or spike records


class Recipe(StepRecipe):
    """An objective's run (see the module docstring). Subclasses set `name` and implement
    `encode`, `open`, `replay_forwards`, `prepare`, `forwards` and `summary`."""

    name: ClassVar[str]
    plans: Sequence[Any]  # what each step trains on, planned when the run opens: one per step
    objective_state: ObjectiveState | None = None

    @property
    def total_steps(self) -> int:
        """The run's planned optimizer steps (the schedule's length)."""
        return len(self.plans)

    @classmethod
    def context(cls, run: ValidRun) -> Any:
        """What the run builds before anything is written and its data is encoded with (GRPO: its
        environment, a plugin's errors raised here); None for most objectives."""
        return None

    @classmethod
    @abstractmethod
    def encode(
        cls, run: ValidRun, tok: CheckpointTokenizer, raw: Any, max_length: int, context: Any
    ) -> list[Any]:
        """The raw data checked and tokenized (rows, pairs, token ids), before anything is
        written."""

    @classmethod
    @abstractmethod
    def open(cls, session: Session, encoded: list[Any], context: Any) -> Recipe:
        """The recipe of a training run over its encoded data."""

    @classmethod
    def from_batch(cls, session: ModelSession, batch: OptimizerBatch) -> StepRecipe:
        """The recipe of one captured step: `replay_forwards` on the captured batch."""
        return Replayed(batch, lambda step, b: cls.replay_forwards(session, b, step))

    @classmethod
    @abstractmethod
    def replay_forwards(cls, s: ModelSession, batch: OptimizerBatch, step: int) -> StepForwards:
        """The objective's forwards over a captured batch (what training ran on it)."""

    @abstractmethod
    def summary(self, metrics: Rows, spikes: Rows) -> dict[str, Any]:
        """The sidecar's metrics of the finished run (`spikes`: the spike reruns)."""

    @classmethod
    def save_head(cls, head: torch.nn.Linear | None, folder: Path) -> dict[str, Any] | None:
        """Write `head` (the session's, `objective_head`) into `folder` (a run directory, a
        replay's final folder); its sidecar record, or None where the objective has no head."""
        return None

    def finish(self, session: Session) -> dict[str, Any] | None:
        """Write the recipe's own files into the run directory (rank 0, after the adapter);
        their sidecar record, or None."""
        return None


def dropout_for(s: ModelSession, step: int, rows: Iterable[RowKey]) -> AbstractContextManager[None]:
    """The LoRA dropout of a training forward of step `step` over `rows` (nothing without
    `--lora-dropout`): a context around the forward whose gradient is taken, never around a
    reference, sampling or evaluation forward. A row's key is its identity within the step,
    which no batch size, accumulation split or process count changes, and which a captured
    step's rows give back in the same order (so a replay draws the same masks):

    - sft, text: `(i,)`, the row's index among the step's rows in order (forward after forward);
    - dpo, ipo, simpo, reward: `(i, side)`, the pair's index among the step's pairs and its side
      (0 chosen, 1 rejected);
    - grpo: `(i,)`, the row's index in the step's update batch: the fresh rollouts prompt group
      after prompt group (group g's sample k at `g * group_size + k`), then the replayed ones in
      draw order.
    """
    from twinrun.model.dropout import RowDropout, lora_dropout

    p = s.run.build.lora_dropout
    return lora_dropout(RowDropout(p, s.run.seed, step, tuple(rows)) if p else None)


def row_starts(sizes: Iterable[int]) -> list[int]:
    """Where each forward's rows start among the step's rows (forward sizes in order)."""
    return list(itertools.accumulate(sizes, initial=0))[:-1]


def epoch_plans(session: Session, n: int) -> list[StepPlan]:
    """The steps of a run counted in epochs over `n` encoded items (rows, pairs): each step's
    forwards of item indices, keyed per-epoch shuffles (a planted sampler fault unseeds them)."""
    from twinrun.config.resolved import EpochPlan
    from twinrun.data.batching import plan_steps
    from twinrun.train.step.faults import unseeded_plans

    run = session.run
    epochs = run.record(EpochPlan)
    plans = plan_steps(n, epochs.epochs, run.batch_size, epochs.accumulation, run.seed)
    return unseeded_plans(session.faults, plans, n)


@dataclass
class Replayed(StepRecipe):
    """One captured step as a recipe: its batch is the captured `OptimizerBatch`, its forwards
    those the objective trains with (`run(step, batch)`)."""

    batch: OptimizerBatch
    run: Callable[[int, OptimizerBatch], StepForwards]

    def prepare(self, step: int) -> OptimizerBatch:
        return self.batch

    def forwards(self, step: int, batch: OptimizerBatch) -> StepForwards:
        return (yield from self.run(step, batch))
