"""`--eval-examples FILE --eval-every N`: eval rows in diag.jsonl and metrics, numbers equal to
`tune evaluate` of the same adapter, training bytes untouched; `twinrun diff` compares train and
eval rows and prints the per-step table of diverging leaves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from testkit.toy_runs import sft_args
from twinrun.cli.main import run_cli
from twinrun.data.examples import shipped_examples
from twinrun.diag.checksum import sumsq
from twinrun.diag.tolerance import values_equal

ADAPTER = "adapter_model.safetensors"


TABLE = [
    {"phase": "train", "step": 2, "leaves": ["batch.sample_indices", "batch.tokens",
     "forward.logits", "loss", "grads.lora", "adam.exp_avg", "params.lora"]},
    {"phase": "train", "step": 3, "leaves": ["forward.logits", "loss", "grads.lora",
     "adam.exp_avg", "params.lora"]},
    {"phase": "eval", "step": 3, "leaves": ["forward.logits", "loss"]},
]  # fmt: skip


@pytest.fixture(scope="module")
def eval_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    lines = shipped_examples("sft.jsonl").read_text().splitlines()[-6:]
    out = tmp_path_factory.mktemp("eval") / "eval6.jsonl"
    out.write_text("\n".join(lines) + "\n")
    return out


@pytest.fixture(scope="module")
def runs(
    tmp_path_factory: pytest.TempPathFactory, toy_model_dir: Path, sft_examples: Path,
    eval_file: Path,
) -> dict[str, Path]:  # fmt: skip
    """16 examples / batch 4 = 4 steps, evaluated after steps 1 and 3; "fault" draws step 2's
    examples unseeded; "plain" does not evaluate."""
    root = tmp_path_factory.mktemp("eval_runs")
    ev = ("--diag", "--eval-examples", str(eval_file), "--eval-every", "2")
    plans = {"a": ev, "fault": (*ev, "--inject", "sampler@2"), "plain": ("--diag",)}
    for name, extra in plans.items():
        assert run_cli(sft_args(toy_model_dir, sft_examples, root / name, 1, *extra)) == 0
    # the unseeded draw can hit indices whose sum of squares is the seeded one's (~0.3%), or
    # examples whose step-3 loss rounds to the seeded run's, or a batch so close to the seeded
    # one that a step's parameters agree within diff's tolerance (each seen in a full suite):
    # draw again until every leaf the table names tells the runs apart at diff's tolerance
    for _ in range(5):
        if all(not values_equal(checksum(root / "fault", r["phase"], r["step"], leaf),
                                checksum(root / "a", r["phase"], r["step"], leaf), 1e-5, 1e-7)
               for r in TABLE for leaf in r["leaves"]):  # fmt: skip
            break
        args = sft_args(toy_model_dir, sft_examples, root / "fault", 1, *plans["fault"])
        assert run_cli([*args, "--overwrite"]) == 0
    return {name: root / name for name in plans}


def checksum(run: Path, phase: str, step: int, leaf: str) -> float:
    """The checksum of `leaf` in the `phase` row of step `step`."""
    rows = [json.loads(line) for line in (run / "diag.jsonl").read_text().splitlines()]
    row = next(r for r in rows if r["step"] == step and r.get("phase", "train") == phase)
    return float(row["checksums"][leaf])


def rows(run: Path, name: str) -> list[dict]:
    return [json.loads(x) for x in (run / name).read_text().splitlines()]


def test_eval_rows_follow_their_steps_train_row(runs: dict[str, Path]) -> None:
    diag = rows(runs["a"], "diag.jsonl")
    assert [(r["phase"], r["step"]) for r in diag] == [
        ("train", 0), ("train", 1), ("eval", 1), ("train", 2), ("train", 3), ("eval", 3)
    ]  # fmt: skip
    assert list(diag[2]["checksums"]) == [
        "batch.sample_indices", "batch.tokens", "forward.logits", "loss"
    ]  # fmt: skip
    assert diag[2]["checksums"]["batch.sample_indices"] == sumsq(torch.arange(6))
    metrics = rows(runs["a"], "metrics.jsonl")
    assert ["eval_loss" in m for m in metrics] == [False, True, False, True]
    # evaluating reads the model and draws nothing: the training bytes are the plain run's
    assert (runs["a"] / ADAPTER).read_bytes() == (runs["plain"] / ADAPTER).read_bytes()
    train_rows = [r for r in diag if r["phase"] == "train"]
    assert train_rows == rows(runs["plain"], "diag.jsonl")
    side = json.loads((runs["a"] / "twinrun.json").read_text())
    assert side["eval"]["examples"] == 6 and side["train"]["eval_every"] == 2


def test_the_last_eval_is_tune_evaluate_of_the_adapter(
    runs: dict[str, Path], toy_model_dir: Path, eval_file: Path, tmp_path: Path
) -> None:
    report = tmp_path / "report.json"
    args = ["tune", "evaluate", "--model", str(toy_model_dir), "--adapter", str(runs["a"]),
            "--examples", str(eval_file), "--chat-template", "on", "--precision", "f32",
            "--batch-size", "4", "--output", str(report), "--threads", "1", "--quiet"]  # fmt: skip
    assert run_cli(args) == 0
    got = json.loads(report.read_text())
    last = rows(runs["a"], "metrics.jsonl")[-1]
    assert (last["eval_loss"], last["eval_tokens"]) == (got["loss"], got["tokens"])
    per_example = torch.tensor([e["loss"] for e in got["per_example"]], dtype=torch.float64)
    assert rows(runs["a"], "diag.jsonl")[-1]["checksums"]["loss"] == sumsq(per_example)


def test_diff_prints_the_per_step_table(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert run_cli(["diff", str(runs["a"]), str(runs["fault"]), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["first"]["phase"] == "train" and report["first"]["step"] == 2
    assert report["first"]["leaf"] == "batch.sample_indices"
    assert report["table"] == TABLE
    assert run_cli(["diff", str(runs["a"]), str(runs["fault"])]) == 1
    text = capsys.readouterr().out.splitlines()
    at = text.index("diverging leaves per step:")
    assert text[at + 1 :] == [
        "  phase    step  leaves",
        *(f"  {r['phase']:<6} {r['step']:>6}  {', '.join(r['leaves'])}" for r in TABLE),
    ]
    assert "3 of 6 rows diverged" in text


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--eval-every", "2"], "--eval-examples and --eval-every go together"),
        (["--eval-limit", "2"], "--eval-limit needs --eval-examples"),
        (["--eval-examples", "{missing}", "--eval-every", "1"], "examples file not found"),
        (["--eval-examples", "{eval}", "--eval-every", "0"], "--eval-every must be >= 1"),
    ],
)
def test_bad_eval_flags_are_one_line_errors_and_write_nothing(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path, eval_file: Path,
    capsys: pytest.CaptureFixture[str], extra: list[str], message: str,
) -> None:  # fmt: skip
    extra = [x.format(missing=tmp_path / "nope.jsonl", eval=eval_file) for x in extra]
    out = tmp_path / "run"
    capsys.readouterr()
    assert run_cli(sft_args(toy_model_dir, sft_examples, out, 1, *extra)) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err
    assert not out.exists()
