"""twinrun's pure-torch Llama against transformers' eager LlamaForCausalLM on the toy model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from twinrun.core.errors import ModelError
from twinrun.model.llama import TwinLlama, load_base_model

ATOL = 1e-5
ROWS = [
    [256, 104, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 33],
    [256, 50, 43, 50, 61],
    [256, 7, 200, 255, 0, 13, 99, 42, 42],
]


@pytest.fixture(scope="module")
def twin(toy_model_dir: Path) -> TwinLlama:
    return load_base_model(toy_model_dir)


@pytest.fixture(scope="module")
def hf(toy_model_dir: Path) -> Any:
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(toy_model_dir, attn_implementation="eager").eval()


def padded(rows: list[list[int]], pad: int = 258) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    return ids, mask


def test_state_dict_keys_match_checkpoint(twin: TwinLlama, toy_model_dir: Path) -> None:
    from safetensors.torch import load_file

    saved = load_file(str(toy_model_dir / "model.safetensors"))
    assert set(twin.state_dict()) == set(saved)
    for k, v in twin.state_dict().items():
        assert torch.equal(v, saved[k]), k
    assert not any(p.requires_grad for p in twin.parameters())
    assert not twin.training


def test_single_row_matches_hf(twin: TwinLlama, hf: Any) -> None:
    ids = torch.tensor([ROWS[0]])
    with torch.no_grad():
        ours, theirs = twin(ids), hf(ids).logits
    assert ours.dtype == torch.float32 and ours.shape == (1, len(ROWS[0]), 259)
    torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0)


def test_padded_batch_matches_hf_and_rows_alone(twin: TwinLlama, hf: Any) -> None:
    ids, mask = padded(ROWS)
    with torch.no_grad():
        ours = twin(ids, attention_mask=mask)
        theirs = hf(ids, attention_mask=mask).logits
        for i, row in enumerate(ROWS):
            n = len(row)
            torch.testing.assert_close(ours[i, :n], theirs[i, :n], atol=ATOL, rtol=0)
            alone = twin(torch.tensor([row]))[0]
            torch.testing.assert_close(ours[i, :n], alone, atol=ATOL, rtol=0)
    assert torch.isfinite(ours).all(), "padded query positions must stay finite"


def test_hidden_states_match_hf(twin: TwinLlama, hf: Any) -> None:
    ids = torch.tensor([ROWS[2]])
    with torch.no_grad():
        out = hf(ids, output_hidden_states=True)
        n = twin.num_layers
        for layer in range(n):
            got = twin.hidden_states_at(ids, layer)
            torch.testing.assert_close(got, out.hidden_states[layer], atol=ATOL, rtol=0)
        last = twin.hidden_states_at(ids, n)  # pre-norm; HF's last entry is after the norm
        torch.testing.assert_close(twin.model.norm(last), out.hidden_states[n], atol=ATOL, rtol=0)
        res = twin.run(ids, hidden_layer=2)
        torch.testing.assert_close(res.logits, out.logits, atol=ATOL, rtol=0)
    with pytest.raises(ValueError):
        twin.hidden_states_at(ids, n + 1)


def test_steering_adds_to_residual(twin: TwinLlama) -> None:
    ids = torch.tensor([ROWS[1]])
    with torch.no_grad():
        base = twin.run(ids, hidden_layer=2)
        zero = twin.run(ids, hidden_layer=2, steer=(2, torch.zeros(64)))
        assert torch.equal(base.logits, zero.logits)
        vec = torch.full((64,), 0.5)
        steered = twin.run(ids, hidden_layer=2, steer=(2, vec))
        assert base.hidden is not None and steered.hidden is not None
        torch.testing.assert_close(steered.hidden, base.hidden + vec)
        assert not torch.allclose(steered.logits, base.logits)
        # steering the first layer's input changes the stream seen at layer 1 onward
        early = twin.run(ids, hidden_layer=1, steer=(0, vec))
        assert early.hidden is not None and not torch.allclose(early.hidden, base.hidden)


def test_kv_cache_matches_full_forward(twin: TwinLlama) -> None:
    row = ROWS[0]
    with torch.no_grad():
        full = twin(torch.tensor([row]))[0]
        cache = twin.new_cache()
        parts = [twin(torch.tensor([row[:5]]), kv_cache=cache)[0]]
        for tok in row[5:]:
            parts.append(twin(torch.tensor([[tok]]), kv_cache=cache)[0])
    assert cache.length == len(row)
    torch.testing.assert_close(torch.cat(parts), full, atol=ATOL, rtol=0)


def test_bf16(toy_model_dir: Path, twin: TwinLlama) -> None:
    m = load_base_model(toy_model_dir, precision="bf16")
    assert m.lm_head.weight.dtype == torch.bfloat16
    assert m.model.layers[0].input_layernorm.weight.dtype == torch.bfloat16
    ids = torch.tensor([ROWS[0]])
    with torch.no_grad():
        low, full = m(ids), twin(ids)
    assert low.dtype == torch.float32
    assert (low - full).abs().max() < 0.05
    with pytest.raises(ModelError, match="precision"):
        load_base_model(toy_model_dir, precision="fp8")


def test_gradient_checkpointing_same_grads(toy_model_dir: Path) -> None:
    ids = torch.tensor([ROWS[1]])
    grads = []
    for ckpt in (False, True):
        m = load_base_model(toy_model_dir)
        m.train()
        m.gradient_checkpointing = ckpt
        w = m.model.layers[1].self_attn.q_proj.weight
        w.requires_grad_(True)
        m(ids).sum().backward()
        assert w.grad is not None
        grads.append(w.grad)
    assert torch.equal(grads[0], grads[1])


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_load_errors(tmp_path: Path, toy_model_dir: Path) -> None:
    with pytest.raises(ModelError, match="does not exist"):
        load_base_model(tmp_path / "nope")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelError, match="no config.json") as info:
        load_base_model(empty)
    assert info.value.hint
    other = _copy(toy_model_dir, tmp_path / "gpt")
    cfg = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2"}))
    with pytest.raises(ModelError, match="not 'llama'"):
        load_base_model(other)
    noweights = _copy(toy_model_dir, tmp_path / "noweights")
    (noweights / "model.safetensors").unlink()
    with pytest.raises(ModelError, match="no safetensors"):
        load_base_model(noweights)
    bad = _copy(toy_model_dir, tmp_path / "bad")
    (bad / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 5}))
    with pytest.raises(ModelError, match="missing"):
        load_base_model(bad)
    garbled = _copy(toy_model_dir, tmp_path / "garbled")
    (garbled / "config.json").write_text("{not json")
    with pytest.raises(ModelError, match="cannot read"):
        load_base_model(garbled)


@pytest.mark.parametrize(
    "extra",
    [
        {"tie_word_embeddings": True},
        {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0}},
        {
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8,
            }
        },
    ],
    ids=["tied", "linear-rope", "llama3-rope"],
)
def test_config_variants_match_hf(tmp_path: Path, extra: dict[str, Any]) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=40,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        **extra,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        hf = LlamaForCausalLM(cfg).eval()
        hf.config._attn_implementation = "eager"
    hf.save_pretrained(tmp_path / "m")
    ours = load_base_model(tmp_path / "m")
    if extra.get("tie_word_embeddings"):
        assert ours.lm_head.weight is ours.model.embed_tokens.weight
    ids = torch.arange(1, 30).remainder(40)[None, :]
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, atol=ATOL, rtol=0)


@pytest.mark.gpu
def test_cuda_matches_cpu(toy_model_dir: Path, twin: TwinLlama) -> None:
    m = load_base_model(toy_model_dir, device="cuda:0")
    ids, mask = padded(ROWS)
    with torch.no_grad():
        got = m(ids.cuda(), attention_mask=mask.cuda()).cpu()
        want = twin(ids, attention_mask=mask)
    for i, row in enumerate(ROWS):
        torch.testing.assert_close(got[i, : len(row)], want[i, : len(row)], atol=1e-4, rtol=0)
