"""The validated run: `validate` returns a frozen, typed value whose records are exactly those its
objective uses; asking for another is a bug in twinrun (RuntimeError), never the user's error."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any

import pytest

from twinrun.config.resolved import (
    COMMON,
    OPTIONS,
    RECORDS,
    Backend,
    Build,
    EpochPlan,
    Evaluation,
    Examples,
    Margin,
    Optimizer,
    PerReplay,
    PolicyUpdate,
    Preference,
    ReplayPins,
    Rollouts,
    StepCount,
    TextWindows,
    ValidRun,
    _names,
    replay_pins,
    replay_run,
    validate,
)
from twinrun.config.run import RunConfig, required_fields
from twinrun.core.errors import TwinrunError
from twinrun.objectives.registry import NAMES, objective

VALUES: dict[str, Any] = {
    "model": "m", "examples": "e.jsonl", "output": "o", "seed": 7, "epochs": 2, "batch_size": 2,
    "accumulation": 3, "learning_rate": 1e-3, "warmup_steps": 0, "lr_schedule": "cosine",
    "lora_rank": 4, "lora_alpha": 8.0, "precision": "f32", "chat_template": "on", "beta": 0.1,
    "gamma": 0.5, "steps": 5, "corpus": ["a.txt", "b.txt"], "window": 8, "windows_per_step": 4,
    "prompts_per_step": 2, "group_size": 4, "max_new_tokens": 6, "temperature": 0.7,
    "clip_eps": 0.2, "advantage_clip": 5.0, "token_cap": 3, "env": "arithmetic",
}  # fmt: skip


def given(name: str, **over: Any) -> RunConfig:
    """A complete config of objective `name`: every number it requires, and nothing else."""
    values = {n: VALUES[n] for n in required_fields(name)}
    return RunConfig(objective=name, threads=1, **(values | over))


def expected(name: str) -> set[type]:
    o = objective(name)
    kinds: set[type] = {EpochPlan if o.counts == "epochs" else StepCount}
    kinds |= {Examples} if o.reads_examples else {TextWindows}
    kinds |= {Rollouts, PolicyUpdate} if o.samples else set()
    kinds |= {Preference} if "beta" in o.settings else set()
    kinds |= {Margin} if "gamma" in o.settings else set()
    return kinds


@pytest.mark.parametrize("name", NAMES)
def test_each_objective_has_the_records_it_uses(name: str) -> None:
    run = validate(given(name))
    assert isinstance(run, ValidRun)
    assert {type(r) for r in run.records} == expected(name)
    for kind in RECORDS:
        assert run.has(kind) == (kind in expected(name)), kind


def test_the_values_are_the_given_ones() -> None:
    cfg = given("grpo")
    run = validate(cfg)
    assert run.objective == "grpo" and run.as_config() == cfg
    assert (run.model, run.output, run.seed, run.batch_size) == ("m", "o", 7, 2)
    assert (run.learning_rate, run.warmup_steps, run.lr_schedule) == (1e-3, 0, "cosine")
    assert (run.lora_rank, run.lora_alpha, run.precision) == (4, 8.0, "f32")
    assert run.record(StepCount) == StepCount(5)
    assert run.record(Examples) == Examples("e.jsonl", "on") and run.record(Examples).templated
    assert run.record(Rollouts) == Rollouts(2, 4, 6, 5.0, "arithmetic")
    assert run.record(PolicyUpdate) == PolicyUpdate(0.2, 0.7, 3)
    assert validate(given("sft")).record(EpochPlan) == EpochPlan(2, 3)
    assert validate(given("dpo")).record(Preference) == Preference(0.1)
    assert validate(given("text")).record(TextWindows) == TextWindows(("a.txt", "b.txt"), 8, 4)


def test_replay_per_adds_its_buffer() -> None:
    numbers = {"replay_capacity": 16, "replay_alpha": 0.6, "replay_beta": 0.4,
               "replay_fraction": 0.5}  # fmt: skip
    run = validate(given("grpo", replay="per", **numbers))
    assert run.record(PerReplay) == PerReplay(16, 0.6, 0.4, 0.5)


def test_evaluation_is_a_record_when_its_examples_are_given() -> None:
    run = validate(given("text", eval_examples="eval.jsonl", eval_every=2))
    assert run.record(Evaluation) == Evaluation("eval.jsonl", 2)
    assert not validate(given("text")).has(Evaluation)


def test_a_record_the_run_lacks_is_a_bug_not_a_user_error() -> None:
    run = validate(given("sft"))
    with pytest.raises(RuntimeError, match="sft run has no StepCount") as err:
        run.record(StepCount)
    assert not isinstance(err.value, TwinrunError)


def test_the_run_and_its_records_are_frozen() -> None:
    run = validate(given("text"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.seed = 8  # type: ignore[misc]  # the point: it cannot be written
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.record(TextWindows).window = 9  # type: ignore[misc]  # the point, again
    assert isinstance(run.record(TextWindows).corpus, tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.switches.diag = True  # type: ignore[misc]  # the options are frozen too
    moved = run.with_switches(device="cuda:1")
    assert moved.backend.device == "cuda:1" and run.backend.device == "cpu"
    assert moved.as_config().device == "cuda:1" and run.as_config().device == "cpu"
    with pytest.raises(TypeError, match="no run option named seed"):
        run.with_switches(seed=8)  # a number that shapes the run is not a switch


def test_a_replay_has_the_records_its_contract_pins() -> None:
    assert {type(r) for r in replay_run(given("grpo")).records} == {PolicyUpdate}
    assert {type(r) for r in replay_run(given("dpo")).records} == {Preference}
    assert replay_run(given("sft")).records == ()
    bare = RunConfig(objective="grpo", model="m", output="o", seed=1, init_adapter="a")
    assert replay_pins(bare) == ReplayPins("m", "o", 1, "a")
    with pytest.raises(RuntimeError, match="batch_size of a grpo run was resolved before"):
        replay_run(bare)  # a replay whose contract was not checked: a bug


def test_every_setting_has_one_typed_place() -> None:
    """Each RunConfig field is a field of the run, of one objective record or of one option
    record: nothing is read through the config it was resolved from."""
    held = ["objective", *COMMON, *(n for k in (*RECORDS, *OPTIONS) for n in _names(k))]
    assert sorted(held) == sorted(f.name for f in dataclasses.fields(RunConfig))


def test_each_option_is_its_declared_type() -> None:
    """An option record's field is its setting's declared type, frozen: a list as a tuple, a
    table as a read-only mapping; `None` only where the declaration has it."""
    declared = typing.get_type_hints(RunConfig)
    frozen = {list[str]: tuple[str, ...], list[int]: tuple[int, ...],
              dict[str, Any]: Mapping[str, Any]}  # fmt: skip
    for kind in OPTIONS:
        for name, hint in typing.get_type_hints(kind).items():
            given = declared[name]
            parts = typing.get_args(given) if typing.get_origin(given) is types.UnionType else ()
            if type(None) in parts:
                (inner,) = [p for p in parts if p is not type(None)]
                assert hint == frozen.get(inner, inner) | None, name
            else:
                assert hint == frozen.get(given, given), name


def test_the_options_are_typed_values() -> None:
    run = validate(given("grpo", kl_beta=0.05, capture_steps=[0, 2], inject=["sampler@1"],
                         env_args={"k": 1}, lora_targets=["q_proj"],
                         max_grad_norm=1.0))  # fmt: skip
    assert run.backend == Backend("cpu", 1, run.backend.cpu_kernels, True, False, False, False)
    assert run.build == Build(("q_proj",), None, "eager", None, None, None)
    assert run.optimizer == Optimizer(0.0, (0.9, 0.999), 1e-8, 1.0, None, None)
    assert run.sampling.kl_beta == 0.05 and run.sampling.rollout_block == 4
    assert dict(run.sampling.env_args or {}) == {"k": 1}
    assert run.switches.capture_steps == (0, 2) and run.switches.inject == ("sampler@1",)
    assert not run.switches.diag and run.switches.checkpoint_every is None


@pytest.mark.parametrize("name", NAMES)
def test_as_config_gives_back_what_was_given(name: str) -> None:
    """What records a run reads its settings back unchanged: lists as lists, tables as dicts,
    and what the run does not use (replay numbers without --replay per) as given."""
    over: dict[str, Any] = {"diag": True, "capture_steps": [1], "inject": [],
                            "lora_targets": ["q_proj", "v_proj"], "max_length": 64}  # fmt: skip
    if objective(name).samples:
        over |= {"env_args": {"k": [1]}, "replay_capacity": 8, "kl_beta": 0.1}
    if name == "text":
        over |= {"eval_examples": "eval.jsonl", "eval_every": 2, "eval_limit": 3}
    cfg = given(name, **over)
    back = validate(cfg).as_config()
    assert back == cfg
    assert isinstance(back.lora_targets, list) and isinstance(back.capture_steps, list)
    assert isinstance(back.inject, list) and isinstance(back.report_to, list)
    if objective(name).samples:
        assert type(back.env_args) is dict and back.replay_capacity == 8
    numbers = {"replay_capacity": 16, "replay_alpha": 0.6, "replay_beta": 0.4,
               "replay_fraction": 0.5}  # fmt: skip
    if objective(name).samples:
        per = given(name, replay="per", **numbers)
        assert validate(per).as_config() == per


def test_a_replay_gives_back_its_config() -> None:
    cfg = given("grpo", init_adapter="a")
    assert replay_run(cfg).as_config() == cfg  # the settings its contract leaves out included


@pytest.mark.parametrize("name", NAMES)
def test_a_valid_run_gives_every_setting_its_config_holds(name: str) -> None:
    """What records read from a validated run (`value`) is what its `RunConfig` holds, so the
    sidecar's numbers, the agreement and the inputs record need no `RunConfig` made again."""
    from twinrun.config.run import SETTINGS, shaping_numbers
    from twinrun.train.outputs.run_dir import config_inputs
    from twinrun.train.parallel.agreement import agreement_record

    extra: dict[str, Any] = {"eval_examples": "e.jsonl", "eval_every": 2}
    if name == "grpo":
        extra = {"env_args": {"key": "v"}}
    extra |= {"inject": ["reduction@1"]} if name == "sft" else {}
    run = validate(given(name, **extra))
    cfg = run.as_config()
    for setting in SETTINGS:
        assert run.value(setting) == cfg.value(setting) == getattr(cfg, setting), setting
    assert shaping_numbers(run) == shaping_numbers(cfg)
    assert config_inputs(run) == config_inputs(cfg)
    inputs = {"train": shaping_numbers(run), "model_sha256": "x"}
    assert agreement_record(run, inputs) == agreement_record(cfg, inputs)
