"""KV-cached generation: greedy equals transformers, sampling is a pure function of the draws."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from twinrun.core.rng import stream
from twinrun.model.build import CausalLM, load_causal_lm
from twinrun.model.decoding import generate, generate_tokens, greedy_index, sample_index
from twinrun.model.toy import EOS_ID

PROMPT = [256, 60, 124, 117, 115, 101, 114, 124, 62, 10, 104, 105]


@pytest.fixture(scope="module")
def twin(toy_model_dir: Path) -> CausalLM:
    return load_causal_lm(toy_model_dir)


def seeded(seed: int):  # noqa: ANN201 - a draw function
    return lambda position: stream(seed, "sample", 0, 0, 0, position).uniform()


def test_greedy_matches_hf_generate(twin: CausalLM, toy_model_dir: Path) -> None:
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(toy_model_dir, attn_implementation="eager").eval()
    ids = torch.tensor([PROMPT])
    out = hf.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=16,
        eos_token_id=EOS_ID,
        pad_token_id=258,
    )
    want = out[0, len(PROMPT) :].tolist()
    got = generate_tokens(twin, PROMPT, 16, temperature=0.0, end_ids=(EOS_ID,))
    assert got == want
    assert len(got) >= 1


def test_cached_logits_equal_full_recompute(twin: CausalLM) -> None:
    res = generate(twin, PROMPT, 10, temperature=1.0, draw=seeded(4))
    seq = PROMPT + res.tokens
    with torch.no_grad():
        full = twin(torch.tensor([seq]))[0].double()
    for i, (tok, lp) in enumerate(zip(res.tokens, res.logprobs, strict=True)):
        want = torch.log_softmax(full[len(PROMPT) - 1 + i], dim=-1)[tok].item()
        assert abs(lp - want) < 1e-5


def test_sampling_is_a_function_of_the_draws(twin: CausalLM) -> None:
    a = generate(twin, PROMPT, 12, temperature=1.0, draw=seeded(1))
    b = generate(twin, PROMPT, 12, temperature=1.0, draw=seeded(1))
    assert a == b
    others = [generate(twin, PROMPT, 12, 1.0, draw=seeded(s)).tokens for s in range(2, 6)]
    assert any(o != a.tokens for o in others)
    assert all(isinstance(x, float) and x <= 0 for x in a.logprobs)
    hot = generate(twin, PROMPT, 12, temperature=0.5, draw=seeded(1))
    assert len(hot.logprobs) == len(hot.tokens)


def test_stops_after_eos_and_respects_limits(twin: CausalLM) -> None:
    greedy = generate_tokens(twin, PROMPT, 5, temperature=0.0)
    assert len(greedy) == 5
    assert generate_tokens(twin, PROMPT, 5, 0.0, end_ids=(greedy[0],)) == greedy[:1]
    assert generate_tokens(twin, PROMPT, 0, 0.0) == []
    with pytest.raises(ValueError):
        generate_tokens(twin, PROMPT, 3, temperature=1.0)  # no draw function
    with pytest.raises(ValueError):
        generate_tokens(twin, [], 3, temperature=0.0)
    with pytest.raises(ValueError):
        generate_tokens(twin, PROMPT, 3, temperature=1.0, draw=lambda _: 1.0)


def test_sample_index_rule() -> None:
    logits = torch.tensor(
        [0.0, math.log(3.0), -math.inf, 0.0], dtype=torch.float64
    )  # probs 1/5, 3/5, 0, 1/5
    assert sample_index(logits, 1.0, 0.0)[0] == 0
    assert sample_index(logits, 1.0, 0.19)[0] == 0
    assert sample_index(logits, 1.0, 0.21)[0] == 1
    assert sample_index(logits, 1.0, 0.79)[0] == 1
    assert sample_index(logits, 1.0, 0.81)[0] == 3
    assert sample_index(logits, 1.0, 1.0 - 2.0**-53)[0] == 3
    tok, lp = sample_index(logits, 1.0, 0.5)
    assert tok == 1 and abs(lp - math.log(0.6)) < 1e-12
    assert greedy_index(torch.tensor([1.0, 3.0, 3.0, 2.0]))[0] == 1  # ties to the lowest id


def test_prefix_reuse_gives_the_same_bits(toy_model_dir) -> None:  # type: ignore[no-untyped-def]
    """Completions started from a shared prefill equal completions that prefill themselves."""
    from twinrun.core.rng import stream
    from twinrun.model.build import load_causal_lm
    from twinrun.model.decoding import generate, prefill

    model = load_causal_lm(toy_model_dir)
    prompt = [256, *b"What is 4 + 4?"]
    shared = prefill(model, prompt)
    for k in range(3):

        def draw(i: int, k: int = k) -> float:
            return stream(5, "sample", 0, 1, k, i).uniform()

        alone = generate(model, prompt, 8, 1.0, draw=draw)
        forked = generate(model, prompt, 8, 1.0, draw=draw, prefix=shared)
        assert alone.tokens == forked.tokens and alone.logprobs == forked.logprobs
