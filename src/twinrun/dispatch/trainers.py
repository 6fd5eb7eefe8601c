"""One entry for every trainer: a resolved `RunConfig` to the recipe of its objective."""

from __future__ import annotations

from typing import Any

from twinrun.config.run import RunConfig


def train(cfg: RunConfig) -> dict[str, Any]:
    """Run `cfg` with its objective's recipe; returns the run's sidecar record ({} on a process
    of a data-parallel run other than rank 0)."""
    if cfg.objective == "sft":
        from twinrun.train.recipes.sft import train_sft

        return train_sft(cfg)
    if cfg.objective == "grpo":
        from twinrun.train.recipes.grpo import train_grpo

        return train_grpo(cfg)
    if cfg.objective == "text":
        from twinrun.train.recipes.text import train_text

        return train_text(cfg)
    from twinrun.train.recipes.pairs import train_pairs

    return train_pairs(cfg, cfg.objective)
