"""`twinrun tune dpo` / `tune reward` end to end, and pairwise `tune evaluate`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from twinrun.cli.main import run_cli
from twinrun.data.examples import shipped_examples


@pytest.fixture(scope="module")
def pairs8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    lines = shipped_examples("pairs.jsonl").read_text().splitlines()[:8]
    out = tmp_path_factory.mktemp("pairs") / "pairs8.jsonl"
    out.write_text("\n".join(lines) + "\n")
    return out


def pair_args(objective: str, model: Path, ex: Path, out: Path, seed: int, bs: int = 2,
              *extra: str) -> list[str]:  # fmt: skip
    args = [
        "tune", objective, "--model", str(model), "--examples", str(ex), "--output", str(out),
        "--seed", str(seed), "--epochs", "1", "--batch-size", str(bs), "--accumulation", "1",
        "--learning-rate", "2e-2", "--warmup-steps", "0",
        "--lr-schedule", "cosine", "--lora-rank", "4",
        "--lora-alpha", "8", "--precision", "f32", "--chat-template", "on", "--quiet",
        "--threads", "1", "--diag", *extra,
    ]  # fmt: skip
    return args + (["--beta", "0.1"] if objective == "dpo" else [])


def same(a: Path, b: Path, name: str) -> bool:
    return (a / name).read_bytes() == (b / name).read_bytes()


@pytest.mark.parametrize("objective", ["dpo", "reward"])
def test_pairs_reproduce_and_seed_matters(
    tmp_path: Path, toy_model_dir: Path, pairs8: Path, objective: str
) -> None:
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        assert run_cli(pair_args(objective, toy_model_dir, pairs8, tmp_path / name, seed)) == 0
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    assert same(a, b, "adapter_model.safetensors") and same(a, b, "diag.jsonl")
    assert not same(a, c, "adapter_model.safetensors")
    rows = [json.loads(x) for x in (a / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all({"accuracy", "reward_margin", "pairs"} <= set(r) for r in rows)
    side = json.loads((a / "twinrun.json").read_text())
    assert side["train"]["objective"] == objective
    if objective == "dpo":
        import math

        assert side["train"]["beta"] == 0.1
        assert rows[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)  # policy == reference
    else:
        assert same(a, b, "reward_head.safetensors")
        assert not same(a, c, "reward_head.safetensors")
        assert side["reward_head"]["key"] == "score.weight"


def test_dpo_batch_one_is_two_one_row_forwards(
    tmp_path: Path, toy_model_dir: Path, pairs8: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from twinrun.model.build import CausalLM

    shapes: list[tuple[int, ...]] = []
    original = CausalLM.run

    def counting(self, input_ids, *args, **kwargs):  # type: ignore[no-untyped-def]
        shapes.append(tuple(input_ids.shape))
        return original(self, input_ids, *args, **kwargs)

    monkeypatch.setattr(CausalLM, "run", counting)
    assert run_cli(pair_args("dpo", toy_model_dir, pairs8, tmp_path / "a", 1, 1)) == 0
    # 8 pairs, batch 1: per pair a chosen and a rejected forward for the policy and for the
    # reference (adapter disabled) — 4 one-row forwards per pair, 32 in all
    assert len(shapes) == 32 and all(s[0] == 1 for s in shapes)
    monkeypatch.setattr(CausalLM, "run", original)
    assert run_cli(pair_args("dpo", toy_model_dir, pairs8, tmp_path / "b", 1, 1)) == 0
    assert same(tmp_path / "a", tmp_path / "b", "adapter_model.safetensors")


def test_pairwise_evaluate_reports_accuracy(
    tmp_path: Path, toy_model_dir: Path, pairs8: Path
) -> None:
    run = tmp_path / "rm"
    assert run_cli(pair_args("reward", toy_model_dir, pairs8, run, 1)) == 0
    out = tmp_path / "eval.json"
    args = ["tune", "evaluate", "--model", str(toy_model_dir), "--adapter", str(run),
            "--examples", str(pairs8), "--chat-template", "on", "--precision", "f32",
            "--batch-size", "4", "--output", str(out), "--threads", "1", "--quiet"]  # fmt: skip
    assert run_cli(args) == 0
    report = json.loads(out.read_text())
    assert report["mode"] == "pairwise" and report["scorer"] == "reward_head"
    assert report["examples"] == 8
    per = report["per_example"]
    assert report["accuracy"] == sum(p["correct"] for p in per) / 8
    assert all(p["correct"] == (p["chosen_score"] > p["rejected_score"]) for p in per)


@pytest.mark.parametrize(
    ("row", "match"),
    [
        ({"prompt": "a", "chosen": "b"}, "rejected"),
        ({"prompt": "a", "chosen": " ", "rejected": "c"}, "empty"),
        ({"prompt": "a", "chosen": "b", "rejected": "b"}, "teaches nothing"),
    ],
)
def test_bad_pair_rows(
    tmp_path: Path,
    toy_model_dir: Path,
    capsys: pytest.CaptureFixture[str],
    row: dict,
    match: str,
) -> None:
    ex = tmp_path / "p.jsonl"
    ex.write_text(json.dumps(row) + "\n")
    assert run_cli(pair_args("dpo", toy_model_dir, ex, tmp_path / "o", 1)) == 2
    err = capsys.readouterr().err
    assert match in err and "p.jsonl:1" in err
    assert not (tmp_path / "o").exists()


def test_dpo_requires_beta(
    tmp_path: Path, toy_model_dir: Path, pairs8: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = pair_args("dpo", toy_model_dir, pairs8, tmp_path / "o", 1)
    i = args.index("--beta")
    del args[i : i + 2]
    assert run_cli(args) == 2 and "--beta" in capsys.readouterr().err
