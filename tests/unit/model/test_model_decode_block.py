"""Block decoding: the prompt groups of a block decoded as one left-padded batch. A row depends on
its prompt, its draws and its block (never on the other rows' draws or when they stop); a block
of one prompt is the group decode; a left-padded row equals its unpadded decode to float32
rounding (same tokens, logprobs within 1e-5), not bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from twinrun.core.rng import stream
from twinrun.model.build import CausalLM, load_causal_lm
from twinrun.model.decoding import (
    GenerationResult,
    generate,
    generate_block,
    generate_group,
    prefill,
)

SHORT = [256, *b"Hi"]  # 3 tokens: left-padded by 17 in a block with LONG
MID = [256, *b"What is 4 + 4?"]  # 15 tokens
LONG = [256, *b"What is 123 + 4567?"]  # 20 tokens
BLOCK = [SHORT, LONG, MID]


@pytest.fixture(scope="module")
def twin(toy_model_dir: Path) -> CausalLM:
    return load_causal_lm(toy_model_dir)


def draws(seed: int, prompt: int, rows: int = 3):  # noqa: ANN201 - draw functions
    return [lambda i, k=k: stream(seed, "sample", 0, prompt, k, i).uniform() for k in range(rows)]


def block_draws(seed: int) -> list:
    return [draws(seed, p) for p in range(len(BLOCK))]


def as_pairs(results: list[GenerationResult]) -> list[tuple[list[int], list[float]]]:
    return [(r.tokens, r.logprobs) for r in results]


def test_a_row_does_not_depend_on_the_other_rows_of_its_block(twin: CausalLM) -> None:
    """Another prompt's draws replaced: every row of the other prompts keeps its bits."""
    base = generate_block(twin, BLOCK, 12, 1.0, block_draws(5))
    other = generate_block(twin, BLOCK, 12, 1.0, [draws(5, 0), draws(6, 1), draws(5, 2)])
    assert [r.tokens for r in base[1]] != [r.tokens for r in other[1]]
    assert as_pairs(base[0]) == as_pairs(other[0])
    assert as_pairs(base[2]) == as_pairs(other[2])
    assert len({tuple(r.tokens) for rows in base for r in rows}) == 9  # the rows really sample


def test_rows_stop_at_their_end_id_while_the_others_go_on(twin: CausalLM) -> None:
    """With an end id, each row of the block is its unstopped completion cut after the first end
    id; the rows that never emit it run to max_new_tokens."""
    free = generate_block(twin, BLOCK, 12, 1.0, block_draws(5))
    end = free[0][0].tokens[1]  # the short prompt's row 0 ends at position 1 (or earlier)
    stopped = generate_block(twin, BLOCK, 12, 1.0, block_draws(5), end_ids={end})
    cut = []
    for f_rows, s_rows in zip(free, stopped, strict=True):
        for f, s in zip(f_rows, s_rows, strict=True):
            n = f.tokens.index(end) + 1 if end in f.tokens else len(f.tokens)
            assert (s.tokens, s.logprobs) == (f.tokens[:n], f.logprobs[:n])
            cut.append(n)
    assert cut[0] <= 2 and max(cut) == 12


def test_a_block_of_one_prompt_is_the_decode_from_its_prefill(twin: CausalLM) -> None:
    """The block path (no padding for one prompt) and the decode from a separate prefill agree
    bit for bit."""
    block = generate_block(twin, [MID], 10, 1.0, [draws(5, 0)])[0]
    from_prefix = generate_group(twin, MID, 10, 1.0, draws(5, 0), prefix=prefill(twin, MID))
    assert as_pairs(block) == as_pairs(from_prefix)


def test_a_left_padded_row_matches_its_unpadded_decode(twin: CausalLM) -> None:
    """Same tokens; logprobs to float32 rounding (the padded keys change the reductions' blocking,
    so bit-equality is not promised); each logprob is the float64 log_softmax of a full,
    unpadded forward of the row's own tokens."""
    block = generate_block(twin, BLOCK, 12, 1.0, block_draws(5))
    for p, prompt in enumerate(BLOCK):
        alone = generate_group(twin, prompt, 12, 1.0, draws(5, p))
        for b, a in zip(block[p], alone, strict=True):
            assert b.tokens == a.tokens
            assert max(abs(x - y) for x, y in zip(b.logprobs, a.logprobs, strict=True)) < 1e-5
            ids = torch.tensor([prompt + b.tokens])
            with torch.no_grad():
                logits = twin(ids)[0, len(prompt) - 1 : -1].double()
            want = torch.log_softmax(logits, -1).gather(-1, torch.tensor(b.tokens)[:, None])[:, 0]
            assert torch.allclose(torch.tensor(b.logprobs, dtype=torch.float64), want, atol=1e-5)


def test_batch_invariant_mode_decodes_each_row_alone(twin: CausalLM) -> None:
    twin.batch_invariant = True
    try:
        block = generate_block(twin, BLOCK, 8, 1.0, block_draws(5))
        alone = [[generate(twin, p, 8, 1.0, draw=d) for d in draws(5, i)]
                 for i, p in enumerate(BLOCK)]  # fmt: skip
    finally:
        twin.batch_invariant = False
    assert [as_pairs(rows) for rows in block] == [as_pairs(rows) for rows in alone]


def test_greedy_block_and_zero_tokens(twin: CausalLM) -> None:
    rows = generate_block(twin, [SHORT, LONG], 6, 0.0, [[None, None], [None, None]])
    assert rows[0][0].tokens == rows[0][1].tokens == generate(twin, SHORT, 6, 0.0).tokens
    assert rows[1][0].tokens == generate(twin, LONG, 6, 0.0).tokens
    empty = generate_block(twin, [SHORT, LONG], 0, 1.0, [draws(1, 0, 2), draws(1, 1, 2)])
    assert [as_pairs(r) for r in empty] == [[([], []), ([], [])]] * 2


@pytest.mark.parametrize(
    ("prompts", "rows", "match"),
    [
        ([], [], "at least one prompt"),
        ([SHORT, LONG], [draws(1, 0)], "2 prompts but draw functions for 1"),
        ([SHORT, []], [draws(1, 0), draws(1, 1)], "non-empty prompt"),
        ([SHORT, LONG], [draws(1, 0), []], "at least one row"),
        ([SHORT, LONG], [draws(1, 0, 2), draws(1, 1, 3)], "the same number of rows"),
        ([SHORT], [[None]], "needs a draw function"),
    ],
)
def test_bad_blocks_are_clear_errors(twin: CausalLM, prompts: list, rows: list, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        generate_block(twin, prompts, 4, 1.0, rows)


def test_position_ids_must_fit_the_ids(twin: CausalLM) -> None:
    ids = torch.tensor([MID])
    with pytest.raises(ValueError, match="position_ids must have the shape of input_ids"):
        twin(ids, position_ids=torch.arange(3).view(1, 3))
