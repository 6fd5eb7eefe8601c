"""A single-turn environment as the `Environment` protocol (docs/training.md).

A single-turn environment is written in the `SingleTurn` shape, two methods:

- `prompt(row, rng) -> str`: the observation the model sees for an examples row; `rng` is a
  twinrun stream keyed by (seed, step, prompt) for environments that randomise their observation.
- `reward(row, completion) -> float`: a finite float score for one sampled completion.

and is an `Environment` of one-turn episodes (`OneTurnEnvironment`, `OneTurnEpisode`, its plan
`ONE_TURN`): one episode serves a whole prompt group — its observation is made once, and each
sample's answer is scored right after it. The built-ins are one (`builtin_envs.py`); a plugin's
or reward source's object is adapted (`OneTurnAdapter`). Every prompt and reward passes the
checks of `env_checks.py`. This module does not import torch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from twinrun.core.rng import Stream
from twinrun.rl.env_checks import checked_prompt, checked_reward, validated_rows
from twinrun.rl.env_protocol import ONE_TURN, EnvReply, SingleTurn


class OneTurnEpisode:
    """A single-turn environment's episode of one prompt group: `start()` is its observation
    (`prompt(row, rng)`, checked), every `answer` ends the episode, and `reward()` scores the
    last answer (`reward(row, completion)`, checked) — each sample of the group answers, then is
    scored, in turn. Nothing to close."""

    tools: tuple[dict[str, Any], ...] = ()

    def __init__(self, env: SingleTurn, name: str, row: dict[str, Any], rng: Stream) -> None:
        self.env, self.name, self.row, self.rng = env, name, row, rng
        self.scored = dict(row)  # the rewards' copy of the row (the prompt gets its own)
        self.final = ""

    def start(self) -> str:
        return checked_prompt(self.env, self.name, dict(self.row), self.rng)

    def answer(self, text: str) -> EnvReply:
        self.final = text
        return EnvReply((), True)

    def reward(self) -> float:
        return checked_reward(self.env, self.name, self.scored, self.final)

    def close(self) -> None:
        pass


class OneTurnEnvironment(ABC):
    """A `SingleTurn` environment as the `Environment` protocol: one-turn episodes, each over a
    fresh instance (`renew`: GRPO makes one per prompt group, so an environment that keeps
    state between calls cannot carry it from one group — or one process — to another)."""

    name = ""
    plan = ONE_TURN

    @abstractmethod
    def prompt(self, row: dict[str, Any], rng: Stream) -> str:
        """The observation of `row`, drawing from `rng` only."""

    @abstractmethod
    def reward(self, row: dict[str, Any], completion: str) -> float:
        """The completion's reward (a finite number)."""

    def renew(self) -> OneTurnEnvironment:
        """An instance with no state from earlier calls (built-ins keep none: themselves)."""
        return self

    def episode(self, row: dict[str, Any], rng: Stream) -> OneTurnEpisode:
        return OneTurnEpisode(self.renew(), self.name, row, rng)

    def check_rows(self, rows: list[Any], seed: int) -> None:
        """Every row's prompt builds and its reward scores (`validated_rows`)."""
        validated_rows(self, self.name, rows, seed)


class OneTurnAdapter(OneTurnEnvironment):
    """A plugin's or reward source's `SingleTurn` object with the texts of its arguments (never
    echoed in errors), and how to make another (`renew`: the factory, called again)."""

    def __init__(
        self,
        inner: Any,
        hidden_arguments: tuple[str, ...],
        renew: Callable[[], Any] | None = None,
        name: str = "",
    ) -> None:
        self.inner = inner
        self.hidden_arguments = hidden_arguments
        self._renew = renew
        self.name = name or str(getattr(inner, "name", ""))

    def renew(self) -> OneTurnAdapter:
        """A fresh instance made by the factory, with the same arguments."""
        return self if self._renew is None else self._renew()

    def prompt(self, row: dict[str, Any], rng: Stream) -> str:
        return self.inner.prompt(row, rng)

    def reward(self, row: dict[str, Any], completion: str) -> float:
        return self.inner.reward(row, completion)
