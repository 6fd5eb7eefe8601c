"""Tiny random checkpoints of other architectures, for breadth: qwen2, qwen3, mistral, gemma2,
phi3 and olmo2, each built with transformers' own config class (2 layers, hidden 64) and saved
with `save_pretrained` (safetensors), with SmolLM2's tokenizer and chat template.

The weights are twinrun's toy init (`twinrun.model.toy.toy_state_dict`: every tensor drawn from
`stream(seed, "toy_init", name)`, norms ones), so the same seed gives the same bytes on any
machine. Embeddings are untied in every architecture (one tensor per name).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

ARCHITECTURES = ("qwen2", "qwen3", "mistral", "gemma2", "phi3", "olmo2")
# SmolLM2's special ids: <|endoftext|> 0, <|im_start|> 1 (bos), <|im_end|> 2 (eos, pad).
BOS_ID, EOS_ID, PAD_ID = 1, 2, 2
VOCAB_SIZE = 49152

_COMMON: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "bos_token_id": BOS_ID,
    "eos_token_id": EOS_ID,
    "pad_token_id": PAD_ID,
}


def tiny_config(arch: str) -> Any:
    """transformers' config for `arch` at the tiny size."""
    import transformers

    head_dim = _COMMON["hidden_size"] // _COMMON["num_attention_heads"]
    kinds: dict[str, tuple[str, dict[str, Any]]] = {
        "qwen2": ("Qwen2Config", {}),
        "qwen3": ("Qwen3Config", {"head_dim": head_dim}),
        "mistral": ("MistralConfig", {"head_dim": head_dim}),
        "gemma2": ("Gemma2Config", {"head_dim": head_dim, "query_pre_attn_scalar": head_dim}),
        "phi3": ("Phi3Config", {}),
        "olmo2": ("Olmo2Config", {}),
    }
    if arch not in kinds:
        raise ValueError(f"unknown architecture {arch!r}; known: {', '.join(ARCHITECTURES)}")
    name, extra = kinds[arch]
    return getattr(transformers, name)(**_COMMON, **extra)


def write_tiny_checkpoint(arch: str, out: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """Write the tiny `arch` checkpoint with the tokenizer of `tokenizer_dir` into `out`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from twinrun.model.build import quiet_transformers
    from twinrun.model.toy import toy_state_dict

    config = tiny_config(arch)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    names_shapes = [(k, tuple(v.shape)) for k, v in model.state_dict().items()]
    model.load_state_dict(toy_state_dict(seed, names_shapes), assign=True, strict=True)
    model.generation_config = GenerationConfig(
        bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID
    )
    with quiet_transformers():
        model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out)
    return out
