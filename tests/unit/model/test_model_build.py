"""The one model builder: transformers' model, bit for bit, plus twinrun's residual taps."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from twinrun.core.errors import ModelError
from twinrun.model.build import CausalLM, FreshLora, build_model, load_causal_lm
from twinrun.model.lora import lora_parameters

ROWS = [
    [256, 104, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 33],
    [256, 50, 43, 50, 61],
    [256, 7, 200, 255, 0, 13, 99, 42, 42],
]


@pytest.fixture(scope="module")
def model(toy_model_dir: Path) -> CausalLM:
    return load_causal_lm(toy_model_dir)


@pytest.fixture(scope="module")
def hf(toy_model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(toy_model_dir, attn_implementation="eager").eval()


def padded(rows: list[list[int]], pad: int = 258) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    return ids, mask


def test_weights_are_the_checkpoint_frozen_in_eval_mode(
    model: CausalLM, toy_model_dir: Path
) -> None:
    from safetensors.torch import load_file

    saved = load_file(str(toy_model_dir / "model.safetensors"))
    state = model.hf.state_dict()
    assert set(saved) <= set(state)
    for k, v in saved.items():
        assert torch.equal(state[k], v), k
    assert not any(p.requires_grad for p in model.parameters())
    assert not model.training
    assert model.hf.config._attn_implementation == "eager"
    assert (model.num_layers, model.hidden_size, model.model_type) == (4, 64, "llama")


def test_logits_are_transformers_bit_for_bit(model: CausalLM, hf: Any) -> None:
    ids, mask = padded(ROWS)
    with torch.no_grad():
        ours = model(ids, attention_mask=mask)
        theirs = hf(ids, attention_mask=mask).logits
    assert ours.dtype == torch.float32 and ours.shape == (3, len(ROWS[0]), 259)
    assert torch.equal(ours, theirs)
    assert torch.isfinite(ours).all(), "padded query positions must stay finite"


def test_right_padding_changes_no_real_position_much(model: CausalLM) -> None:
    ids, mask = padded(ROWS)
    with torch.no_grad():
        batch = model(ids, attention_mask=mask)
        for i, row in enumerate(ROWS):
            alone = model(torch.tensor([row]))[0]
            torch.testing.assert_close(batch[i, : len(row)], alone, atol=1e-5, rtol=0)


def test_hidden_states_are_transformers(model: CausalLM, hf: Any) -> None:
    ids = torch.tensor([ROWS[2]])
    with torch.no_grad():
        out = hf(ids, output_hidden_states=True)
        n = model.num_layers
        for layer in range(n):
            assert torch.equal(model.hidden_states_at(ids, layer), out.hidden_states[layer])
        last = model.hidden_states_at(ids, n)  # pre-norm; HF's last entry is after the norm
        assert torch.equal(model.final_norm()(last), out.hidden_states[n])
        res = model.run(ids, hidden_layer=2)
        assert torch.equal(res.logits, out.logits)
        final = model.last_hidden(ids, torch.ones_like(ids))
        assert torch.equal(final, out.hidden_states[n])
    with pytest.raises(ValueError):
        model.hidden_states_at(ids, n + 1)


def test_steering_adds_to_residual(model: CausalLM) -> None:
    ids = torch.tensor([ROWS[1]])
    with torch.no_grad():
        base = model.run(ids, hidden_layer=2)
        zero = model.run(ids, hidden_layer=2, steer=(2, torch.zeros(64)))
        assert torch.equal(base.logits, zero.logits)
        vec = torch.full((64,), 0.5)
        steered = model.run(ids, hidden_layer=2, steer=(2, vec))
        assert base.hidden is not None and steered.hidden is not None
        torch.testing.assert_close(steered.hidden, base.hidden + vec)
        assert not torch.allclose(steered.logits, base.logits)
        early = model.run(ids, hidden_layer=1, steer=(0, vec))
        assert early.hidden is not None and not torch.allclose(early.hidden, base.hidden)
        again = model.run(ids, hidden_layer=2)  # the taps are removed after each forward
        assert torch.equal(again.logits, base.logits)


def test_kv_cache_matches_full_forward(model: CausalLM) -> None:
    row = ROWS[0]
    with torch.no_grad():
        full = model(torch.tensor([row]))[0]
        cache = model.new_cache()
        parts = [model(torch.tensor([row[:5]]), kv_cache=cache)[0]]
        forked = model.fork_cache(cache)
        for tok in row[5:]:
            parts.append(model(torch.tensor([[tok]]), kv_cache=cache)[0])
    assert cache.get_seq_length() == len(row)
    assert forked.get_seq_length() == 5
    torch.testing.assert_close(torch.cat(parts), full, atol=1e-5, rtol=0)


def test_bf16_policy(toy_model_dir: Path, model: CausalLM) -> None:
    m = load_causal_lm(toy_model_dir, precision="bf16")
    assert m.hf.lm_head.weight.dtype == torch.bfloat16
    ids = torch.tensor([ROWS[0]])
    with torch.no_grad():
        low, full = m(ids), model(ids)
    assert low.dtype == torch.float32
    assert 0 < (low - full).abs().max() < 0.05
    with pytest.raises(ModelError, match="precision"):
        load_causal_lm(toy_model_dir, precision="fp8")
    with pytest.raises(ModelError, match="attention"):
        load_causal_lm(toy_model_dir, attention="flash")


def test_sdpa_is_recorded_and_close(toy_model_dir: Path, model: CausalLM) -> None:
    m = load_causal_lm(toy_model_dir, attention="sdpa")
    assert m.hf.config._attn_implementation == "sdpa" and m.attention == "sdpa"
    ids, mask = padded(ROWS)
    with torch.no_grad():
        torch.testing.assert_close(m(ids, mask), model(ids, mask), atol=1e-5, rtol=0)


def test_gradient_checkpointing_same_grads(toy_model_dir: Path) -> None:
    ids = torch.tensor([ROWS[1]])
    grads = []
    for ckpt in (False, True):
        m = build_model(
            toy_model_dir,
            precision="f32",
            device="cpu",
            lora=FreshLora(4, 8.0, 0),
            gradient_checkpointing=ckpt,
        )
        assert m.training == ckpt
        with torch.no_grad():  # B non-zero: A's gradient flows through it (zero B gives zeros)
            for i, (_, p) in enumerate(lora_parameters(m)):
                if p.abs().sum() == 0:
                    p.copy_(torch.linspace(-0.5, 0.5, p.numel()).view_as(p) * (1 + i % 3))
        m(ids).sum().backward()
        q = m.get_submodule("model.layers.1.self_attn.q_proj")
        w = q.lora_A.weight
        assert w.grad is not None and w.grad.abs().sum() > 0
        grads.append(torch.cat([w.grad.flatten(), q.lora_B.weight.grad.flatten()]))
    assert torch.equal(grads[0], grads[1])


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_load_errors(tmp_path: Path, toy_model_dir: Path) -> None:
    with pytest.raises(ModelError, match="does not exist"):
        load_causal_lm(tmp_path / "nope")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelError, match="no config.json") as info:
        load_causal_lm(empty)
    assert info.value.hint
    cfg = json.loads((toy_model_dir / "config.json").read_text())
    encoder = _copy(toy_model_dir, tmp_path / "vit")
    (encoder / "config.json").write_text(json.dumps({**cfg, "model_type": "vit"}))
    with pytest.raises(ModelError, match="not a causal language model"):
        load_causal_lm(encoder)
    unknown = _copy(toy_model_dir, tmp_path / "unknown")
    (unknown / "config.json").write_text(json.dumps({**cfg, "model_type": "no-such-arch"}))
    with pytest.raises(ModelError, match="not a causal language model"):
        load_causal_lm(unknown)
    noweights = _copy(toy_model_dir, tmp_path / "noweights")
    (noweights / "model.safetensors").unlink()
    with pytest.raises(ModelError, match="no safetensors"):
        load_causal_lm(noweights)
    pickled = _copy(toy_model_dir, tmp_path / "pickled")
    (pickled / "model.safetensors").rename(pickled / "pytorch_model.bin")
    with pytest.raises(ModelError, match="pickle weights only") as info:
        load_causal_lm(pickled)
    assert "save_pretrained" in (info.value.hint or "")
    bad = _copy(toy_model_dir, tmp_path / "bad")
    (bad / "config.json").write_text(json.dumps({**cfg, "hidden_size": 32}))
    with pytest.raises(ModelError, match="cannot load"):
        load_causal_lm(bad)
    garbled = _copy(toy_model_dir, tmp_path / "garbled")
    (garbled / "config.json").write_text("{not json")
    with pytest.raises(ModelError, match="cannot read"):
        load_causal_lm(garbled)


@pytest.mark.gpu
def test_cuda_matches_cpu(toy_model_dir: Path, model: CausalLM) -> None:
    m = load_causal_lm(toy_model_dir, device="cuda:0")
    ids, mask = padded(ROWS)
    with torch.no_grad():
        got = m(ids.cuda(), attention_mask=mask.cuda()).cpu()
        want = model(ids, attention_mask=mask)
    for i, row in enumerate(ROWS):
        torch.testing.assert_close(got[i, : len(row)], want[i, : len(row)], atol=1e-4, rtol=0)
