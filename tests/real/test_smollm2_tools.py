"""Multi-turn GRPO on SmolLM2-135M-Instruct with the calculator tool environment: its chat template
renders tool turns (the tools listed in a system message, since it does not render `tools`
itself), and two runs — one process, then two — write the same bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testkit.toy_runs import sha256_of
from tests.distributed.launch import torchrun
from twinrun.cli.main import run_cli
from twinrun.model.tokens import load_tokenizer
from twinrun.rl.tool_calls import check_tool_template, template_takes_tools

pytestmark = pytest.mark.real


def tool_args(model: Path, examples: Path, out: Path) -> list[str]:
    """One step: 1 prompt group of 2 episodes, up to 2 model turns of 3 tokens, the update two
    forwards of one row (on 2 processes rank 0 samples the group and each rank runs one forward:
    the toy's tests cover sampling split over processes). SmolLM2's prefill of the tools' system
    message dominates the cost, so the run is kept to the least that has 2 turns."""
    return [
        "tune", "grpo", "--model", str(model), "--examples", str(examples), "--output", str(out),
        "--seed", "3", "--steps", "1", "--prompts-per-step", "1", "--group-size", "2",
        "--rollout-block", "1", "--batch-size", "1", "--max-new-tokens", "3",
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
    """Two separate runs — one in this process, one under torchrun on 2 processes — write the
    same adapter and diag, every observation leaf included."""
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
    assert "observation.prompt_0.sample_1.turn_0" in leaves and "rollout.model_mask" in leaves
