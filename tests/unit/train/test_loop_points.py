"""The step loop's points: hooks run in the phase they declare (not the order they were
registered), a hook that overrides a point it does not declare is refused, the recipe's
`after_update` runs once AdamW has stepped, before the hooks of that point, and a step's batch is
collected once, after `before_step`, however often its forwards run."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import torch

from twinrun.train.step.loop import (
    Attempt,
    Forward,
    Hook,
    Loop,
    Phase,
    StepForwards,
    StepOutcome,
    StepRecipe,
    StepView,
    make_optimizer,
)


class Recording(Hook):
    points: ClassVar[dict[str, Phase]] = {}

    def __init__(self, name: str, calls: list[str]) -> None:
        self.name, self.calls = name, calls

    def at_boundary(self, view: StepView) -> None:
        self.calls.append(f"{self.name}@at_boundary")

    def after_update(self, view: StepView) -> None:
        self.calls.append(f"{self.name}@after_update")

    def after_step(self, view: StepView, row: dict[str, Any]) -> None:
        self.calls.append(f"{self.name}@after_step")


class Persisting(Recording):
    points = {"at_boundary": Phase.PERSIST, "after_update": Phase.RECORD,
              "after_step": Phase.PERSIST}  # fmt: skip


class Checking(Recording):
    points = {"at_boundary": Phase.CHECK, "after_update": Phase.RECORD,
              "after_step": Phase.RECORD}  # fmt: skip


class OneForward(StepRecipe):
    """One forward whose loss is the parameter's sum; after the update it reads the parameter."""

    def __init__(self, param: torch.nn.Parameter, calls: list[str]) -> None:
        self.param, self.calls = param, calls
        self.seen: list[float] = []

    def prepare(self, step: int) -> None:
        return None

    def forwards(self, step: int, batch: None) -> StepForwards:
        yield Forward(self.param.sum())
        return StepOutcome(loss=float(self.param.detach().sum()), tokens=1, rows=1)

    def after_update(self, step: int, outcome: StepOutcome) -> None:
        self.calls.append("recipe@after_update")
        self.seen.append(float(self.param.detach()[0]))


def tiny_loop(hooks: list[Hook]) -> tuple[Loop, torch.nn.Parameter]:
    param = torch.nn.Parameter(torch.ones(2))
    params = [("p", param)]
    loop = Loop(
        params=params,
        optimizer=make_optimizer(params, 0.1, (0.9, 0.999), 1e-8, 0.0),
        base_lr=0.1,
        warmup_steps=0,
        total_steps=1,
        hooks=hooks,
        schedule="constant",
    )
    return loop, param


def test_hooks_run_by_phase_and_the_recipe_after_the_update() -> None:
    calls: list[str] = []
    # registered persisting first: the phases, not the list, put the checking hook before it
    loop, param = tiny_loop([Persisting("persist", calls), Checking("check", calls)])
    recipe = OneForward(param, calls)
    loop.run_step(0, recipe, None)
    assert calls == [
        "check@at_boundary",
        "persist@at_boundary",
        "recipe@after_update",
        "persist@after_update",  # one phase: registration order
        "check@after_update",
        "check@after_step",
        "persist@after_step",
    ]
    assert recipe.seen == [pytest.approx(0.9)]  # AdamW's first step moves it by lr


def test_a_hook_must_declare_the_points_it_overrides() -> None:
    class Undeclared(Recording):
        points = {"at_boundary": Phase.RECORD}  # overrides after_update and after_step too

    with pytest.raises(TypeError, match="Undeclared declares points"):
        tiny_loop([Undeclared("u", [])])


class Collecting(StepRecipe[int, list[float]]):
    """A plan (an int) collected into a batch (a list): records each phase it runs."""

    def __init__(self, param: torch.nn.Parameter, calls: list[str]) -> None:
        self.param, self.calls = param, calls

    def prepare(self, step: int) -> int:
        return step

    def collect(self, step: int, plan: int) -> list[float]:
        self.calls.append(f"collect {plan}")
        return [float(plan) + 2.0]

    def forwards(self, step: int, batch: list[float]) -> StepForwards:
        self.calls.append(f"forwards {batch}")
        yield Forward(self.param.sum() * batch[0])
        return StepOutcome(loss=batch[0], tokens=1, rows=1)


class Before(Hook):
    points = {"before_step": Phase.RECORD, "computed": Phase.RECORD}

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls
        self.timings: dict[str, float] = {}

    def before_step(self, view: StepView) -> None:
        self.calls.append("hook@before_step")

    def computed(self, view: StepView) -> None:
        self.timings = dict(view.timings)


class AlwaysSpikes:
    """A spike policy that reruns every step."""

    def __init__(self) -> None:
        self.spikes: list[dict[str, Any]] = []

    def exceeded(self, history: Any, loss: float) -> float | None:
        return 1.0

    def judge(self, step: int, median: float, first: Attempt, rerun: Attempt) -> str:
        self.spikes.append({"step": step})
        return "intrinsic"


def test_a_step_collects_once_and_a_spike_rerun_reuses_the_batch() -> None:
    calls: list[str] = []
    before = Before(calls)
    loop, param = tiny_loop([before])
    loop.spike = AlwaysSpikes()
    loop.total_steps = 2
    row = loop.run_step(1, Collecting(param, calls), 1)
    assert calls == ["hook@before_step", "collect 1", "forwards [3.0]", "forwards [3.0]"]
    assert row["spike"] == "intrinsic" and row["loss"] == 3.0
    assert list(before.timings) == ["collect_s", "forward_s", "backward_s", "optimizer_s"]
