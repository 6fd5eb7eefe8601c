"""LoRA on CausalLM: init pinned to twinrun's stream, PEFT-format files, PEFT-equal logits."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
import torch

from twinrun.core.errors import ModelError
from twinrun.core.rng import stream
from twinrun.model.build import CausalLM, load_causal_lm
from twinrun.model.lora import (
    LoRALinear,
    adapter_config,
    apply_lora,
    load_adapter,
    lora_disabled,
    lora_parameters,
    save_adapter,
)

IDS = torch.tensor([[256, 104, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100]])


def _randomize_b(model: CausalLM, seed: int = 5) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in lora_parameters(model):
            if name.endswith("lora_B.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)


@pytest.fixture()
def base(toy_model_dir: Path) -> CausalLM:
    return load_causal_lm(toy_model_dir)


def test_init_pinned_to_stream(base: CausalLM) -> None:
    state = torch.get_rng_state()
    with torch.no_grad():
        before = base(IDS)
    names = apply_lora(base, rank=4, alpha=8.0, seed=11)
    assert torch.equal(state, torch.get_rng_state()), "apply_lora must not draw from torch's RNG"
    assert names[0] == "model.layers.0.self_attn.q_proj" and len(names) == 16
    mod = base.get_submodule("model.layers.2.self_attn.v_proj")
    assert isinstance(mod, LoRALinear) and mod.scaling == 2.0
    want = stream(11, "lora_A", "model.layers.2.self_attn.v_proj").kaiming_uniform((4, 64))
    assert torch.equal(mod.lora_A.weight, torch.from_numpy(want).float())
    assert mod.lora_A.weight.dtype == torch.float32
    assert torch.equal(mod.lora_B.weight, torch.zeros(32, 4))
    with torch.no_grad():
        assert torch.equal(base(IDS), before), "B = 0: LoRA starts as the identity"
    params = lora_parameters(base)
    assert [n for n, _ in params][:2] == [
        "model.layers.0.self_attn.q_proj.lora_A.weight",
        "model.layers.0.self_attn.q_proj.lora_B.weight",
    ]
    assert len(params) == 32 and all(p.requires_grad for _, p in params)
    trainable = {id(p) for p in base.parameters() if p.requires_grad}
    assert trainable == {id(p) for _, p in params}


def test_apply_errors(base: CausalLM) -> None:
    with pytest.raises(ModelError, match="not found"):
        apply_lora(base, 4, 8.0, seed=0, targets=("nope_proj",))
    with pytest.raises(ModelError, match="rank"):
        apply_lora(base, 0, 8.0, seed=0)
    apply_lora(base, 2, 4.0, seed=0)
    with pytest.raises(ModelError, match="already"):
        apply_lora(base, 2, 4.0, seed=0)


def _header(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n])


def test_save_format_and_bytes(base: CausalLM, tmp_path: Path, toy_model_dir: Path) -> None:
    apply_lora(base, 4, 16.0, seed=3, targets=("v_proj", "q_proj"))
    _randomize_b(base)
    save_adapter(base, tmp_path / "a", str(toy_model_dir), 4, 16.0, ("q_proj", "v_proj"))
    save_adapter(base, tmp_path / "b", str(toy_model_dir))
    for f in ("adapter_model.safetensors", "adapter_config.json"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    header = _header(tmp_path / "a/adapter_model.safetensors")
    assert header.pop("__metadata__") == {"format": "pt"}
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in header
    assert {v["dtype"] for v in header.values()} == {"F32"}
    assert len(header) == 4 * 2 * 2
    text = (tmp_path / "a/adapter_config.json").read_text()
    assert text.endswith("}\n")
    cfg = json.loads(text)
    assert list(cfg) == sorted(cfg)
    assert cfg["peft_type"] == "LORA" and cfg["task_type"] == "CAUSAL_LM"
    assert (cfg["r"], cfg["lora_alpha"], cfg["target_modules"]) == (4, 16, ["q_proj", "v_proj"])
    assert cfg["base_model_name_or_path"] == str(toy_model_dir)


def test_adapter_config_keeps_no_credentials(base: CausalLM, tmp_path: Path) -> None:
    """The base model's path is redacted as the sidecar's is: no userinfo, no secret query."""
    cfg = adapter_config("https://u:SECRET@h/m?token=SECRET2&rev=main", 4, 8.0, ["q_proj"])
    assert cfg["base_model_name_or_path"] == "https://<redacted>@h/m?token=<redacted>&rev=main"
    apply_lora(base, 4, 8.0, seed=0, targets=("q_proj",))
    save_adapter(base, tmp_path / "a", "https://u:SECRET@h/m")
    text = (tmp_path / "a/adapter_config.json").read_text()
    assert "SECRET" not in text and "https://<redacted>@h/m" in text
    with pytest.raises(ModelError, match="differ"):
        save_adapter(base, tmp_path / "c", "x", rank=8)


def test_roundtrip_and_disable(base: CausalLM, tmp_path: Path, toy_model_dir: Path) -> None:
    with torch.no_grad():
        plain = base(IDS)
    apply_lora(base, 4, 8.0, seed=1)
    _randomize_b(base)
    with torch.no_grad():
        tuned = base(IDS)
        assert not torch.allclose(tuned, plain)
        with lora_disabled(base):
            assert torch.equal(base(IDS), plain)
        assert torch.equal(base(IDS), tuned)
    save_adapter(base, tmp_path / "a", str(toy_model_dir))
    other = load_causal_lm(toy_model_dir)
    cfg = load_adapter(other, tmp_path / "a")
    assert cfg["r"] == 4
    with torch.no_grad():
        assert torch.equal(other(IDS), tuned)
    save_adapter(other, tmp_path / "b", str(toy_model_dir))
    for f in ("adapter_model.safetensors", "adapter_config.json"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize(
    "targets", [("q_proj", "k_proj", "v_proj", "o_proj"), ("gate_proj", "up_proj", "down_proj")]
)
def test_peft_gives_same_logits(
    base: CausalLM, tmp_path: Path, toy_model_dir: Path, targets: tuple[str, ...]
) -> None:
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    apply_lora(base, 4, 8.0, seed=7, targets=targets)
    _randomize_b(base)
    save_adapter(base, tmp_path / "ad", str(toy_model_dir))
    hf = LlamaForCausalLM.from_pretrained(toy_model_dir, attn_implementation="eager")
    peft_model = PeftModel.from_pretrained(hf, tmp_path / "ad").eval()
    ids = torch.cat([IDS, IDS.flip(1)])
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    with torch.no_grad():
        ours = base(ids, attention_mask=mask)
        theirs = peft_model(input_ids=ids, attention_mask=mask).logits
        torch.testing.assert_close(ours[0], theirs[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(ours[1, :8], theirs[1, :8], atol=1e-5, rtol=0)
        with peft_model.disable_adapter(), lora_disabled(base):
            torch.testing.assert_close(
                base(IDS), peft_model(input_ids=IDS).logits, atol=1e-5, rtol=0
            )


def test_bf16_base_keeps_float32_lora(toy_model_dir: Path) -> None:
    m = load_causal_lm(toy_model_dir, precision="bf16")
    apply_lora(m, 2, 4.0, seed=0)
    _randomize_b(m)
    assert all(p.dtype == torch.float32 for _, p in lora_parameters(m))
    with torch.no_grad():
        out = m(IDS)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()


def test_load_errors(base: CausalLM, tmp_path: Path, toy_model_dir: Path) -> None:
    with pytest.raises(ModelError, match="does not exist"):
        load_adapter(base, tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="adapter_config.json"):
        load_adapter(base, tmp_path / "empty")
    src = load_causal_lm(toy_model_dir)
    apply_lora(src, 2, 4.0, seed=0)
    save_adapter(src, tmp_path / "ok", str(toy_model_dir))
    cfg_path = tmp_path / "ok/adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps({**cfg, "use_dora": True}))
    with pytest.raises(ModelError, match="unsupported"):
        load_adapter(base, tmp_path / "ok")
    cfg_path.write_text(json.dumps({**cfg, "r": 3}))
    with pytest.raises(ModelError, match="shape"):
        load_adapter(base, tmp_path / "ok")
    assert not any(isinstance(m, LoRALinear) for m in base.modules()), "failed load unwraps"
    cfg_path.write_text(json.dumps({**cfg, "target_modules": ["q_proj"]}))
    with pytest.raises(ModelError, match="do not match"):
        load_adapter(base, tmp_path / "ok")
