"""`--eval-examples FILE --eval-every N`: evaluation inside training.

After every N-th optimizer step (step s with (s + 1) % N == 0) the eval examples — the first
`--eval-limit` of them when given — are scored as `twinrun tune evaluate` scores them (forwards
of `--batch-size` rows in input order, no gradient, each example's token-mean completion NLL).
The step's metrics row gains `eval_loss` (the mean over examples) and `eval_tokens`; with
`--diag`, diag.jsonl gains a row of phase `eval` at that step, after the step's train row, with
the leaves `tune evaluate --diag` writes: `batch.sample_indices`, `batch.tokens`,
`forward.logits`, `loss` (per example). No generator is drawn from and nothing is updated, so a
run's training bytes do not depend on whether it evaluates.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from twinrun.infer.evaluate import score_batches
from twinrun.train.step.loop import Hook, Phase, StepView

if TYPE_CHECKING:
    from twinrun.data.examples import EncodedRow
    from twinrun.diag.recorder import DiagRecorder
    from twinrun.train.setup.session import Session


class EvaluationHook(Hook):
    points = {"after_step": Phase.RECORD}

    def __init__(
        self, s: Session, rows: list[EncodedRow], every: int, recorder: DiagRecorder | None = None
    ) -> None:
        self.s = s
        self.rows = rows
        self.every = every
        self.recorder = recorder  # the run's DiagRecorder, with --diag

    def after_step(self, view: StepView, row: dict[str, Any]) -> None:
        if (view.step + 1) % self.every:
            return
        backend = self.s.run.backend
        batches = list(
            score_batches(
                self.s.model, self.rows, self.s.tok.pad_id, self.s.run.batch_size, backend.device,
                backend.batch_invariant, self.recorder is not None,
            )
        )  # fmt: skip
        examples = [e for b in batches for e in b.examples()]
        row["eval_loss"] = sum(e["loss"] for e in examples) / len(examples)
        row["eval_tokens"] = sum(e["tokens"] for e in examples)
        if self.recorder is not None:
            leaves = {
                "batch.sample_indices": torch.arange(len(self.rows)),
                "batch.tokens": [b.ids for b in batches],
                "forward.logits": [b.logits for b in batches],
                "loss": torch.cat([b.losses() for b in batches]),
            }
            self.recorder.record(view.step, leaves, phase="eval")
