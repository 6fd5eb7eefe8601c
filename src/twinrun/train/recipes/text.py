"""`twinrun tune text`: continued pre-training with LoRA on plain text — the next-token loss on
every token of windows drawn from the corpus (data/corpus.py says how the corpus is tokenized and
how the windows are drawn).

A step is `--windows-per-step` windows of `--window` tokens, split into forwards of
`--batch-size` windows (the last may be short). Each forward's loss is its windows' NLL sums
divided by the step's target count (every token after a window's first), so the forwards'
gradients sum to the gradient of the step's mean token loss — SFT's forwards with a loss mask
that covers the whole window, and the same code runs them. In diag, `batch.sample_indices` holds
the step's window starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from twinrun.config.resolved import StepCount, TextWindows, ValidRun
from twinrun.data.corpus import check_window, tokenize_corpus, window_row
from twinrun.data.corpus import window_start as start_of
from twinrun.data.examples import EncodedRow
from twinrun.model.tokens import CheckpointTokenizer
from twinrun.train.recipes.base import Recipe, Rows
from twinrun.train.recipes.sft import SftRecipe, sft_forwards
from twinrun.train.setup.session import Session
from twinrun.train.step.loop import StepForwards


@dataclass
class TextBatch:
    """One step's windows: their starts in the token stream, and their rows per forward."""

    starts: tuple[int, ...]
    forwards: list[list[EncodedRow]]


def window_starts(run: ValidRun, step: int, tokens: int) -> tuple[int, ...]:
    """The starts of step `step`'s windows, each its own keyed draw."""
    text = run.record(TextWindows)
    k, n = text.windows_per_step, text.window
    return tuple(start_of(run.seed, step, i, tokens, n) for i in range(k))


@dataclass
class TextRecipe(Recipe):
    """Continued pre-training: each step's windows, drawn from the corpus's token ids."""

    name: ClassVar[str] = "text"
    s: Session
    ids: list[int]

    @property
    def total_steps(self) -> int:
        return self.s.run.record(StepCount).steps

    @classmethod
    def encode(
        cls, run: ValidRun, tok: CheckpointTokenizer, raw: Any, max_length: int, context: Any
    ) -> list[Any]:
        ids = tokenize_corpus(tok, raw)
        check_window(len(ids), run.record(TextWindows).window, max_length)
        return ids

    @classmethod
    def open(cls, session: Session, encoded: list[Any], context: Any) -> TextRecipe:
        return cls(session, encoded)

    # a text step is SFT's forwards over whole windows: the same classmethod, named "text" here
    replay_forwards = SftRecipe.__dict__["replay_forwards"]

    def summary(self, metrics: Rows, spikes: Rows) -> dict[str, Any]:
        return {
            "final_loss": metrics[-1]["loss"],
            "steps": self.total_steps,
            "corpus_tokens": len(self.ids),
            "spikes": spikes,
        }

    def prepare(self, step: int) -> TextBatch:
        run = self.s.run
        starts = window_starts(run, step, len(self.ids))
        rows = [window_row(self.ids, a, run.record(TextWindows).window) for a in starts]
        size = run.batch_size
        return TextBatch(starts, [rows[i : i + size] for i in range(0, len(rows), size)])

    def forwards(self, step: int, batch: TextBatch) -> StepForwards:
        outcome = yield from sft_forwards(self.s, batch.forwards, step, self.name)
        outcome.leaves = {"batch.sample_indices": torch.tensor(batch.starts), **outcome.leaves}
        return outcome
