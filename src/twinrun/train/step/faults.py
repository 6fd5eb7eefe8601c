"""Fault injection: `--inject FAULT@STEP` plants a known regression so the harness and
`twinrun diff` can be shown to catch it at its own leaf and step.

- sampler: the step's example indices come from an unseeded draw  -> batch.sample_indices
- rng: a stray draw shifts the torch CPU generator                  -> rng.state
- reduction: the step's gradient is summed in a different order     -> grads.lora
- observation: a wall-clock timestamp enters a GRPO observation     -> rollout.tokens
- replay: the prioritized buffer's draws (--replay per) are unseeded -> replay.draws

`rng` and `reduction` act on the step (the loop's stray draw and backward, train/step/policies.py);
`sampler`, `observation` and `replay` act on the data a recipe draws (`unseeded_plans`,
`Faults.once`); with `--replay per` a `sampler` fault also makes that step's buffer draws
unseeded. A planted fault fires once: a
spike rerun of its step runs without it. Which faults an objective takes is its record's
`faults` (objectives/registry.py).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from twinrun.core.errors import ConfigError
from twinrun.objectives.registry import BY_NAME

FAULTS = ("sampler", "rng", "reduction", "observation", "replay")


@dataclass
class Faults:
    planted: frozenset[tuple[str, int]]
    fired: set[tuple[str, int]] = field(default_factory=set)

    def at(self, fault: str, step: int) -> bool:
        return (fault, step) in self.planted

    def once(self, fault: str, step: int) -> bool:
        """True the first time it is asked about a planted (fault, step), False after."""
        if (fault, step) not in self.planted or (fault, step) in self.fired:
            return False
        self.fired.add((fault, step))
        return True


def unseeded_plans(faults: Faults, plans: list[Any], n: int) -> list[Any]:
    """The `sampler` fault: at its steps the example indices (of every forward of a `StepPlan`,
    or a list of indices) come from an unseeded draw over `n` examples."""
    out = list(plans)
    for step, plan in enumerate(plans):
        if not faults.at("sampler", step):
            continue
        unseeded = random.SystemRandom()
        if isinstance(plan, list):
            out[step] = [unseeded.randrange(n) for _ in plan]
        else:
            draws = tuple(tuple(unseeded.randrange(n) for _ in fw) for fw in plan.forwards)
            out[step] = dataclasses.replace(plan, forwards=draws)
    return out


def parse_faults(specs: Iterable[str], objective: str) -> Faults:
    planted = set()
    allowed = BY_NAME[objective].faults if objective in BY_NAME else FAULTS
    for spec in specs:
        name, sep, step = spec.partition("@")
        if not sep or not step.isdigit():
            raise ConfigError(
                f"--inject {spec!r} is not FAULT@STEP",
                f"e.g. --inject sampler@2 ({', '.join(FAULTS)})",
            )
        if name not in FAULTS:
            raise ConfigError(
                f"unknown fault {name!r} in --inject", f"choose from {', '.join(FAULTS)}"
            )
        if name not in allowed:
            raise ConfigError(
                f"fault {name!r} does not apply to {objective}",
                f"{objective} supports {', '.join(allowed)}",
            )
        planted.add((name, int(step)))
    return Faults(frozenset(planted))
