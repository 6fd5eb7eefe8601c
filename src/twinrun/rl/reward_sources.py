"""Single-turn GRPO environments scored by an optional package (docs/tool-environments.md).

- `reasoning_gym:NAME`: a reasoning-gym task. The examples rows are the task's entries
  (`question`, `answer`, `metadata`, written beforehand, e.g. from
  `reasoning_gym.create_dataset(NAME, size=..., seed=...)`); the prompt is the row's `question`
  (or `prompt`) and the reward is the task's `score_answer(answer=completion, entry=row)`.
  `[environment.args]` go to `create_dataset` as the task's configuration (size 1 and seed 0
  unless given: the dataset is only the scorer, its own entries are not used).
- `math-verify`: the prompt is `row["prompt"]`; the reward is 1.0 iff
  `math_verify.verify(parse(row["answer"]), parse(completion))`, else 0.0 (a completion
  math-verify cannot read scores 0.0).

Neither package is imported before its environment is made; without it the error is one line
saying what to install. This module does not import torch, and nothing else of `twinrun.rl`.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from collections.abc import Mapping
from typing import Any

from twinrun.core.errors import ConfigError, DataError
from twinrun.core.redact import REDACTED, redact_string
from twinrun.core.rng import Stream

REASONING_GYM = "reasoning_gym:"
MATH_VERIFY = "math-verify"
_TASK = re.compile(r"^[A-Za-z0-9_]+$")


def is_reward_source(name: str) -> bool:
    return name == MATH_VERIFY or name.startswith(REASONING_GYM)


def _has_package(module: str) -> bool:
    """Whether `module` (top level) can be imported, without importing it."""
    if module in sys.modules:
        return sys.modules[module] is not None  # None: imports of it are blocked
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _require(name: str, module: str, package: str) -> Any:
    if not _has_package(module):
        raise ConfigError(
            f"environment {name!r} needs the {package} package: pip install {package}",
            f"install {package} in this environment, or choose another --env",
        )
    return importlib.import_module(module)


def _line(exc: BaseException, args: Mapping[str, Any]) -> str:
    """The exception on one line with every argument value (3 characters or more) hidden."""
    line = " ".join(str(exc).split())
    for value in sorted((str(v) for v in args.values()), key=len, reverse=True):
        if len(value) >= 3:
            line = line.replace(value, REDACTED)
    return redact_string(line)[:200]


def _text_field(row: Mapping[str, Any], keys: tuple[str, ...], env: str) -> str:
    for key in keys:
        if isinstance(row.get(key), str):
            return row[key]
    raise DataError(
        f"environment {env!r}: examples row has no string {' or '.join(map(repr, keys))} field "
        f"(keys: {sorted(row)})",
        f"every row needs {keys[0]!r} for --env {env}",
    )


class ReasoningGymEnvironment:
    """A reasoning-gym task's scorer over rows that are its entries."""

    def __init__(self, name: str, dataset: Any) -> None:
        self.name = name
        self.dataset = dataset

    def prompt(self, row: dict[str, Any], rng: Stream) -> str:
        return _text_field(row, ("question", "prompt"), self.name)

    def reward(self, row: dict[str, Any], completion: str) -> float:
        if "answer" not in row:
            raise DataError(
                f"environment {self.name!r}: examples row has no 'answer' field",
                "every row needs the task entry's 'answer' (and 'metadata')",
            )
        entry = {"metadata": {}, **row}
        return float(self.dataset.score_answer(answer=completion, entry=entry))


class MathVerifyEnvironment:
    """1.0 iff math-verify finds the completion's answer equal to the row's."""

    name = MATH_VERIFY

    def __init__(self, module: Any) -> None:
        self.module = module

    def prompt(self, row: dict[str, Any], rng: Stream) -> str:
        return _text_field(row, ("prompt",), self.name)

    def reward(self, row: dict[str, Any], completion: str) -> float:
        if "answer" not in row:
            raise DataError(f"environment {self.name!r}: examples row has no 'answer' field")
        try:
            gold = self.module.parse(str(row["answer"]))
        except Exception as exc:
            raise DataError(
                f"environment {self.name!r}: math-verify cannot read the row's answer "
                f"({type(exc).__name__})"
            ) from None
        try:
            same = self.module.verify(gold, self.module.parse(completion))
        except Exception:  # the model's text, not the row: an unreadable answer is a wrong one
            return 0.0
        return 1.0 if same else 0.0


def make_reward_source(name: str, args: Mapping[str, Any]) -> Any:
    """The environment for a name `is_reward_source` accepts; ConfigError when its package is
    missing, the task name is malformed or the task cannot be made (`math-verify` takes no
    arguments: `environments.no_arguments`, checked before)."""
    if name == MATH_VERIFY:
        return MathVerifyEnvironment(_require(name, "math_verify", "math-verify"))
    task = name[len(REASONING_GYM) :]
    if not _TASK.match(task):
        raise ConfigError(
            f"environment {name!r}: {task!r} is not a reasoning-gym task name",
            "e.g. --env reasoning_gym:leg_counting",
        )
    module = _require(name, "reasoning_gym", "reasoning-gym")
    config = {"size": 1, "seed": 0, **args}
    try:
        dataset = module.create_dataset(task, **config)
    except Exception as exc:
        raise ConfigError(
            f"environment {name!r}: reasoning_gym.create_dataset raised "
            f"{type(exc).__name__}: {_line(exc, args)}",
            "check the task name and [environment.args] against reasoning-gym's task",
        ) from None
    if not callable(getattr(dataset, "score_answer", None)):
        raise ConfigError(f"environment {name!r}: the reasoning-gym task has no score_answer")
    return ReasoningGymEnvironment(name, dataset)
