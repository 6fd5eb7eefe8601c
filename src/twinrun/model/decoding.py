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
"""

from __future__ import annotations

from collections.abc import Callable, Collection
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
    scaled = logits.detach().to("cpu", torch.float64) / temperature
    logp = torch.log_softmax(scaled, dim=-1)
    probs = torch.softmax(scaled, dim=-1).numpy()
    cum = np.cumsum(probs)  # numpy's 1-D cumsum is a sequential float64 sum
    target = u * float(cum[-1])
    idx = int(np.searchsorted(cum, target, side="right"))  # first i with cum[i] > target
    if idx >= len(cum):  # u * total rounded up to total: the last token with mass
        idx = int(np.flatnonzero(probs > 0)[-1])
    return idx, float(logp[idx])


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

    def fork(self) -> Any:
        """An independent copy of the prefill's cache, to extend with one completion."""
        return CausalLM.fork_cache(self.cache)


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


def generate(
    model: CausalLM,
    prompt_ids: list[int],
    max_new_tokens: int,
    temperature: float,
    draw: Callable[[int], float] | None = None,
    end_ids: Collection[int] = (),
    steer: tuple[int, torch.Tensor] | None = None,
    prefix: Prefix | None = None,
) -> GenerationResult:
    """Generate up to `max_new_tokens` tokens after `prompt_ids` with a KV cache (started from
    `prefix` when given: it must be the prefill of these `prompt_ids`)."""
    if not prompt_ids:
        raise ValueError("generation needs a non-empty prompt")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature > 0 and draw is None:
        raise ValueError("sampling at temperature > 0 needs a draw function")
    result = GenerationResult()
    if max_new_tokens == 0:
        return result
    device = next(model.parameters()).device
    if prefix is None:
        prefix = prefill(model, prompt_ids, steer)
    elif prefix.prompt_ids != list(prompt_ids):
        raise ValueError("the prefix was made for another prompt")
    cache, logits = prefix.fork(), prefix.logits
    stop = frozenset(end_ids)
    with torch.no_grad():
        for position in range(max_new_tokens):
            if temperature == 0:
                token, logprob = greedy_index(logits)
            else:
                assert draw is not None
                u = float(draw(position))
                if not 0.0 <= u < 1.0:
                    raise ValueError(f"draw({position}) returned {u}, not a float in [0, 1)")
                token, logprob = sample_index(logits, temperature, u)
            result.tokens.append(token)
            result.logprobs.append(logprob)
            if token in stop or position == max_new_tokens - 1:
                break
            step = torch.tensor([[token]], dtype=torch.long, device=device)
            logits = model(step, kv_cache=cache, steer=steer)[0, -1]
    return result


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
