"""The optimizer batch: exactly what one optimizer step trained on, as the backend used it.

Every objective can describe its step this way, after advantage normalisation, clipping and the
token cap. This is what capture writes and replay trains on again, without data, environment or
sampling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class UpdateColumns:
    """A GRPO batch's update data beyond its rows and masks, one entry per row: what the clipped
    update reads (capture writes each as `floats.<name>` or `ints.<name>`, per token or per
    row)."""

    old_logprobs: list[list[float]]  # per token, aligned with the row; 0.0 off completion tokens
    advantages: list[float]
    weights: list[float]
    prompt_lengths: list[int]
    # per token, 1 on the model's sampled tokens: rows of a tool environment (None: every
    # completion token is the model's)
    model_mask: list[list[int]] | None = None

    def columns(self) -> dict[str, tuple[str, list[Any]]]:
        """Each column by its payload name (`floats.<name>`, `ints.<name>`), with its layout
        ("token" or "row"), in the payload's order."""
        out: dict[str, tuple[str, list[Any]]] = {
            "floats.old_logprobs": ("token", self.old_logprobs),
            "floats.advantages": ("row", self.advantages),
            "floats.weights": ("row", self.weights),
            "ints.prompt_lengths": ("row", self.prompt_lengths),
        }
        if self.model_mask is not None:
            out["ints.model_mask"] = ("token", self.model_mask)
        return out

    @classmethod
    def from_columns(cls, columns: dict[str, list[Any]]) -> UpdateColumns:
        """The columns `columns()` names, by those names (a decoded payload's)."""
        return cls(
            old_logprobs=columns["floats.old_logprobs"],
            advantages=columns["floats.advantages"],
            weights=columns["floats.weights"],
            prompt_lengths=columns["ints.prompt_lengths"],
            model_mask=columns.get("ints.model_mask"),
        )


@dataclass
class OptimizerBatch:
    """Rows in the order the forwards consumed them.

    - `rows`: token ids per row; `loss_masks`: per row, 1 where the token is a kept training
      target (same length as the row);
    - `forward_sizes`: rows per forward, in order (their sum is len(rows));
    - `denominator`: what the step's summed loss is divided by (tokens for sft/grpo, pairs for
      dpo/reward);
    - `update`: GRPO's per-row update data (`UpdateColumns`); None for the other objectives,
      whose rows and masks are all their update reads.
    """

    objective: str
    step: int
    rows: list[list[int]]
    loss_masks: list[list[int]]
    forward_sizes: list[int]
    denominator: int
    update: UpdateColumns | None = None

    def forwards(self) -> list[tuple[int, int]]:
        """(start, stop) row ranges of each forward."""
        out, start = [], 0
        for n in self.forward_sizes:
            out.append((start, start + n))
            start += n
        return out
