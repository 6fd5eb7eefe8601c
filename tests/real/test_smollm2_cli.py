"""The commands on SmolLM2: `generate` answers as transformers does (the prompt has one BOS), and
model directories without a tokenizer or without a chat template fail in one line, writing
nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.real.test_smollm2_tokens import FRANCE, FRANCE_IDS, PARIS_IDS
from twinrun.cli.main import run_cli
from twinrun.data.examples import shipped_examples

pytestmark = pytest.mark.real


def model_copy(src: Path, out: Path, tokenizer: bool = True, template: bool = True) -> Path:
    """config + weights (a symlink) of `src`, with or without its tokenizer / chat template."""
    out.mkdir(parents=True)
    for name in ("config.json", "generation_config.json"):
        shutil.copy(src / name, out / name)
    (out / "model.safetensors").symlink_to(src / "model.safetensors")
    if tokenizer:
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            shutil.copy(src / name, out / name)
    if not template:
        (out / "chat_template.jinja").unlink()
    return out


def one_line_error(capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("twinrun: error: ") and "\n" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


def test_generate_gives_transformers_answer(
    smollm2_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["generate", "--model", str(smollm2_dir), "--prompt", FRANCE[0]["content"],
            "--chat-template", "on", "--temperature", "0", "--max-new-tokens", "12",
            "--seed", "0", "--threads", "1", "--precision", "f32", "--json"]  # fmt: skip
    assert run_cli(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["prompt_tokens"] == FRANCE_IDS  # [1, 9690, ...]: one BOS, the template's
    assert out["tokens"] == PARIS_IDS
    assert out["text"] == "The capital of France is Paris."


def sft_args(model: Path, out: Path) -> list[str]:
    return [
        "tune", "sft", "--model", str(model), "--examples", str(shipped_examples("sft.jsonl")),
        "--output", str(out), "--seed", "0", "--epochs", "1", "--batch-size", "2",
        "--accumulation", "1", "--learning-rate", "1e-3", "--warmup-steps", "0",
        "--lr-schedule", "cosine",
        "--lora-rank", "2", "--lora-alpha", "4", "--precision", "f32", "--chat-template", "on",
        "--quiet", "--threads", "1",
    ]  # fmt: skip


def grpo_args(model: Path, out: Path) -> list[str]:
    return [
        "tune", "grpo", "--model", str(model), "--examples", str(shipped_examples("arith.jsonl")),
        "--output", str(out), "--seed", "0", "--steps", "1", "--prompts-per-step", "1",
        "--group-size", "2", "--batch-size", "2", "--max-new-tokens", "2", "--temperature", "1.0",
        "--clip-eps", "0.2", "--advantage-clip", "5", "--token-cap", "2",
        "--env", "arithmetic",
        "--learning-rate", "1e-3", "--warmup-steps", "0",
        "--lr-schedule", "cosine", "--lora-rank", "2", "--lora-alpha", "4",
        "--precision", "f32", "--chat-template", "on", "--quiet", "--threads", "1",
    ]  # fmt: skip


@pytest.mark.parametrize("command", ["sft", "grpo"])
def test_chat_on_without_a_template_fails_before_writing(
    smollm2_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    model = model_copy(smollm2_dir, tmp_path / "m", template=False)
    out = tmp_path / "run"
    args = (sft_args if command == "sft" else grpo_args)(model, out)
    assert run_cli(args) != 0
    one_line_error(capsys, "--chat-template on", "no chat template", "--chat-template off")
    assert not out.exists()


def test_a_model_without_tokenizer_files_is_one_line(
    smollm2_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = model_copy(smollm2_dir, tmp_path / "m", tokenizer=False)
    args = ["generate", "--model", str(model), "--prompt", "hi", "--chat-template", "off",
            "--temperature", "0", "--max-new-tokens", "2", "--seed", "0", "--precision", "f32",
            "--threads", "1", "--json"]  # fmt: skip
    assert run_cli(args) != 0
    one_line_error(capsys, "no tokenizer files in", str(model))
    out = tmp_path / "run"
    assert run_cli(sft_args(model, out)) != 0
    one_line_error(capsys, "no tokenizer files in")
    assert not out.exists()
