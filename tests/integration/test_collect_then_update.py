"""Collect, then update: a GRPO step's sampling, tool turns and rewards run once, in the loop's
`collect` phase, and a spike rerun of the step trains again on the collected batch — the
environment is never called a second time for one step."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from testkit.toy_runs import sha256_of
from twinrun.cli.main import run_cli

# OpenEnv-style, multi-turn: every reset and step appends one line to CALLS (the side effect a
# database write or an HTTP call would be); rewards differ, so the update has a gradient
COUNTED = """
CALLS = {calls!r}


def _called(what):
    with open(CALLS, "a", encoding="utf-8") as fh:
        fh.write(what + "\\n")


class Counted:
    def reset(self, **row):
        _called("reset")
        return {{"observation": row["prompt"], "reward": 0.0, "done": False}}

    def step(self, action):
        _called("step")
        return {{"observation": "you said: " + action, "reward": float(len(action) % 3),
                 "done": False}}
"""


@pytest.fixture(scope="module")
def counted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The plugin's folder on sys.path; its calls go to `calls.txt` there."""
    d = tmp_path_factory.mktemp("counted_env")
    calls = d / "calls.txt"
    (d / "twinrun_test_counted_env.py").write_text(COUNTED.format(calls=str(calls)))
    sys.path.insert(0, str(d))
    yield d
    sys.path.remove(str(d))


@pytest.fixture(scope="module")
def arith(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("collect_data") / "arith.jsonl"
    rows = [{"prompt": f"What is {a} + {b}?", "answer": str(a + b)} for a in range(1, 5)
            for b in range(1, 3)]  # fmt: skip
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def grpo_args(model: Path, examples: Path, out: Path, *extra: str) -> list[str]:
    return [
        "tune", "grpo", "--model", str(model), "--examples", str(examples), "--output", str(out),
        "--seed", "3", "--steps", "3", "--prompts-per-step", "2", "--group-size", "2",
        "--batch-size", "4", "--max-new-tokens", "4", "--temperature", "1.0",
        "--clip-eps", "0.2", "--advantage-clip", "5", "--token-cap", "12",
        "--learning-rate", "5e-2", "--warmup-steps", "0", "--lr-schedule", "cosine",
        "--lora-rank", "4", "--lora-alpha", "8", "--precision", "f32", "--chat-template", "on",
        "--quiet", "--threads", "1", "--env", "twinrun_test_counted_env:Counted",
        "--max-turns", "2", "--tool-timeout", "10", *extra,
    ]  # fmt: skip


def calls_of(counted: Path, run: object) -> list[str]:
    """The environment's calls during `run()` (the file is emptied first)."""
    calls = counted / "calls.txt"
    calls.write_text("")
    assert run() == 0  # type: ignore[operator]
    return calls.read_text().splitlines()


def test_a_spike_rerun_never_calls_the_environment_again(
    tmp_path: Path, toy_model_dir: Path, arith: Path, counted: Path
) -> None:
    plain, spiked = tmp_path / "plain", tmp_path / "spiked"
    # on-policy GRPO's loss is ~0 (its sign is rounding noise); the KL term makes step 1's loss
    # positive, above step 0's by far (the policy left the reference): a spike, for certain
    kl = ("--kl-beta", "0.1")
    plain_calls = calls_of(counted, lambda: run_cli(grpo_args(toy_model_dir, arith, plain, *kl)))
    spike = (*kl, "--spike-factor", "1.0001", "--spike-window", "1")
    spiked_calls = calls_of(
        counted, lambda: run_cli(grpo_args(toy_model_dir, arith, spiked, *spike))
    )
    spikes = json.loads((spiked / "twinrun.json").read_text())["metrics"]["spikes"]
    assert spikes and {s["kind"] for s in spikes} == {"intrinsic"}, spikes  # a step was rerun
    # 3 steps x 2 prompts x 2 samples, each episode a reset and a step per turn (2)
    assert plain_calls.count("reset") == 12 and len(plain_calls) == 36, plain_calls
    assert spiked_calls == plain_calls
    assert sha256_of(spiked / "adapter_model.safetensors") == sha256_of(
        plain / "adapter_model.safetensors"
    )
