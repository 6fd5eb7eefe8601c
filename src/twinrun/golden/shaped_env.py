"""The golden suite's GRPO environment: a reward that varies with the sampled bytes (the random
toy answers no arithmetic question, so `arithmetic` would give every advantage 0 and leave the
adapter at its initialisation). Named by the suite as `twinrun.golden.shaped_env:make`."""

from __future__ import annotations

from typing import Any


class Shaped:
    """Reward: the completion's UTF-8 length modulo 3 (0, 1 or 2)."""

    def prompt(self, row: dict[str, Any], rng: object) -> str:
        return str(row["prompt"])

    def reward(self, row: dict[str, Any], completion: str) -> float:
        return float(len(completion.encode("utf-8")) % 3)


def make() -> Shaped:
    return Shaped()
