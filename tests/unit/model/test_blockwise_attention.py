"""`twinrun.model.blockwise` (`--attention blockwise`): within float tolerance of the eager
attention (output and gradients, right padding, GQA, several blocks, a KV cache); the same bits
at 1 and 2 threads and for a row alone or inside a right-padded batch (portable kernels); the
chunked output layer + loss of the long-row mode is the whole one's bits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from twinrun.core.errors import ModelError
from twinrun.model import blockwise
from twinrun.model.blockwise import BLOCK, BlockwiseMask, blockwise_attention, blockwise_mask

B, HQ, HK, D = 3, 9, 3, 16  # SmolLM2's grouping: 9 query heads over 3 key/value heads
LENGTHS = (2 * BLOCK + 44, BLOCK + 5, 37)  # several blocks, a partial one, one short row
T = max(LENGTHS)


class _Heads(nn.Module):
    num_key_value_groups = HQ // HK


def _inputs(seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, HQ, T, D, generator=g).requires_grad_()
    k = torch.randn(B, HK, T, D, generator=g).requires_grad_()
    v = torch.randn(B, HK, T, D, generator=g).requires_grad_()
    return q, k, v


def _keys() -> torch.Tensor:
    keys = torch.zeros(B, T, dtype=torch.bool)
    for row, n in enumerate(LENGTHS):
        keys[row, :n] = True
    return keys


def _upstream(out: torch.Tensor) -> torch.Tensor:
    """A fixed gradient for `out` [B, T, H, d], a function of (position, head, channel) only."""
    b, t, h, d = out.shape
    return (
        torch.cos(torch.arange(t * h * d, dtype=out.dtype)).view(1, t, h, d).expand(b, -1, -1, -1)
    )


def _run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor | None) -> Any:
    """(output, gradients of q, k, v) for a fixed upstream gradient at the real positions."""
    mask = BlockwiseMask(keys, 0) if keys is not None else None
    out, _ = blockwise_attention(_Heads(), q, k, v, mask, scaling=D**-0.5)
    up = _upstream(out)
    if keys is not None:
        up = up * keys[:, :, None, None]
    return (out, *torch.autograd.grad(out, (q, k, v), up))


def test_within_float_tolerance_of_eager_with_padding_and_gqa() -> None:
    from transformers.models.llama.modeling_llama import eager_attention_forward

    q, k, v = _inputs()
    keys = _keys()
    visible = torch.ones(T, T, dtype=torch.bool).tril()[None] & keys[:, None, :]
    additive = torch.zeros(B, 1, T, T).masked_fill(
        ~visible[:, None], torch.finfo(torch.float32).min
    )
    out, *grads = _run(q, k, v, keys)
    ref, _ = eager_attention_forward(_Heads(), q, k, v, additive, scaling=D**-0.5)
    up = _upstream(ref) * keys[:, :, None, None]
    ref_grads = torch.autograd.grad(ref, (q, k, v), up)
    live = keys[:, :, None, None]
    torch.testing.assert_close(out * live, ref * live, rtol=0, atol=1e-5)
    assert torch.all(out[~keys] == 0)  # a padded query's output is zero
    q_live, kv_live = keys[:, None, :, None], keys[:, None, :, None]
    for got, want, where in zip(grads, ref_grads, (q_live, kv_live, kv_live), strict=True):
        torch.testing.assert_close(got * where, want * where, rtol=0, atol=2e-5)


def test_without_a_mask_is_causal_attention() -> None:
    from transformers.models.llama.modeling_llama import eager_attention_forward

    q, k, v = (x[:1].detach() for x in _inputs(1))
    causal = torch.zeros(T, T).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), -1e30)
    out, _ = blockwise_attention(_Heads(), q, k, v, None, scaling=D**-0.5)
    ref, _ = eager_attention_forward(_Heads(), q, k, v, causal[None, None], scaling=D**-0.5)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)


def test_the_same_bits_at_one_and_two_threads(portable: None) -> None:
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            results.append(_run(*_inputs(), _keys()))
    finally:
        torch.set_num_threads(before)
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)


def test_a_row_alone_has_its_bits_inside_a_padded_batch(portable: None) -> None:
    q, k, v = _inputs()
    batch = _run(q, k, v, _keys())
    for row, n in enumerate(LENGTHS):
        alone_inputs = [
            x[row : row + 1, :, :n].detach().clone().requires_grad_() for x in (q, k, v)
        ]
        alone = _run(*alone_inputs, None)
        assert torch.equal(alone[0][0], batch[0][row, :n])  # output [T, H, d]
        for a, b in zip(alone[1:], batch[1:], strict=True):  # gradients [H, T, d]
            assert torch.equal(a[0], b[row, :, :n])
            assert torch.all(b[row, :, n:] == 0)  # nothing reaches the padding


def test_the_mask_hook_keeps_the_padding_and_refuses_other_masks() -> None:
    from transformers.masking_utils import causal_mask_function, sliding_window_causal_mask_function

    keys = _keys().long()
    mask = blockwise_mask(B, 1, T, q_offset=T - 1, mask_function=causal_mask_function,
                          attention_mask=keys)  # fmt: skip
    assert mask.offset == T - 1 and torch.equal(mask.keys, keys.bool())
    with pytest.raises(ModelError, match="causal full attention only"):
        blockwise_mask(B, T, T, mask_function=sliding_window_causal_mask_function(8))
    with pytest.raises(ModelError, match="prepared attention mask"):
        blockwise_attention(_Heads(), *_inputs(), torch.zeros(B, 1, T, T), scaling=1.0)


@pytest.fixture(scope="module")
def models(toy_model_dir: Path) -> dict[str, Any]:
    from twinrun.model.build import load_causal_lm

    return {a: load_causal_lm(toy_model_dir, attention=a) for a in ("eager", "blockwise")}


def _batch() -> tuple[torch.Tensor, torch.Tensor, tuple[int, ...]]:
    lengths = (BLOCK + 30, 61, 9)
    ids = torch.remainder(torch.arange(3 * (BLOCK + 30)).view(3, -1) * 7919, 256)
    attn = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        attn[row, :n] = 1
    return ids, attn, lengths


def test_the_toy_model_matches_eager_and_a_row_alone_its_batch_bits(
    models: dict[str, Any], portable: None
) -> None:
    ids, attn, lengths = _batch()
    assert models["blockwise"].config._attn_implementation == "blockwise"
    with torch.no_grad():
        got = models["blockwise"](ids, attn)
        ref = models["eager"](ids, attn)
        live = attn.bool()
        torch.testing.assert_close(got[live], ref[live], rtol=0, atol=1e-4)
        for row, n in enumerate(lengths):
            alone = models["blockwise"](ids[row : row + 1, :n], attn[row : row + 1, :n])
            assert torch.equal(alone[0], got[row, :n])


def test_a_kv_cached_decode_matches_eager(models: dict[str, Any]) -> None:
    ids = torch.remainder(torch.arange(2 * 40).view(2, 40) * 31, 256)
    attn = torch.ones_like(ids)
    attn[0, :5] = 0  # left padding, as block decoding has
    positions = (attn.cumsum(1) - 1).clamp(min=0)
    outs = {}
    with torch.no_grad():
        for name, model in models.items():
            cache = model.new_cache()
            model(ids[:, :-1], attn[:, :-1], kv_cache=cache, position_ids=positions[:, :-1])
            outs[name] = model(ids[:, -1:], attn, kv_cache=cache, position_ids=positions[:, -1:])
    torch.testing.assert_close(outs["blockwise"], outs["eager"], rtol=0, atol=1e-4)


def test_the_chunked_head_and_loss_is_the_whole_ones_bits(
    models: dict[str, Any], portable: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from twinrun.objectives import chunks, sft

    monkeypatch.setattr(chunks, "HEAD_CHUNK", 16)  # several chunks and a partial one
    model = models["blockwise"]
    assert model.chunked_head
    ids, attn, _ = _batch()
    loss_mask = attn.clone()
    loss_mask[:, :5] = 0
    hidden = model.last_hidden(ids, attn).detach().requires_grad_()
    head = model.hf.get_output_embeddings()
    for invariant in (False, True):
        whole, _ = sft.completion_nll(head(hidden), ids, loss_mask, invariant)
        (g_whole,) = torch.autograd.grad(whole.sum(), hidden)
        chunked, _ = sft.chunked_completion_nll(hidden, head, ids, loss_mask, invariant)
        (g_chunked,) = torch.autograd.grad(chunked.sum(), hidden)
        assert torch.equal(chunked, whole) and torch.equal(g_chunked, g_whole)


def test_registered_once_under_its_name() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    blockwise.register()
    assert AttentionInterface._global_mapping["blockwise"] is blockwise_attention
    assert AttentionMaskInterface._global_mapping["blockwise"] is blockwise_mask
