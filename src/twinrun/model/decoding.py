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

`generate_block` decodes the completions of a block of prompts (GRPO: several prompt groups) as
one batch: the block's prompts are prefilled together as one [P, W] forward, left-padded to the
longest (W) with the padded keys masked out and each row's position ids counting its real tokens
from 0; the cache is repeated for each prompt's G rows, and every later forward is a [P*G, 1]
batch of each row's last token (with the mask grown by one real key and the row's own position).
When the block's prompts all have the same length nothing is padded and no mask or position ids
are passed, so a block of one prompt is exactly `generate_group`'s decode. Row r draws its tokens
from its own `draws[r]`; a row stops at its end id while the others go on. A finished row consumes
no more draws; it is fed its last token again until the block ends and its outputs are thrown
away.

What a row's bytes depend on: its prompt, its own draws, the model (weights, precision,
attention, threads) and its block — the number of prompts and rows in it and their prompt
lengths (which set the batch shape and the left padding) — and nothing else: the forwards always
have shape [P*G, 1] whatever the rows sample or when they stop, and no operation of a decoder
forward mixes rows (a padded key is masked out of every query, so it adds exact zeros), so the
other rows' tokens never enter a row's arithmetic; only the shape and the padding do, through the
kernels' blocking (a reduction over W + t keys groups its terms differently from one over the
row's own length). A left-padded row therefore equals its unpadded decode to float32 rounding,
not bit for bit (on the toy model the tokens are the same and the logprobs agree to ~2e-7).
`generate_group` is the block of one prompt: a row depends on its prompt, its draws and G.
In batch-invariant mode (`model.batch_invariant`) every row is decoded alone ([1, 1] forwards
from its prompt's prefill), which is what `generate` does for one row: then a completion depends
neither on G nor on the block.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from twinrun.model.build import CausalLM
from twinrun.objectives import chunks


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


def last_only(ids: torch.Tensor) -> bool:
    """Whether a prefill of `ids` [P, W] makes its last position's logits alone: when the prompts
    are longer than one head chunk (`objectives.chunks.HEAD_CHUNK`), so a long prompt makes no
    [P, W, V] logits. A shorter prefill makes every position's logits as it always did: native
    BLAS may round the last row of a product of another height differently, and a short
    prompt's samples keep their bytes."""
    return ids.shape[1] > chunks.HEAD_CHUNK


def prefill(
    model: CausalLM, prompt_ids: list[int], steer: tuple[int, torch.Tensor] | None = None
) -> Prefix:
    if not prompt_ids:
        raise ValueError("generation needs a non-empty prompt")
    device = next(model.parameters()).device
    cache = model.new_cache()
    with torch.no_grad():
        ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)
        logits = model(ids, kv_cache=cache, steer=steer, last_only=last_only(ids))[0, -1]
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
    if prefix is None:
        return generate_block(
            model, [prompt_ids], max_new_tokens, temperature, [draws], end_ids, steer
        )[0]
    if not draws:
        raise ValueError("generation needs at least one row (one draw function per row)")
    check_request(max_new_tokens, temperature, draws)
    if prefix.prompt_ids != list(prompt_ids):
        raise ValueError("the prefix was made for another prompt")
    if max_new_tokens == 0:
        return [GenerationResult() for _ in draws]
    how = Decoding(max_new_tokens, temperature, end_ids, steer)
    return decode_from_prefix(model, prefix, draws, how)


@dataclass(frozen=True)
class Decoding:
    """What every row of one generation call shares: the most tokens to generate, the
    temperature (0: greedy), the tokens that end a row, and the steering (layer, vector)."""

    max_new_tokens: int
    temperature: float
    end_ids: Collection[int]
    steer: tuple[int, torch.Tensor] | None


def decode_from_prefix(
    model: CausalLM, prefix: Prefix, draws: Sequence[Draw | None], how: Decoding
) -> list[GenerationResult]:
    """The rows of one prompt from its prefill: together, or each alone in batch-invariant mode."""
    if model.batch_invariant and len(draws) > 1:
        return [decode_from_prefix(model, prefix, [d], how)[0] for d in draws]
    rows = len(draws)
    table = prefix.logits.detach().to("cpu", torch.float64).unsqueeze(0).expand(rows, -1)
    start = Start(prefix.fork(rows), table, None)
    return decode_rows(model, start, draws, how)


def generate_block(
    model: CausalLM,
    prompts: Sequence[list[int]],
    max_new_tokens: int,
    temperature: float,
    draws: Sequence[Sequence[Draw | None]],
    end_ids: Collection[int] = (),
    steer: tuple[int, torch.Tensor] | None = None,
) -> list[list[GenerationResult]]:
    """The completions of a block of prompts, `draws[p]` one draw function per row of prompt p
    (every prompt the same number of rows), decoded as one [P*G, 1] batch from one left-padded
    prefill; see the module docstring for what a row's bytes depend on. Returns the rows of each
    prompt, in order."""
    if not prompts:
        raise ValueError("generation needs at least one prompt")
    if len(draws) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but draw functions for {len(draws)}")
    if any(not p for p in prompts):
        raise ValueError("generation needs a non-empty prompt")
    if any(not d for d in draws):
        raise ValueError("generation needs at least one row (one draw function per row)")
    group = len(draws[0])
    if any(len(d) != group for d in draws):
        raise ValueError("every prompt of a block needs the same number of rows")
    flat = [d for row_draws in draws for d in row_draws]
    check_request(max_new_tokens, temperature, flat)
    if max_new_tokens == 0:
        return [[GenerationResult() for _ in d] for d in draws]
    how = Decoding(max_new_tokens, temperature, end_ids, steer)
    if model.batch_invariant:  # every row alone, from its own prompt's prefill
        return [
            decode_from_prefix(model, prefill(model, p, steer), d, how)
            for p, d in zip(prompts, draws, strict=True)
        ]
    start = prefill_block(model, prompts, group, steer)
    out = decode_rows(model, start, flat, how)
    return [out[i * group : (i + 1) * group] for i in range(len(prompts))]


@dataclass
class Start:
    """Where a batched decode starts: the cache with one row per completion, the float64 logits
    of each row's first token [rows, V], and for a left-padded block the key mask [rows, W] and
    each row's prompt length (None when every row has the same length: no mask, no position
    ids)."""

    cache: Any
    table: torch.Tensor
    padded: tuple[torch.Tensor, torch.Tensor] | None


def prefill_block(
    model: CausalLM,
    prompts: Sequence[list[int]],
    group: int,
    steer: tuple[int, torch.Tensor] | None,
) -> Start:
    """One [P, W] forward over the block's prompts, left-padded to the longest, its cache and
    last-position logits repeated for each prompt's `group` rows."""
    device = next(model.parameters()).device
    lengths = [len(p) for p in prompts]
    width = max(lengths)
    cache = model.new_cache()
    with torch.no_grad():
        if min(lengths) == width:
            ids = torch.tensor([list(p) for p in prompts], dtype=torch.long, device=device)
            logits = model(ids, kv_cache=cache, steer=steer, last_only=last_only(ids))[:, -1]
            padded = None
        else:
            ids = torch.zeros((len(prompts), width), dtype=torch.long)  # pad id 0: masked out
            mask = torch.zeros((len(prompts), width), dtype=torch.long)
            for i, p in enumerate(prompts):
                ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
                mask[i, width - len(p) :] = 1
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            logits = model(ids.to(device), mask.to(device), kv_cache=cache, steer=steer,
                           position_ids=positions.to(device),
                           last_only=last_only(ids))[:, -1]  # fmt: skip
            lens = torch.tensor(lengths, dtype=torch.long)
            padded = (mask.repeat_interleave(group, 0), lens.repeat_interleave(group, 0))
    if group > 1:
        cache.batch_repeat_interleave(group)
    table = logits.detach().to("cpu", torch.float64).repeat_interleave(group, 0)
    return Start(cache, table, padded)


def decode_rows(
    model: CausalLM, start: Start, draws: Sequence[Draw | None], how: Decoding
) -> list[GenerationResult]:
    """The decode loop: [rows, 1] forwards until every row has stopped."""
    max_new_tokens, temperature, steer = how.max_new_tokens, how.temperature, how.steer
    rows = len(draws)
    results = [GenerationResult() for _ in range(rows)]
    live = list(range(rows))
    last = [0] * rows  # the token each row is fed next (a finished row: its last one, again)
    stop = frozenset(how.end_ids)
    cache, table = start.cache, start.table
    device = next(model.parameters()).device
    mask = lengths = None
    if start.padded is not None:
        mask, lengths = start.padded
        mask, lengths = mask.to(device), lengths.to(device).view(rows, 1)
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
            step = torch.tensor(last, dtype=torch.long, device=device).view(rows, 1)
            if mask is None or lengths is None:
                logits = model(step, kv_cache=cache, steer=steer)[:, -1]
            else:  # token `position` of a row sits at its prompt length + position
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                logits = model(step, mask, kv_cache=cache, steer=steer,
                               position_ids=lengths + position)[:, -1]  # fmt: skip
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
