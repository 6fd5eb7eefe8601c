"""Training and evaluation on every tiny architecture (qwen2, qwen3, mistral, gemma2, phi3,
olmo2): two SFT steps twice write the same bytes, LoRA wraps the architecture's attention
projections by default, and `tune evaluate`'s per-example losses — without an adapter and with
the trained one — equal what transformers (plus PEFT for the adapter) computes (rel 1e-5)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.real.test_smollm2_numbers import examples_file
from tests.real.tiny_archs import ARCHITECTURES
from twinrun.cli.main import run_cli
from twinrun.data.examples import encode_sft_rows, load_rows
from twinrun.model.tokens import load_tokenizer

pytestmark = pytest.mark.real

DEFAULT_TARGETS = {
    "qwen2": ["k_proj", "o_proj", "q_proj", "v_proj"],
    "qwen3": ["k_proj", "o_proj", "q_proj", "v_proj"],
    "mistral": ["k_proj", "o_proj", "q_proj", "v_proj"],
    "gemma2": ["k_proj", "o_proj", "q_proj", "v_proj"],
    "phi3": ["o_proj", "qkv_proj"],
    "olmo2": ["k_proj", "o_proj", "q_proj", "v_proj"],
}


def sft(model: Path, data: Path, out: Path) -> list[str]:
    return ["tune", "sft", "--model", str(model), "--examples", str(data), "--output", str(out),
            "--seed", "4", "--epochs", "1", "--batch-size", "2", "--accumulation", "1",
            "--learning-rate", "5e-2", "--warmup-steps", "0", "--lr-schedule", "cosine",
            "--lora-rank", "2",
            "--lora-alpha", "4", "--precision", "f32", "--chat-template", "on", "--quiet",
            "--threads", "1"]  # fmt: skip


def evaluate(model: Path, data: Path, out: Path, *extra: str) -> list[float]:
    assert run_cli(["tune", "evaluate", "--model", str(model), "--examples", str(data),
                    "--chat-template", "on", "--precision", "f32", "--batch-size", "2",
                    "--output", str(out), "--threads", "1", "--quiet", *extra]) == 0  # fmt: skip
    return [e["loss"] for e in json.loads(out.read_text())["per_example"]]


def hf_losses(model: Any, rows: list[Any]) -> list[float]:
    """Per-row mean completion NLL from one unpadded forward of transformers' model."""
    import torch

    out = []
    for row in rows:
        ids = torch.tensor([list(row.input_ids)])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, :-1].double()
        logprobs = torch.log_softmax(logits, -1).gather(1, ids[0, 1:, None])[:, 0]
        keep = torch.tensor(list(row.loss_mask)[1:], dtype=torch.bool)
        out.append(float(-logprobs[keep].mean()))
    return out


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_two_steps_twice_and_losses_equal_transformers_and_peft(
    arch: str, tiny_arch_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model_dir = tiny_arch_dir(arch)
    data = examples_file(tmp_path, 4)
    a, b = tmp_path / "a", tmp_path / "b"
    for run in (a, b):
        assert run_cli(sft(model_dir, data, run)) == 0
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    sidecar = json.loads((a / "twinrun.json").read_text())
    assert sidecar["train"]["lora_targets"] == DEFAULT_TARGETS[arch]
    config = json.loads((a / "adapter_config.json").read_text())
    assert config["target_modules"] == DEFAULT_TARGETS[arch]

    rows = encode_sft_rows(load_tokenizer(model_dir), load_rows(data), True, 2048)
    assert len({len(r.input_ids) for r in rows}) > 1  # evaluate's batches of 2 are padded
    hf = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    base = evaluate(model_dir, data, tmp_path / "base.json")
    assert base == pytest.approx(hf_losses(hf, rows), rel=1e-5)
    tuned = evaluate(model_dir, data, tmp_path / "tuned.json", "--adapter", str(a))
    peft = PeftModel.from_pretrained(hf, str(a)).eval()
    assert tuned == pytest.approx(hf_losses(peft, rows), rel=1e-5)
    assert all(abs(t - u) > 1e-6 for t, u in zip(tuned, base, strict=True))  # it trained
