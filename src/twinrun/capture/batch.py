"""The optimizer batch: exactly what one optimizer step trained on, as the backend used it.

Every objective can describe its step this way, after advantage normalisation, clipping and the
token cap. This is what capture writes and replay trains on again, without data, environment or
sampling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# GRPO's update columns, in the payload's order: (field, payload name, layout — per "token",
# aligned with the row, or one per "row"); the optional ones may be absent (None)
UPDATE_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("old_logprobs", "floats.old_logprobs", "token"),
    ("advantages", "floats.advantages", "row"),
    ("weights", "floats.weights", "row"),
    ("prompt_lengths", "ints.prompt_lengths", "row"),
)
OPTIONAL_UPDATE_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("model_mask", "ints.model_mask", "token"),
)


@dataclass
class UpdateColumns:
    """A GRPO batch's update data beyond its rows and masks, one entry per row: what the clipped
    update reads (capture writes each as `UPDATE_COLUMNS` names it)."""

    old_logprobs: list[list[float]]  # per token, aligned with the row; 0.0 off completion tokens
    advantages: list[float]
    weights: list[float]
    prompt_lengths: list[int]
    # per token, 1 on the model's sampled tokens: rows of a tool environment (None: every
    # completion token is the model's)
    model_mask: list[list[int]] | None = None

    def columns(self) -> dict[str, tuple[str, list[Any]]]:
        """Each column held, by its payload name, with its layout, in the payload's order."""
        return {
            key: (layout, value)
            for name, key, layout in (*UPDATE_COLUMNS, *OPTIONAL_UPDATE_COLUMNS)
            if (value := getattr(self, name)) is not None
        }

    @classmethod
    def from_columns(cls, columns: dict[str, list[Any]]) -> UpdateColumns:
        """The columns `columns()` names, by those names (a decoded payload's)."""
        values: dict[str, Any] = {name: columns[key] for name, key, _ in UPDATE_COLUMNS}
        values |= {name: columns.get(key) for name, key, _ in OPTIONAL_UPDATE_COLUMNS}
        return cls(**values)


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
