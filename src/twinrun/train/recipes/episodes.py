"""GRPO rollouts as episodes (`rl/env_protocol.py`'s one protocol): twinrun samples every turn
itself, as the environment's turn plan (`env.plan`, `TurnPlan`) says — the sampler reads the
plan and has no branch for the kind of environment but one, how turn 0's prompt is encoded.

A single-turn environment's plan (`ONE_TURN`) is episodes of one turn: one episode per prompt
group, its observation encoded as the examples are (`Examples.templated`: chat template or
plain), the group's `group_size` samples decoded from that one prompt (token i of sample k drawn
from `stream(seed, "sample", step, example, k, i)`: `plan.draw_key` adds no turn), each answer
scored right after it; the planted observation fault (`--inject observation@STEP`) prepends the
clock to its observation.

A tool environment's plan has one episode per rollout (prompt group g of the step, sample k),
each with its own environment instance (`env.episode(row, rng)`, `rng` =
`stream(seed, "env", step, g)`, the same key for every sample of the group):

1. turn 0: the messages are the episode's first user message (`start()`), preceded by a system
   message listing the tool schemas when the chat template does not render `tools` itself; the
   prompt ids are the chat template's rendering with the generation prompt;
2. turn t: the model's turn is decoded from the ids so far, token i drawn from
   `stream(seed, "sample", step, example, k, t, i)`; its text goes to the environment, whose reply
   (tool results, or a user message) is appended as the template renders it;
3. the episode ends when the environment says done, after `plan.max_turns` model turns (the
   run's `--max-turns`), or when the next turn would not fit the token budget (the row plus
   `max_new_tokens` within the model's length); then the episode is scored (`reward()`), and
   closed with the block's others.

The row is the tokens the model actually saw and sampled: turn 0's prompt ids, then each turn's
sampled tokens followed by the environment's tokens — the text the template puts after the
model's turn (its end-of-turn marker unless the model sampled it, the environment's messages, the
next generation prompt), encoded. The template must render the earlier conversation unchanged
when a turn is added: the text of turn t+1's prompt must start with turn t's prompt text plus the
model's text, or the run stops (a template that re-renders earlier turns, e.g. one that drops
earlier reasoning, would make the rows drift from what the model saw). The model mask is 1 on
sampled tokens only: tool and environment tokens are in the rows but never in the loss or the
logprob ratio.

Each turn of the episode is recorded (`Turn`): the model-visible messages new at it (canonical
JSON), the prompt ids appended before it and the tokens sampled in it — the observation leaves
`twinrun diff` compares before any gradient.

Every active rollout of a rollout block is decoded together at each turn (left-padded:
`generate_block` with one prompt per episode, one row per rollout of it), so a row's bytes depend
on its block (fixed by the settings, never by the process count) and on which of its rollouts are
still going.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from twinrun.config.resolved import Examples, PolicyUpdate, Rollouts
from twinrun.core.errors import ModelError
from twinrun.core.rng import stream
from twinrun.data.examples import EncodedRow, SourcedRow, check_length
from twinrun.model.decoding import generate_block
from twinrun.rl.builtin_envs import observation_fault
from twinrun.rl.env_protocol import Environment, Episode, TurnPlan
from twinrun.rl.tool_calls import canonical_json, template_takes_tools, tools_system_text
from twinrun.rl.tool_calls import check_tool_template as check_rendering

if TYPE_CHECKING:
    from twinrun.model.tokens import CheckpointTokenizer
    from twinrun.train.setup.session import Session

Message = dict[str, str]


@dataclass
class Turn:
    """One model turn of an episode: the model-visible messages new at it (canonical JSON), the
    prompt ids added before it (turn 0: the whole prompt) and the tokens the model sampled."""

    observation: str
    prompt: list[int]
    sampled: list[int]


@dataclass
class EpisodeRun:
    """One rollout's episode while it is being sampled."""

    example: int
    k: int
    episode: Episode
    tools: list[dict[str, Any]]
    messages: list[Message]
    text: str  # the rendered conversation so far, with the generation prompt
    ids: list[int]  # the row so far
    mask: list[int]  # 1 on sampled tokens, over the row
    logprobs: list[float]  # float64 per token of the row, 0.0 off sampled tokens
    turns: list[Turn] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)  # prompt ids added before the next turn
    done: bool = False
    reward: float = 0.0  # set once done


@dataclass
class EpisodeResult:
    """A finished rollout: its row, model mask, old logprobs, reward and turns."""

    example: int
    k: int
    prompt_length: int  # turn 0's prompt ids
    tokens: list[int]
    mask: list[int]
    logprobs: list[float]
    reward: float
    turns: list[Turn]


def render(s: Session, messages: list[Message], tools: list[dict[str, Any]]) -> str:
    """The conversation as the chat template renders it, with the generation prompt."""
    passed = tools if tools and template_takes_tools(str(s.tok.chat_template)) else None
    return str(s.tok.render_chat(messages, True, passed))


def first_messages(
    s: Session, episode: Episode, stamped: bool = False, context: Sequence[Message] = ()
) -> tuple[list[Message], list[dict[str, Any]]]:
    """Turn 0's messages and the episode's tool schemas: the row's `context` (a conversational
    prompt's messages before the last), then the environment's observation as the user's;
    `stamped`: the planted observation fault prepends the clock to that user message."""
    tools = [dict(t) for t in episode.tools]
    messages: list[Message] = []
    if tools and not template_takes_tools(str(s.tok.chat_template)):
        messages.append({"role": "system", "content": tools_system_text(tools)})
    messages += [dict(m) for m in context]
    observation = episode.start()
    messages.append({"role": "user", "content": observation_fault(observation) if stamped
                     else observation})  # fmt: skip
    return messages, tools


def start_episode(
    s: Session, env: Environment, row: SourcedRow, example: int, ks: Sequence[int], step: int,
    slot: int, stamped: bool = False,
) -> list[EpisodeRun]:  # fmt: skip
    """A fresh environment instance's episode for prompt group `slot`, and its turn-0 prompt, for
    the samples `ks` that share it (`plan.episodes`: a single-turn environment's whole group, a
    tool environment's one rollout). A tool episode's prompt is the chat template's rendering,
    with the tools, kept for the turns after it; a single-turn one is the examples' prompt,
    encoded as they are (templated or plain)."""
    seed = s.run.seed
    episode = env.episode(dict(row.data), stream(seed, "env", step, slot))
    messages, tools = first_messages(s, episode, stamped, row.context)
    if env.plan.tool_turns:  # the one difference the data needs: how turn 0 is encoded
        text = render(s, messages, tools)
        ids = s.tok.encode(text)
    else:
        text, ids = "", s.tok.prompt_ids(messages, s.run.record(Examples).templated)
    budget = s.max_length - s.run.record(Rollouts).max_new_tokens
    check_length(EncodedRow(tuple(ids), ()), row.where, budget)
    seen = canonical_json(messages)
    return [
        EpisodeRun(example, k, episode, tools, list(messages), text, list(ids), [0] * len(ids),
                   [0.0] * len(ids), [Turn(seen, [], [])], pending=list(ids))
        for k in ks
    ]  # fmt: skip


def continuation(s: Session, run: EpisodeRun, sampled: list[int], said: str,
                 reply: Sequence[Message]) -> tuple[str, list[int]]:  # fmt: skip
    """The next prompt's text and the environment's tokens after the model's turn: the template's
    text after `said`, less the end-of-turn marker the model sampled itself. A template that
    renders the earlier turns differently is a ModelError."""
    messages = [*run.messages, {"role": "assistant", "content": said}, *reply]
    text = render(s, messages, run.tools)
    head = run.text + said
    if not text.startswith(head):
        raise ModelError(
            f"the chat template of {s.tok.source} renders the earlier turns differently once a "
            "turn is added, so the rows would not be what the model saw",
            "use a chat template that appends turns without re-rendering earlier ones",
        )
    rest = text[len(head) :]
    if sampled and sampled[-1] in s.tok.end_ids:
        marker = s.tok.end_text(sampled[-1])
        if rest.startswith(marker):
            rest = rest[len(marker) :]
    return text, s.tok.encode(rest)


def decode_turn(
    s: Session, runs: list[EpisodeRun], step: int, turn: int, plan: TurnPlan
) -> list[tuple[list[int], list[float]]]:
    """The model's turn of every run, decoded as one left-padded batch: one prompt per episode,
    one row per run of it (a single-turn episode's samples share its prompt and one prefill),
    each token's draw keyed by (step, example, k, `plan.draw_key(turn)`, position). (tokens,
    float64 logprobs) per run, in order."""
    seed, key = s.run.seed, plan.draw_key(turn)

    def draw_for(r: EpisodeRun) -> Callable[[int], float]:
        return lambda i: stream(seed, "sample", step, r.example, r.k, *key, i).uniform()

    shared: dict[int, list[EpisodeRun]] = {}
    for r in runs:
        shared.setdefault(id(r.episode), []).append(r)
    groups = list(shared.values())
    with torch.no_grad():
        results = generate_block(
            s.model, [g[0].ids for g in groups], s.run.record(Rollouts).max_new_tokens,
            s.run.record(PolicyUpdate).temperature, [[draw_for(r) for r in g] for g in groups],
            end_ids=s.tok.end_ids,
        )  # fmt: skip
    out = {
        id(r): (list(x.tokens), [float(v) for v in x.logprobs])
        for g, rows in zip(groups, results, strict=True)
        for r, x in zip(g, rows, strict=True)
    }
    return [out[id(r)] for r in runs]


def advance(
    s: Session, run: EpisodeRun, sampled: list[int], logprobs: list[float], last: bool
) -> None:
    """Append the model's turn to the run, ask the environment, and either end the episode or
    append the environment's reply for the next turn."""
    run.turns[-1].prompt = run.pending
    run.turns[-1].sampled = list(sampled)
    run.ids += sampled
    run.mask += [1] * len(sampled)
    run.logprobs += logprobs
    said = s.tok.decode(sampled)
    reply = run.episode.answer(said)
    if reply.done or last:
        run.done = True
        return
    messages = [dict(m) for m in reply.messages]
    text, env_ids = continuation(s, run, sampled, said, messages)
    if len(run.ids) + len(env_ids) + s.run.record(Rollouts).max_new_tokens > s.max_length:
        run.done = True  # the token budget: the next turn would not fit
        return
    run.messages += [{"role": "assistant", "content": said}, *messages]
    run.text = text
    run.ids += env_ids
    run.mask += [0] * len(env_ids)
    run.logprobs += [0.0] * len(env_ids)
    run.pending = env_ids
    run.turns.append(Turn(canonical_json(messages), [], []))


def episode_block(
    s: Session,
    env: Environment,
    rows: list[SourcedRow],
    step: int,
    examples: list[int],
    slots: list[int],
    stamped: bool = False,
) -> list[EpisodeResult]:
    """The episodes of one rollout block (its prompt groups, `group_size` samples each), turn
    by turn, in group then sample order: a run is scored (`reward()`) as soon as its episode is
    done — a one-turn episode's samples each right after their answer — and every episode is
    closed once the block is done. `stamped`: the planted observation fault."""
    plan = env.plan
    runs = [
        run
        for slot, e in zip(slots, examples, strict=True)
        for ks in plan.episodes(s.run.record(Rollouts).group_size)
        for run in start_episode(s, env, rows[e], e, ks, step, slot, stamped)
    ]
    prompt_lengths = [len(r.ids) for r in runs]
    max_turns = plan.max_turns
    try:
        for turn in range(max_turns):
            active = [r for r in runs if not r.done]
            if not active:
                break
            decoded = decode_turn(s, active, step, turn, plan)
            for r, (sampled, logprobs) in zip(active, decoded, strict=True):
                advance(s, r, sampled, logprobs, last=turn + 1 == max_turns)
                if r.done:
                    r.reward = r.episode.reward()
        for episode in {id(r.episode): r.episode for r in runs}.values():
            episode.close()
        return [EpisodeResult(r.example, r.k, n, r.ids, r.mask, r.logprobs, r.reward, r.turns)
                for r, n in zip(runs, prompt_lengths, strict=True)]  # fmt: skip
    except BaseException:
        for r in runs:
            close_quietly(r.episode)
        raise


def close_quietly(episode: Episode) -> None:
    """Close an episode while another error is on its way out (its own failure is dropped)."""
    try:
        episode.close()
    except Exception:  # the error already raised says what went wrong
        pass


def check_tool_template(tok: CheckpointTokenizer) -> None:
    """The chat template renders tool messages (a ModelError naming the model otherwise)."""
    check_rendering(lambda messages, gen: str(tok.render_chat(messages, gen)), tok.source)
