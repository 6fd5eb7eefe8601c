"""What an objective is, in one place: one frozen `Objective` record per training objective.

Every module that lists the objectives, or behaves differently for one, reads these records: the
`tune` commands and the TOML trainers, the settings that apply, the faults that can be planted,
the capture payload's checks, the golden suite and the harness. Adding an objective is one record
here, one recipe class (`train/recipes/`, registered in its `RECIPES` under the same name) and
its tests; `tests/unit/objectives/test_objective_registry.py` fails when another module spells an
objective's name, or when the recipes and the records disagree.

This module imports nothing heavy (no torch) and names no code: the command line builds its help
from it, and only the run itself imports the recipes (`twinrun.train.recipes.RECIPES`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Counts = Literal["epochs", "steps"]
Data = Literal["examples", "pairs", "environment", "corpus"]
Batch = Literal["rows", "pairs", "rollouts"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Objective:
    """One training objective, as the rest of twinrun sees it."""

    name: str
    """`twinrun tune NAME`, `training.trainer = "NAME"`, the sidecar's `train.objective`."""
    summary: str
    """The `tune` command's help (its first sentence is the `twinrun tune --help` line)."""
    counts: Counts
    """What the run's length is given in: passes over the examples (`--epochs`, with
    `--accumulation`) or optimizer steps (`--steps`)."""
    data: Data
    """Where a step's rows come from: examples (prompt, completion), preference pairs (prompt,
    chosen, rejected), an environment's rewards for completions sampled on the examples'
    prompts, or a plain-text corpus (no examples file)."""
    batch: Batch
    """The captured optimizer batch's shape (capture/payload.py, replay): token rows with a loss
    mask, chosen/rejected forwards of equal size, or sampled rollouts with their advantages."""
    faults: tuple[str, ...]
    """The `--inject` faults that act on this objective (train/step/faults.py names them all)."""
    head: bool = False
    """Trains a scalar head with the adapter (`reward_head.safetensors`)."""
    has_reference: bool = False
    """Compares the policy with the frozen reference (the model with the adapter disabled)
    through a preference loss; the recipe's pair loss says how (train/recipes/pairs.py)."""
    settings: tuple[str, ...] = ()
    """The settings its loss alone takes (config/run.py declares them; a setting's objectives
    are the records that name it here): `beta` (a preference temperature), `gamma` (a target
    reward margin)."""
    trl_config: str = ""
    """TRL's trainer config whose defaults `--defaults trl` takes (config/trl_defaults.py)."""

    @property
    def reads_examples(self) -> bool:
        """Reads an examples file (`--examples`, `--chat-template`)."""
        return self.data != "corpus"

    @property
    def samples(self) -> bool:
        """Samples its rows from the policy being trained (an environment scores them)."""
        return self.data == "environment"


_EXAMPLE_FAULTS = ("sampler", "rng", "reduction")
_PAIRS: dict[str, Any] = {
    "counts": "epochs", "data": "pairs", "batch": "pairs", "faults": _EXAMPLE_FAULTS
}  # fmt: skip

OBJECTIVES: tuple[Objective, ...] = (
    Objective(
        name="sft",
        summary="Supervised fine-tuning with completion-only loss.",
        counts="epochs",
        data="examples",
        batch="rows",
        faults=_EXAMPLE_FAULTS,
        trl_config="SFTConfig",
    ),
    Objective(
        name="dpo",
        summary="Direct preference optimisation on {prompt, chosen, rejected} pairs.",
        **_PAIRS,
        has_reference=True,
        settings=("beta",),
        trl_config="DPOConfig",
    ),
    Objective(
        name="ipo",
        summary="Identity preference optimisation (IPO, as TRL's loss_type='ipo') on pairs.",
        **_PAIRS,
        has_reference=True,
        settings=("beta",),
        trl_config="DPOConfig",
    ),
    Objective(
        name="simpo",
        summary=(
            "SimPO: a reference-free, length-normalised preference loss on pairs (TRL's "
            "CPOTrainer with loss_type='simpo' and cpo_alpha=0)."
        ),
        **_PAIRS,
        settings=("beta", "gamma"),
        trl_config="CPOConfig",
    ),
    Objective(
        name="reward",
        summary="Reward model: LoRA + a scalar head, Bradley-Terry loss on preference pairs.",
        **_PAIRS,
        head=True,
        trl_config="RewardConfig",
    ),
    Objective(
        name="grpo",
        summary="GRPO on an environment (PPO-clip, group-relative advantages, --kl-beta KL).",
        counts="steps",
        data="environment",
        batch="rollouts",
        faults=("sampler", "rng", "reduction", "observation", "replay"),
        trl_config="GRPOConfig",
    ),
    Objective(
        name="text",
        summary=(
            "Continued pre-training on plain text: next-token loss on windows drawn from the "
            "corpus."
        ),
        counts="steps",
        data="corpus",
        batch="rows",
        faults=("rng", "reduction"),
        trl_config="SFTConfig",
    ),
)

BY_NAME: dict[str, Objective] = {o.name: o for o in OBJECTIVES}
NAMES: tuple[str, ...] = tuple(BY_NAME)


def names(**where: Any) -> tuple[str, ...]:
    """The names of the objectives whose attributes equal `where`, in registry order:
    `names(counts="epochs")`."""
    return tuple(o.name for o in OBJECTIVES if all(getattr(o, k) == v for k, v in where.items()))


def taking(setting: str) -> tuple[str, ...]:
    """The objectives whose loss takes `setting` (a name in their record's `settings`)."""
    return tuple(o.name for o in OBJECTIVES if setting in o.settings)


def objective(name: str) -> Objective:
    """The record of `name`; a KeyError for a name that is not an objective (callers validate
    user input against `NAMES` first, with their own message)."""
    return BY_NAME[name]
