"""KV-cached token generation on a `CausalLM` (transformers' model and cache), greedy or with
caller-supplied uniform draws.

- temperature 0: greedy; argmax of the logits, ties go to the lowest token id.
- temperature > 0: `u = draw(position)` (a float in [0, 1) from the caller, e.g.
  `stream(seed, "sample", step, prompt, k, position).uniform()`; `position` is the 0-based index
  of the generated token); `p = softmax(logits.double() / T)`; the token is the first index whose
  sequential float64 cumulative sum exceeds `u * sum(p)`.

`GenerationResult.logprobs` holds, per generated token, its float64 log-probability under the
temperature-scaled distribution (`log_softmax(logits.double() / T)`; at temperature 0 under the
unscaled one) — GRPO's "old" logprob. Generation stops after emitting any of `end_ids` (a checkpoint
may declare several: its eos and the chat template's end-of-turn token).

`generate_group` decodes several completions of one prompt (a GRPO prompt group) as one batch:
the prompt is prefilled once as a one-row forward, its cache is repeated for the G rows, and
every later forward is a [G, 1] batch of each row's last token. Row r draws its tokens from its
own `draws[r]`; a row stops at its end id while the others go on. A finished row consumes no
more draws; it is fed its last token again until the block ends and its outputs are thrown away.

What a row's bytes depend on: the prompt, its own draws, the model (weights, precision,
attention, threads) and G — the decode forwards always have shape [G, 1], whatever the other
rows sample or when they stop. No operation of a decoder forward mixes rows (every row has the
same length: the prompt plus the position, so there is no padding and no mask), so the other
rows' tokens never enter a row's arithmetic; only the shape does, through the kernels' blocking.
In batch-invariant mode (`model.batch_invariant`) every row is decoded alone ([1, 1] forwards
from the shared prefill), which is what `generate` does for one row: then a completion depends
on G not at all.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from twinrun.model.build import CausalLM


@dataclass
class GenerationResult:
    tokens: list[int] = field(default_factory=list)  # generated tokens only
    logprobs: list[float] = field(default_factory=list)  # float64, one per token


def sample_index(logits: torch.Tensor, temperature: float, u: float) -> tuple[int, float]:
    """Pick a token from 1-D logits with the uniform draw `u`; returns (token, logprob)."""
    return sample_rows(logits.unsqueeze(0), temperature, [u])[0]


def sample_rows(
    logits: torch.Tensor, temperature: float, us: Sequence[float]
) -> list[tuple[int, float]]:
    """`sample_index` for each row of [R, V] logits, row i with draw `us[i]` (one softmax and one
    cumulative sum over the block; each row's numbers are those of its own 1-D computation)."""
    scaled = logits.detach().to("cpu", torch.float64) / temperature
    logp = torch.log_softmax(scaled, dim=-1)
    probs = torch.softmax(scaled, dim=-1).numpy()
    cum = np.cumsum(probs, axis=1)  # numpy's cumsum is a sequential float64 sum along each row
    out = []
    for i, u in enumerate(us):
        target = u * float(cum[i, -1])
        idx = int(np.searchsorted(cum[i], target, side="right"))  # first j with cum[j] > target
        if idx >= cum.shape[1]:  # u * total rounded up to total: the last token with mass
            idx = int(np.flatnonzero(probs[i] > 0)[-1])
        out.append((idx, float(logp[i, idx])))
    return out


def greedy_index(logits: torch.Tensor) -> tuple[int, float]:
    """argmax (first maximal index, i.e. ties to the lowest id) and its unscaled logprob."""
    as64 = logits.detach().to("cpu", torch.float64)
    idx = int(torch.argmax(as64))
    return idx, float(torch.log_softmax(as64, dim=-1)[idx])


@dataclass
class Prefix:
    """A prompt run through the model once: its KV cache and the logits of its last position.
    Several completions of one prompt start from it (`generate(..., prefix=...)`) — the same
    operations as prefilling each time, so the same bits, done once."""

    prompt_ids: list[int]
    cache: Any  # transformers' DynamicCache
    logits: torch.Tensor

    def fork(self, rows: int = 1) -> Any:
        """An independent copy of the prefill's cache for `rows` completions (a [rows, ...]
        cache: the one prompt row repeated)."""
        cache = CausalLM.fork_cache(self.cache)
        if rows > 1:
            cache.batch_repeat_interleave(rows)
        return cache


def prefill(
    model: CausalLM, prompt_ids: list[int], steer: tuple[int, torch.Tensor] | None = None
) -> Prefix:
    if not prompt_ids:
        raise ValueError("generation needs a non-empty prompt")
    device = next(model.parameters()).device
    cache = model.new_cache()
    with torch.no_grad():
        ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
        logits = model(ids, kv_cache=cache, steer=steer)[0, -1]
    return Prefix(list(prompt_ids), cache, logits)


Draw = Callable[[int], float]


def check_request(max_new_tokens: int, temperature: float, draws: Sequence[Draw | None]) -> None:
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature > 0 and any(d is None for d in draws):
        raise ValueError("sampling at temperature > 0 needs a draw function")


def checked_draw(draw: Draw | None, position: int) -> float:
    assert draw is not None
    u = float(draw(position))
    if not 0.0 <= u < 1.0:
        raise ValueError(f"draw({position}) returned {u}, not a float in [0, 1)")
    return u


def pick_rows(
    table: torch.Tensor,
    rows: list[int],
    temperature: float,
    draws: Sequence[Draw | None],
    position: int,
) -> list[tuple[int, float]]:
    """The token at `position` of each of `rows` from their float64 logits in `table`: greedy, or
    sampled with `draws[r](position)`."""
    if temperature == 0:
        return [greedy_index(table[r]) for r in rows]
    us = [checked_draw(draws[r], position) for r in rows]
    return sample_rows(table[rows], temperature, us)


def generate(
    model: CausalLM,
    prompt_ids: list[int],
    max_new_tokens: int,
    temperature: float,
    draw: Draw | None = None,
    end_ids: Collection[int] = (),
    steer: tuple[int, torch.Tensor] | None = None,
    prefix: Prefix | None = None,
) -> GenerationResult:
    """Generate up to `max_new_tokens` tokens after `prompt_ids` with a KV cache (started from
    `prefix` when given: it must be the prefill of these `prompt_ids`)."""
    return generate_group(
        model, prompt_ids, max_new_tokens, temperature, [draw], end_ids, steer, prefix
    )[0]


def generate_group(
    model: CausalLM,
    prompt_ids: list[int],
    max_new_tokens: int,
    temperature: float,
    draws: Sequence[Draw | None],
    end_ids: Collection[int] = (),
    steer: tuple[int, torch.Tensor] | None = None,
    prefix: Prefix | None = None,
) -> list[GenerationResult]:
    """One completion per entry of `draws`, all of `prompt_ids`, decoded as one [len(draws), 1]
    batch (each row alone in batch-invariant mode); see the module docstring for what a row's
    bytes depend on."""
    if not prompt_ids:
        raise ValueError("generation needs a non-empty prompt")
    if not draws:
        raise ValueError("generation needs at least one row (one draw function per row)")
    check_request(max_new_tokens, temperature, draws)
    if max_new_tokens == 0:
        return [GenerationResult() for _ in draws]
    if prefix is None:
        prefix = prefill(model, prompt_ids, steer)
    elif prefix.prompt_ids != list(prompt_ids):
        raise ValueError("the prefix was made for another prompt")
    if model.batch_invariant and len(draws) > 1:
        return [
            decode_rows(model, prefix, max_new_tokens, temperature, [d], end_ids, steer)[0]
            for d in draws
        ]
    return decode_rows(model, prefix, max_new_tokens, temperature, draws, end_ids, steer)


def decode_rows(
    model: CausalLM,
    prefix: Prefix,
    max_new_tokens: int,
    temperature: float,
    draws: Sequence[Draw | None],
    end_ids: Collection[int],
    steer: tuple[int, torch.Tensor] | None,
) -> list[GenerationResult]:
    """The decode loop of `generate_group`: [G, 1] forwards until every row has stopped."""
    rows = len(draws)
    results = [GenerationResult() for _ in range(rows)]
    live = list(range(rows))
    last = [0] * rows  # the token each row is fed next (a finished row: its last one, again)
    stop = frozenset(end_ids)
    cache = prefix.fork(rows)
    table = prefix.logits.detach().to("cpu", torch.float64).unsqueeze(0).expand(rows, -1)
    with torch.no_grad():
        for position in range(max_new_tokens):
            for r, (token, logprob) in zip(
                list(live), pick_rows(table, live, temperature, draws, position), strict=True
            ):
                results[r].tokens.append(token)
                results[r].logprobs.append(logprob)
                last[r] = token
                if token in stop:
                    live.remove(r)
            if not live or position == max_new_tokens - 1:
                break
            step = torch.tensor(last, dtype=torch.long, device=prefix.logits.device).view(rows, 1)
            logits = model(step, kv_cache=cache, steer=steer)[:, -1]
            table = logits.to("cpu", torch.float64)
    return results


def generate_tokens(
    model: CausalLM,
    prompt_ids: list[int],
    max_new_tokens: int,
    temperature: float,
    draw: Callable[[int], float] | None = None,
    end_ids: Collection[int] = (),
) -> list[int]:
    """The generated tokens only (see `generate` for the logprobs)."""
    return generate(model, prompt_ids, max_new_tokens, temperature, draw, end_ids).tokens
