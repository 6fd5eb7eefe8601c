"""`twinrun check --quick`: the budget it appends to a training command, and what it refuses."""

from __future__ import annotations

import pytest

from twinrun.core.errors import ConfigError
from twinrun.harness.quick import QUICK_EVAL_EXAMPLES, QUICK_STEPS, quick_command


def test_quick_appends_the_step_budget() -> None:
    cmd = ("twinrun", "tune", "text", "--seed", "{seed}", "--output", "{out}")
    assert quick_command(cmd) == (*cmd, "--stop-after", "3")
    assert (QUICK_STEPS, QUICK_EVAL_EXAMPLES) == (3, 8)


def test_quick_limits_the_eval_examples_of_a_run_that_evaluates() -> None:
    cmd = ("python", "-m", "twinrun", "tune", "sft", "--eval-examples", "e.jsonl",
           "--eval-every", "1")  # fmt: skip
    assert quick_command(cmd) == (*cmd, "--stop-after", "3", "--eval-limit", "8")


@pytest.mark.parametrize(
    ("cmd", "message"),
    [
        (("twinrun", "tune", "evaluate", "--output", "{out}"), "--quick needs a twinrun training"),
        (("python", "train.py", "{seed}", "{out}"), "--quick needs a twinrun training"),
        (("twinrun", "tune", "sft", "--eval-limit=4"), "--quick sets --eval-limit itself"),
        (("twinrun", "tune", "sft", "--stop-after", "9"), "--quick sets --stop-after itself"),
    ],
)
def test_quick_refuses_what_it_cannot_budget(cmd: tuple[str, ...], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        quick_command(cmd)
