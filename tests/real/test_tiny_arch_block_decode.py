"""Block decoding on every architecture: prompts of unequal lengths, left-padded into one batch
with their own position ids, give each row the tokens of its prompt decoded alone and logprobs
equal to float32 rounding (a wrong position or an unmasked pad moves them by far more)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.real.tiny_archs import ARCHITECTURES
from twinrun.core.rng import stream
from twinrun.model.build import load_causal_lm
from twinrun.model.decoding import generate_block, generate_group
from twinrun.model.tokens import load_tokenizer

pytestmark = pytest.mark.real

QUESTIONS = ("Hi", "What is the capital of France? Answer in one word.", "What is 12 + 30?")


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_left_padded_block_matches_each_prompt_alone(
    arch: str, tiny_arch_dir: Callable[[str], Path]
) -> None:
    path = tiny_arch_dir(arch)
    model, tok = load_causal_lm(path), load_tokenizer(path)
    prompts = [tok.prompt_ids([{"role": "user", "content": q}], True) for q in QUESTIONS]
    assert len({len(p) for p in prompts}) == 3  # every row but the longest is left-padded
    draws = [[lambda i, k=k, p=p: stream(2, "sample", 0, p, k, i).uniform() for k in range(2)]
             for p in range(3)]  # fmt: skip
    block = generate_block(model, prompts, 5, 1.0, draws, end_ids=tok.end_ids)
    for prompt, rows, row_draws in zip(prompts, block, draws, strict=True):
        alone = generate_group(model, prompt, 5, 1.0, row_draws, end_ids=tok.end_ids)
        for b, a in zip(rows, alone, strict=True):
            assert b.tokens == a.tokens
            assert max(abs(x - y) for x, y in zip(b.logprobs, a.logprobs, strict=True)) < 1e-4
