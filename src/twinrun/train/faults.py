"""Fault injection (DESIGN §6): `--inject FAULT@STEP` plants a known regression so the harness
and `twinrun diff` can be shown to catch it at its own leaf and step.

- sampler: the step's example indices come from an unseeded draw  -> batch.sample_indices
- rng: a stray draw shifts the torch CPU generator                  -> rng.state
- reduction: the step's gradient is summed in a different order     -> grads.lora
- observation: a wall-clock timestamp enters a GRPO observation     -> rollout.tokens
"""

from __future__ import annotations

from dataclasses import dataclass

from twinrun.core.errors import ConfigError

FAULTS = ("sampler", "rng", "reduction", "observation")
FAULTS_BY_OBJECTIVE = {
    "sft": ("sampler", "rng", "reduction"),
    "dpo": ("sampler", "rng", "reduction"),
    "reward": ("sampler", "rng", "reduction"),
    "grpo": FAULTS,
}


@dataclass
class Faults:
    planted: frozenset[tuple[str, int]]
    suspended: bool = False  # a spike rerun replays the step without the planted glitch

    def at(self, fault: str, step: int) -> bool:
        return not self.suspended and (fault, step) in self.planted


def parse_faults(specs: list[str], objective: str) -> Faults:
    planted = set()
    allowed = FAULTS_BY_OBJECTIVE.get(objective, FAULTS)
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
