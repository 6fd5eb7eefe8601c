"""What GRPO samples (docs/training.md, docs/tool-environments.md): the one `Environment`
protocol, its episodes and its turn plan.

`Environment.episode(row, rng) -> Episode` is one conversation: `start()` the first user message,
`answer(text)` the reply to each model turn (`EnvReply`, with the tool calls it ran as
`CallRecord`s), `reward()` the score once the episode is done, `close()`. `check_rows(rows,
seed)` checks every examples row before anything is written.

`Environment.plan` (`TurnPlan`) is how its episodes are sampled, and the one place the
single-turn case differs from the tool case: verifiers' `SingleTurnEnv` is a `MultiTurnEnv`
with `max_turns=1`, and here too the sampler reads the plan instead of branching on the kind.
A single-turn environment's plan is `ONE_TURN`; a tool environment's has the run's
`--max-turns`.

A single-turn environment is written in the simpler `SingleTurn` shape (`prompt`, `reward`) and
adapted to the protocol by `single_turn.py`. This module imports nothing of twinrun but its
errors and random streams, and not torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from twinrun.core.errors import ConfigError
from twinrun.core.rng import Stream


class EnvironmentPluginError(ConfigError):
    """An environment could not be built, or its code failed or returned something unusable."""


@dataclass(frozen=True)
class CallRecord:
    """One tool call the model made, and what came of it."""

    name: str
    arguments: Any  # the parsed arguments, or the raw text when malformed
    ok: bool
    result: str  # the tool's answer (text), or the one-line failure shown to the model


@dataclass(frozen=True)
class EnvReply:
    """The environment's reply to one model turn. When `done`, `messages` is empty."""

    messages: tuple[dict[str, str], ...]  # each {"role": "tool"|"user", "content": str}
    done: bool
    calls: tuple[CallRecord, ...] = ()


@dataclass(frozen=True)
class TurnPlan:
    """How GRPO samples an environment's episodes.

    - `max_turns`: the model turns an episode takes at most (a single-turn environment's: 1; a
      tool environment's: `--max-turns`);
    - `tool_turns`: False for a single-turn environment — one episode serves every sample of a
      prompt group (its observation made once and encoded as the examples are, its samples
      decoded from one prefill, each answer scored right after it, token draws keyed without a
      turn); True for a tool environment — each sample has its own episode, rendered by the
      chat template with its tools, every turn recorded and the environment's tokens masked
      out of the loss.
    """

    max_turns: int
    tool_turns: bool

    def episodes(self, group_size: int) -> list[range]:
        """The samples k of each episode of one prompt group, in order."""
        if self.tool_turns:
            return [range(k, k + 1) for k in range(group_size)]
        return [range(group_size)]

    def draw_key(self, turn: int) -> tuple[int, ...]:
        """What a token draw's key holds of the turn, after (step, example, k): the turn's
        index when an episode takes turns, nothing for a single-turn one."""
        return (turn,) if self.tool_turns else ()


ONE_TURN = TurnPlan(max_turns=1, tool_turns=False)


@runtime_checkable
class Episode(Protocol):
    """One conversation with a fresh environment instance."""

    tools: tuple[dict[str, Any], ...]  # JSON schemas offered to the model (may be empty)

    def start(self) -> str: ...  # the first user message (observation at turn 0)

    def answer(self, text: str) -> EnvReply: ...  # reply to the model's turn (decoded text)

    def reward(self) -> float: ...  # score once done (one-turn: of the last answer); finite

    def close(self) -> None: ...


@runtime_checkable
class Environment(Protocol):
    """What GRPO samples: episodes, as its `plan` says."""

    name: str
    plan: TurnPlan

    def episode(self, row: dict[str, Any], rng: Stream) -> Episode: ...

    def check_rows(self, rows: list[Any], seed: int) -> None:
        """A DataError naming the first examples row the environment cannot use."""
        ...


@runtime_checkable
class SingleTurn(Protocol):
    """How a single-turn environment is written (built-ins, plugins, reward sources)."""

    def prompt(self, row: dict[str, Any], rng: Stream) -> str: ...

    def reward(self, row: dict[str, Any], completion: str) -> float: ...
