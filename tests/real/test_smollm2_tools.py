"""Multi-turn GRPO on SmolLM2-135M-Instruct with the calculator tool environment: its chat template
renders tool turns (the tools listed in a system message, since it does not render `tools`
itself), the same bytes twice, and the same bytes on 1 and 2 processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.distributed.launch import torchrun
from tests.integration.toy_runs import sha256_of
from twinrun.cli.main import run_cli
from twinrun.model.tokens import load_tokenizer
from twinrun.rl.tool_calls import check_tool_template, template_takes_tools

pytestmark = pytest.mark.real


def tool_args(model: Path, examples: Path, out: Path) -> list[str]:
    """One step: 2 prompt groups of 2 episodes, each group its own rollout block (so on 2
    processes each process samples one), up to 2 model turns of 6 tokens."""
    return [
        "tune", "grpo", "--model", str(model), "--examples", str(examples), "--output", str(out),
        "--seed", "3", "--steps", "1", "--prompts-per-step", "2", "--group-size", "2",
        "--rollout-block", "1", "--batch-size", "4", "--max-new-tokens", "3",
        "--temperature", "1.0", "--clip-eps", "0.2", "--advantage-clip", "5",
        "--token-cap", "16", "--learning-rate", "1e-3", "--warmup-steps", "0",
        "--lr-schedule", "cosine", "--lora-rank", "2", "--lora-alpha", "4",
        "--precision", "f32", "--chat-template", "on", "--quiet", "--threads", "1", "--diag",
        "--env", "calculator", "--max-turns", "2", "--tool-timeout", "30",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def arith(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("smol_tools") / "arith.jsonl"
    rows = [{"prompt": "What is 17 * 23?", "answer": "391"},
            {"prompt": "What is 9 + 5?", "answer": "14"}]  # fmt: skip
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_smollm2_template_renders_tool_turns(smollm2_dir: Path) -> None:
    tok = load_tokenizer(smollm2_dir)
    assert not template_takes_tools(str(tok.chat_template))
    check_tool_template(lambda m, g: tok.render_chat(m, g), "SmolLM2")  # raises if it cannot


def test_calculator_same_bytes_in_two_runs_on_1_and_2_processes(
    smollm2_dir: Path, arith: Path, tmp_path: Path
) -> None:
    """Two separate runs — one in this process, one under torchrun on 2 processes (each sampling
    one prompt group) — write the same adapter and diag, every observation leaf included."""
    a, two = tmp_path / "a", tmp_path / "two"
    assert run_cli(tool_args(smollm2_dir, arith, a)) == 0
    job = torchrun(2, ["-m", "twinrun", *tool_args(smollm2_dir, arith, two)], timeout=600)
    assert job.returncode == 0, job.stderr[-3000:]
    for out in (two,):
        assert sha256_of(out / "adapter_model.safetensors") == sha256_of(
            a / "adapter_model.safetensors"
        )
        assert (out / "diag.jsonl").read_bytes() == (a / "diag.jsonl").read_bytes()
    leaves = json.loads((a / "diag.jsonl").read_text().splitlines()[0])["checksums"]
    assert "observation.prompt_1.sample_1.turn_0" in leaves and "rollout.model_mask" in leaves
