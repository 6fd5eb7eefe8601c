"""`--batch-invariant` from the command line: evaluate and every `tune` objective.

What these prove (bitwise, on examples of different lengths, so every batch above one is padded):
- `tune evaluate --batch-invariant`: 64 of 64 per-example losses are equal at batch sizes 1, 4
  and 8, on the hidden-64 toy and on the hidden-256 toy (f32 and bf16), and close to what the
  ordinary evaluate gives at batch size 1; the same for pairwise scores (log-probs and a reward
  head).
- `tune sft|dpo|reward|grpo --batch-invariant`: the same rows per optimizer step split into
  forwards of 1, 2 or 4 (accumulation adjusted) write the same adapter bytes (and reward head),
  the same per-step losses (close to, not the bits of, an ordinary run). That holds because
  each row's loss and gradient contribution are the same bits in any batch and the contributions
  are added in one fixed order (tests/unit/model/test_batch_invariant.py proves both parts).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from twinrun.cli.main import run_cli
from twinrun.data.examples import shipped_examples


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from twinrun.model.toy import write_toy_checkpoint

    out = tmp_path_factory.mktemp("wide") / "model"
    write_toy_checkpoint(out, seed=0, hidden=256, intermediate=512, heads=4, kv_heads=2)
    return out


@pytest.fixture(scope="module")
def pairs8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    lines = shipped_examples("pairs.jsonl").read_text().splitlines()[:8]
    out = tmp_path_factory.mktemp("pairs") / "pairs8.jsonl"
    out.write_text("\n".join(lines) + "\n")
    return out


def evaluate(model: Path, examples: Path, out: Path, bs: int, precision: str, *extra: str,
             adapter: Path | None = None) -> dict[str, Any]:  # fmt: skip
    args = [
        "tune", "evaluate", "--model", str(model), "--examples", str(examples),
        "--output", str(out), "--batch-size", str(bs), "--precision", precision,
        "--chat-template", "off", "--threads", "1", "--quiet", *extra,
    ]  # fmt: skip
    if adapter is not None:
        args += ["--adapter", str(adapter)]
    assert run_cli(args) == 0
    return json.loads(out.read_text())


@pytest.mark.parametrize(
    ("which", "precision"), [("toy", "f32"), ("wide", "f32"), ("wide", "bf16")]
)
def test_evaluate_64_of_64_losses_equal_at_batch_1_4_8(
    tmp_path: Path, toy_model_dir: Path, wide_model: Path, which: str, precision: str
) -> None:
    model = toy_model_dir if which == "toy" else wide_model
    examples = shipped_examples("sft.jsonl")
    losses = {}
    for bs in (1, 4, 8):
        report = evaluate(model, examples, tmp_path / f"bi{bs}.json", bs, precision,
                          "--batch-invariant")  # fmt: skip
        assert report["batch_invariant"] is True and report["examples"] == 64
        losses[bs] = [e["loss"] for e in report["per_example"]]
    assert len({e["tokens"] for e in report["per_example"]}) > 1  # rows of different lengths
    equal = {bs: sum(a == b for a, b in zip(losses[1], losses[bs], strict=True)) for bs in (4, 8)}
    assert equal == {4: 64, 8: 64}
    plain = evaluate(model, examples, tmp_path / "plain1.json", 1, precision)
    close = pytest.approx(losses[1], rel=1e-5 if precision == "f32" else 1e-2)
    assert [e["loss"] for e in plain["per_example"]] == close  # its own numbers, near ordinary


def test_pairwise_scores_equal_at_batch_1_and_8(
    tmp_path: Path, wide_model: Path, pairs8: Path
) -> None:
    scores = {}
    for bs in (1, 8):
        report = evaluate(wide_model, pairs8, tmp_path / f"p{bs}.json", bs, "bf16",
                          "--batch-invariant")  # fmt: skip
        scores[bs] = [(e["chosen_score"], e["rejected_score"]) for e in report["per_example"]]
    assert scores[1] == scores[8] and len(scores[1]) == 8


def tune_args(objective: str, model: Path, examples: Path, out: Path, bs: int, acc: int,
              precision: str, *extra: str) -> list[str]:  # fmt: skip
    args = [
        "tune", objective, "--model", str(model), "--examples", str(examples), "--output",
        str(out), "--seed", "5", "--epochs", "1", "--batch-size", str(bs), "--accumulation",
        str(acc), "--learning-rate", "1e-2", "--warmup-steps", "1",
        "--lr-schedule", "cosine", "--lora-rank", "4",
        "--lora-alpha", "8", "--precision", precision, "--chat-template", "off", "--quiet",
        "--threads", "1", *extra,
    ]  # fmt: skip
    return args + (["--beta", "0.1"] if objective == "dpo" else [])


def step_losses(run: Path) -> list[float]:
    return [json.loads(x)["loss"] for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    ("objective", "precision", "splits"),
    [
        ("sft", "bf16", ((1, 4), (2, 2), (4, 1))),
        ("dpo", "f32", ((1, 4), (2, 2), (4, 1))),
        ("reward", "bf16", ((1, 4), (4, 1))),
    ],
)
def test_tune_bytes_do_not_depend_on_the_batch_size(
    tmp_path: Path,
    wide_model: Path,
    sft_examples: Path,
    pairs8: Path,
    objective: str,
    precision: str,
    splits: tuple[tuple[int, int], ...],
) -> None:
    examples = sft_examples if objective == "sft" else pairs8
    runs = []
    for bs, acc in splits:
        out = tmp_path / f"bi_{bs}x{acc}"
        args = tune_args(objective, wide_model, examples, out, bs, acc, precision)
        assert run_cli([*args, "--batch-invariant"]) == 0
        runs.append(out)
    plain = tmp_path / "plain_1x4"
    assert run_cli(tune_args(objective, wide_model, examples, plain, 1, 4, precision)) == 0
    files = ["adapter_model.safetensors"] + (["reward_head.safetensors"] if objective == "reward"
                                             else [])  # fmt: skip
    for run in runs[1:]:
        for name in files:
            assert (run / name).read_bytes() == (runs[0] / name).read_bytes(), (run, name)
        assert step_losses(run) == step_losses(runs[0])
    # the mode defines its own numbers (packed matmuls); near an ordinary run at batch size 1
    assert step_losses(plain) == pytest.approx(step_losses(runs[0]), rel=1e-2)
    side = json.loads((runs[0] / "twinrun.json").read_text())
    assert side["train"]["batch_invariant"] is True
    assert len(step_losses(runs[0])) == (4 if objective == "sft" else 2)


def test_grpo_bytes_do_not_depend_on_the_batch_size(
    tmp_path: Path, toy_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = tmp_path / "env"
    env.mkdir()
    (env / "twinrun_bi_env.py").write_text(
        "class Shaped:\n"
        "    def prompt(self, row, rng):\n        return row['prompt']\n"
        "    def reward(self, row, completion):\n"
        "        return float(len(completion.encode('utf-8')) % 3)\n"
        "def make():\n    return Shaped()\n"
    )
    monkeypatch.syspath_prepend(str(env))
    examples = tmp_path / "prompts.jsonl"
    examples.write_text("".join(json.dumps({"prompt": f"What is {a} + 2?"}) + "\n"
                                for a in range(6)))  # fmt: skip
    runs = []
    for bs in (1, 8):
        out = tmp_path / f"g{bs}"
        args = [
            "tune", "grpo", "--model", str(toy_model_dir), "--examples", str(examples),
            "--output", str(out), "--seed", "1", "--steps", "2", "--prompts-per-step", "2",
            "--group-size", "4", "--batch-size", str(bs), "--max-new-tokens", "6",
            "--temperature", "1.0", "--clip-eps", "0.2", "--advantage-clip", "5",
            "--token-cap", "5", "--learning-rate", "5e-2", "--warmup-steps", "0",
            "--lr-schedule", "cosine",
            "--lora-rank", "4", "--lora-alpha", "8", "--precision", "f32",
            "--chat-template", "on", "--quiet", "--threads", "1", "--env",
            "twinrun_bi_env:make", "--batch-invariant",
        ]  # fmt: skip
        assert run_cli(args) == 0
        runs.append(out)
    a, b = runs
    assert (a / "adapter_model.safetensors").read_bytes() == (
        b / "adapter_model.safetensors"
    ).read_bytes()
    grad_norms = [
        json.loads(x)["grad_norm"] for x in (a / "metrics.jsonl").read_text().splitlines()
    ]
    assert any(g > 0 for g in grad_norms)  # real updates, not a zero adapter delta
