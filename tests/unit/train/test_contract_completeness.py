"""The optimizer contract is complete: every setting that a real step of each objective reads —
where the loop is built (`build_loop`, which replay shares) and while the step runs (the
recipe's forwards, the loop's policies, the optimizer) — is declared `contract=True`, or is
listed here with the reason it does not change what an update does given its batch. A new
setting that shapes the update (say a gradient-clipping norm read by the loop) and is not in the
contract fails this test, so a replay cannot silently compute a different update."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from twinrun.config import resolved
from twinrun.config.contract import contract_settings, optimizer_contract
from twinrun.config.run import RECORDED_WHEN_GIVEN, SETTINGS, RunConfig
from twinrun.objectives.registry import NAMES

# read during a step, not in the contract: why each leaves the update (given its batch) alone
NOT_UPDATE: dict[str, str] = {
    "stop_after": "how many steps run; each step's schedule is over the planned steps",
    "spike_factor": "a spike rerun computes the step again from its own generator state, "
    "planted faults off: the same update (a planted fault is `inject`, in the contract)",
    "chat_template": "how prompts are rendered: it chooses rows, which the captured batch holds",
    "group_size": "GRPO's sampling: it chooses rows, which the captured batch holds",
    "max_new_tokens": "GRPO's sampling: it chooses rows, which the captured batch holds",
    "prompts_per_step": "GRPO's sampling: it chooses rows, which the captured batch holds",
    "advantage_clip": "GRPO's advantages, which the captured batch holds",
    "rollout_block": "which prompts decode together: it chooses rows, held by the batch",
    "replay_fraction": "how many replayed rows join the batch, which holds them",
    "diag": "GRPO keeps an update forward's logits for the `forward.logits` leaf only with it "
    "(without it they are freed once the kept rows are picked): the same values either way",
}

RECORDS = (*resolved.RECORDS, *resolved.OPTIONS, resolved.ValidRun, RunConfig)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, toy_model_dir: Path) -> dict[str, RunConfig]:
    from twinrun.golden.suite import common, run_settings, write_inputs

    root = tmp_path_factory.mktemp("contract")
    settings = run_settings(write_inputs(root), "cpu")
    return {
        name: common(toy_model_dir, root / name, name, stop_after=2, **settings[name])
        for name in NAMES
    }


class Reads:
    """The settings read through a run's config, its resolved fields, records and option
    records while on."""

    def __init__(self) -> None:
        self.on = False
        self.names: set[str] = set()

    def getattribute(self, original: Callable[[Any, str], Any]) -> Callable[[Any, str], Any]:
        def read(obj: Any, name: str) -> Any:
            if self.on and name in SETTINGS:
                self.names.add(name)
            return original(obj, name)

        return read

    def during(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def recorded(*args: Any, **kwargs: Any) -> Any:
            was, self.on = self.on, True
            try:
                return fn(*args, **kwargs)
            finally:
                self.on = was

        return recorded


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[Reads]:
    from twinrun.train import driver
    from twinrun.train.step.loop import Loop

    r = Reads()
    for kind in RECORDS:
        monkeypatch.setattr(kind, "__getattribute__", r.getattribute(kind.__getattribute__))
    monkeypatch.setattr(driver, "build_loop", r.during(driver.build_loop))
    monkeypatch.setattr(Loop, "run_step", r.during(Loop.run_step))
    yield r


def outside_contract(name: str, read: set[str]) -> list[str]:
    return sorted(read - set(contract_settings(name)) - set(NOT_UPDATE))


def test_every_setting_a_step_reads_is_in_the_contract_or_says_why_not(
    runs: dict[str, RunConfig], reads: Reads
) -> None:
    from twinrun.train.recipes import train

    seen: set[str] = set()
    outside: dict[str, list[str]] = {}
    for name, cfg in runs.items():
        reads.names = set()
        train(cfg)
        assert reads.names, name  # the recording saw the step
        seen |= reads.names
        outside[name] = outside_contract(name, reads.names)
    assert outside == {name: [] for name in NAMES}
    assert set(NOT_UPDATE) - seen == set(), "stale entries: no step reads them"


def test_a_setting_the_loop_reads_outside_the_contract_is_caught(
    runs: dict[str, RunConfig], reads: Reads, monkeypatch: pytest.MonkeyPatch
) -> None:
    from twinrun.train.recipes import train

    # as if weight decay had been added without `contract=True`: the check names it
    undeclared = dataclasses.replace(SETTINGS["weight_decay"], contract=False)
    monkeypatch.setitem(SETTINGS, "weight_decay", undeclared)
    train(dataclasses.replace(runs["sft"], output=runs["sft"].output + "-undeclared"))
    assert outside_contract("sft", reads.names) == ["weight_decay"]


@pytest.mark.parametrize("name", NAMES)
def test_the_contract_holds_every_contract_setting_under_its_toml_key(
    name: str, runs: dict[str, RunConfig]
) -> None:
    contract = optimizer_contract(runs[name], name, "0" * 64, ["q_proj", "v_proj"])
    fixed = {"training.objective", "model.sha256", "optimizer.name", "inference.engine"}
    off = {n for n in RECORDED_WHEN_GIVEN if getattr(runs[name], n) is None}
    given = {SETTINGS[n].toml for n in contract_settings(name) if n not in off}
    assert set(contract) == fixed | given
    assert contract["model.lora_targets"] == ["q_proj", "v_proj"]  # as resolved
    assert contract["optimizer.betas"] == [0.9, 0.999] and contract["optimizer.eps"] == 1e-8
