"""Training recipes: each builds its batches and its forward/backward for the step loop —
`sft`, `pairs` (dpo and reward), `grpo` and `text`. `train(cfg)` runs any of them: the
objective's record (objectives/registry.py) names its recipe."""

from __future__ import annotations

from typing import Any

from twinrun.config.run import RunConfig
from twinrun.core.errors import ConfigError
from twinrun.objectives.registry import NAMES, trainer_of


def train(cfg: RunConfig) -> dict[str, Any]:
    """Run `cfg` with its objective's recipe; returns the run's sidecar record ({} on a process
    of a data-parallel run other than rank 0). The one entry every command trains through."""
    if cfg.objective not in NAMES:
        raise ConfigError(f"unknown objective {cfg.objective!r}", f"use one of {', '.join(NAMES)}")
    return trainer_of(cfg.objective)(cfg)
