"""The optimizer batch: exactly what one optimizer step trained on, as the backend used it.

Every objective can describe its step this way, after advantage normalisation, clipping and the
token cap. This is what capture writes and replay trains on again, without data, environment or
sampling.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class OptimizerBatch:
    """Rows in the order the forwards consumed them.

    - `rows`: token ids per row; `loss_masks`: per row, 1 where the token is a kept training
      target (same length as the row);
    - `forward_sizes`: rows per forward, in order (their sum is len(rows));
    - `denominator`: what the step's summed loss is divided by (tokens for sft/grpo, pairs for
      dpo/reward);
    - `floats`: per-objective float64 data — grpo: `old_logprobs` (per row, aligned with the
      row's tokens, 0.0 off completion tokens), `advantages` [N], `weights` [N];
    - `ints`: per-objective integers — grpo: `prompt_lengths` [N].
    """

    objective: str
    step: int
    rows: list[list[int]]
    loss_masks: list[list[int]]
    forward_sizes: list[int]
    denominator: int
    floats: dict[str, Any] = field(default_factory=dict)
    ints: dict[str, Any] = field(default_factory=dict)

    def forwards(self) -> list[tuple[int, int]]:
        """(start, stop) row ranges of each forward."""
        out, start = [], 0
        for n in self.forward_sizes:
            out.append((start, start + n))
            start += n
        return out
