"""What an objective is, in one place: one frozen `Objective` record per training objective.

Every module that lists the objectives, or behaves differently for one, reads these records: the
`tune` commands and the TOML trainers, the settings that apply, the faults that can be planted,
the optimizer contract, the capture payload's checks, replay, the golden suite and the
harness. Adding an objective is one record here, one recipe (`train/recipes/`) and its tests;
`tests/unit/test_objective_registry.py` fails when another module spells an objective's name.

This module imports nothing heavy (no torch): the command line builds its help from it. The
trainer is named as `module:function` and imported only when a run starts (`trainer_of`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
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
    """The `--inject` faults that act on this objective (train/faults.py names them all)."""
    contract_keys: tuple[str, ...]
    """The TOML keys of the objective's own settings in the optimizer contract, beyond those every
    objective shares (config/contract.py)."""
    trainer: str
    """`module:function` of the recipe: `function(cfg: RunConfig) -> dict` (the sidecar record)."""
    head: bool = False
    """Trains a scalar head with the adapter (`reward_head.safetensors`)."""
    pair_loss: str | None = None
    """`module:function` of a preference loss against the frozen reference (the model with the
    adapter disabled): `function(pc, pr, rc, rr, beta) -> DPOOut` over the pairs' completion
    log-probs (`--beta` applies). None: no reference model."""
    per_token: bool = False
    """The preference loss reads each side's log-prob per completion token (the sum divided by
    its token count), as TRL's IPO does, not the sum."""

    @property
    def reads_examples(self) -> bool:
        """Reads an examples file (`--examples`, `--chat-template`)."""
        return self.data != "corpus"

    @property
    def has_reference(self) -> bool:
        """Compares the policy with the frozen reference through a preference loss (`--beta`)."""
        return self.pair_loss is not None

    @property
    def samples(self) -> bool:
        """Samples its rows from the policy being trained (an environment scores them)."""
        return self.data == "environment"


_EXAMPLE_FAULTS = ("sampler", "rng", "reduction")

OBJECTIVES: tuple[Objective, ...] = (
    Objective(
        name="sft",
        summary="Supervised fine-tuning with completion-only loss.",
        counts="epochs",
        data="examples",
        batch="rows",
        faults=_EXAMPLE_FAULTS,
        contract_keys=("training.accumulation",),
        trainer="twinrun.train.recipes.sft:train_sft",
    ),
    Objective(
        name="dpo",
        summary="Direct preference optimisation on {prompt, chosen, rejected} pairs.",
        counts="epochs",
        data="pairs",
        batch="pairs",
        faults=_EXAMPLE_FAULTS,
        contract_keys=("training.accumulation", "dpo.beta"),
        trainer="twinrun.train.recipes.pairs:train_pairs",
        pair_loss="twinrun.objectives.dpo:dpo_loss",
    ),
    Objective(
        name="ipo",
        summary="Identity preference optimisation (IPO, as TRL's loss_type='ipo') on pairs.",
        counts="epochs",
        data="pairs",
        batch="pairs",
        faults=_EXAMPLE_FAULTS,
        contract_keys=("training.accumulation", "dpo.beta"),
        trainer="twinrun.train.recipes.pairs:train_pairs",
        pair_loss="twinrun.objectives.ipo:ipo_loss",
        per_token=True,
    ),
    Objective(
        name="reward",
        summary="Reward model: LoRA + a scalar head, Bradley-Terry loss on preference pairs.",
        counts="epochs",
        data="pairs",
        batch="pairs",
        faults=_EXAMPLE_FAULTS,
        contract_keys=("training.accumulation",),
        trainer="twinrun.train.recipes.pairs:train_pairs",
        head=True,
    ),
    Objective(
        name="grpo",
        summary="GRPO on an environment (PPO-clip, group-relative advantages, no KL term).",
        counts="steps",
        data="environment",
        batch="rollouts",
        faults=("sampler", "rng", "reduction", "observation", "replay"),
        contract_keys=("grpo.clip_eps", "grpo.temperature", "grpo.token_cap"),
        trainer="twinrun.train.recipes.grpo:train_grpo",
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
        contract_keys=("text.windows_per_step",),
        trainer="twinrun.train.recipes.text:train_text",
    ),
)

BY_NAME: dict[str, Objective] = {o.name: o for o in OBJECTIVES}
NAMES: tuple[str, ...] = tuple(BY_NAME)


def names(**where: Any) -> tuple[str, ...]:
    """The names of the objectives whose attributes equal `where`, in registry order:
    `names(counts="epochs")`."""
    return tuple(o.name for o in OBJECTIVES if all(getattr(o, k) == v for k, v in where.items()))


def objective(name: str) -> Objective:
    """The record of `name`; a KeyError for a name that is not an objective (callers validate
    user input against `NAMES` first, with their own message)."""
    return BY_NAME[name]


def _load(spec: str) -> Any:
    module, function = spec.split(":")
    return getattr(importlib.import_module(module), function)


def trainer_of(name: str) -> Callable[[Any], dict[str, Any]]:
    """The recipe function of `name`, imported now (this is where torch gets imported)."""
    trainer: Callable[[Any], dict[str, Any]] = _load(objective(name).trainer)
    return trainer


def pair_loss_of(name: str) -> Callable[..., Any]:
    """The preference loss of `name` (one with a reference model), imported now."""
    spec = objective(name).pair_loss
    if spec is None:
        raise KeyError(f"objective {name!r} has no preference loss")
    loss: Callable[..., Any] = _load(spec)
    return loss
