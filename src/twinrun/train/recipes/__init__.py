"""Training recipes, one class per objective (`RECIPES`, keyed by the objective registry's
names): `sft`, the pair objectives (`dpo`, `ipo`, `reward`), `grpo` and `text`. `train(cfg)` runs
any of them — open the session, the recipe, its loop, drive it, finish — and replay builds a
captured step's recipe from the same classes (`from_batch`)."""

from __future__ import annotations

from typing import Any

from twinrun.config.resolved import ValidRun, validate
from twinrun.config.run import RunConfig
from twinrun.core.errors import ConfigError
from twinrun.objectives.registry import NAMES
from twinrun.train.driver import drive, make_loop, spikes_of
from twinrun.train.recipes.base import Recipe
from twinrun.train.recipes.grpo import GrpoRecipe
from twinrun.train.recipes.pairs import PAIR_RECIPES
from twinrun.train.recipes.sft import SftRecipe
from twinrun.train.recipes.text import TextRecipe
from twinrun.train.setup.preflight import preflight
from twinrun.train.setup.run_data import RawData
from twinrun.train.setup.session import finish_session, open_session

_KINDS: tuple[type[Recipe], ...] = (SftRecipe, *PAIR_RECIPES, GrpoRecipe, TextRecipe)
RECIPES: dict[str, type[Recipe]] = {kind.name: kind for kind in _KINDS}


def train(run: RunConfig | ValidRun, data: RawData | None = None) -> dict[str, Any]:
    """Run `run` (validated here once if it is not yet) with its objective's recipe; returns the
    run's sidecar record ({} on a process of a data-parallel run other than rank 0). The one
    entry every command trains through. `data`: what the input checks read (`preflight(run)`
    returns it; the commands run them before torch loads); without it they run here, first."""
    if isinstance(run, RunConfig):
        if run.objective not in NAMES:
            raise ConfigError(
                f"unknown objective {run.objective!r}", f"use one of {', '.join(NAMES)}"
            )
        run = validate(run)
    if data is None:  # the output, the model's files, the data: one line for the first bad one
        data = preflight(run)
    kind = RECIPES[run.objective]
    context = kind.context(run)  # built (and checked) before anything is written
    opening = open_session(run, data)  # locked, the model's files opened, a resume checked
    try:
        encoded = kind.encode(opening.run, opening.tok, data.items, opening.max_length, context)
        session = opening.session(encoded)
    except BaseException:
        opening.close()
        raise
    recipe = kind.open(session, encoded, context)
    loop = make_loop(session, recipe.total_steps, recipe.objective_state)
    drive(session, loop, recipe, recipe.objective_state)
    summary = recipe.summary(loop.metrics, spikes_of(loop))
    return finish_session(session, loop.metrics, summary, recipe.finish(session))
