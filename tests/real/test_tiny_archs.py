"""The tiny checkpoints of other architectures: each loads with AutoModelForCausalLM as its own
class, carries SmolLM2's tokenizer (so twinrun's tokens are the same), and has fixed bytes."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.real.test_smollm2_tokens import FRANCE, FRANCE_IDS
from tests.real.tiny_archs import ARCHITECTURES, write_tiny_checkpoint
from twinrun.model.tokens import load_tokenizer

pytestmark = pytest.mark.real

CLASSES = {
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mistral": "MistralForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "olmo2": "Olmo2ForCausalLM",
}


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_loads_as_its_architecture(arch: str, tiny_arch_dir: Callable[[str], Path]) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    path = tiny_arch_dir(arch)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert type(model).__name__ == CLASSES[arch] and model.config.model_type == arch
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 64
    with torch.no_grad():
        logits = model(torch.tensor([FRANCE_IDS])).logits
    assert logits.shape == (1, len(FRANCE_IDS), 49152) and bool(torch.isfinite(logits).all())
    tok = load_tokenizer(path)
    assert tok.prompt_ids(FRANCE, chat_template=True) == FRANCE_IDS
    assert tok.end_ids == (2,)


def test_same_seed_same_bytes(tmp_path: Path, smollm2_dir: Path) -> None:
    def digest(path: Path) -> str:
        return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()

    a = write_tiny_checkpoint("qwen3", tmp_path / "a", smollm2_dir, seed=0)
    b = write_tiny_checkpoint("qwen3", tmp_path / "b", smollm2_dir, seed=0)
    c = write_tiny_checkpoint("qwen3", tmp_path / "c", smollm2_dir, seed=1)
    assert digest(a) == digest(b) != digest(c)
    for name in ("config.json", "generation_config.json", "tokenizer.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
