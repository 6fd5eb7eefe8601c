"""`--trace-step` and `twinrun diff`: two SFT runs traced at step 1, one with the planted
reduction fault (`--inject reduction@1`: the step's backward runs once per row, last row
first). The diag leaves part at grads.lora; the traces show what really happened first: the
forward agrees entry for entry, and the very first gradient of the backward — the logits'
gradient arriving at lm_head — differs, because the fault backpropagates one row at a time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testkit.toy_runs import sft_args
from twinrun.cli.main import run_cli
from twinrun.diag.trace import compare_traces, read_trace


@pytest.fixture(scope="module")
def traced_runs(
    tmp_path_factory: pytest.TempPathFactory, toy_model_dir: Path, sft_examples: Path
) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("traced")
    runs = {}
    for name, extra in (
        ("clean", ["--trace-step", "1"]),
        ("clean2", ["--trace-step", "1"]),
        ("fault", ["--inject", "reduction@1", "--trace-step", "1"]),
    ):
        out = root / name
        assert run_cli(sft_args(toy_model_dir, sft_examples, out, 1, "--diag", *extra)) == 0
        runs[name] = out
    return runs


def test_trace_file_is_written(traced_runs: dict[str, Path]) -> None:
    rows = (traced_runs["clean"] / "trace.jsonl").read_text().splitlines()
    assert len(rows) == 1
    row = json.loads(rows[0])
    assert (row["format"], row["step"], row["phase"]) == ("twinrun.trace.v1", 1, "train")
    assert row["entries"][0][:3] == ["forward", "model.embed_tokens", 0]
    assert (traced_runs["clean"] / "trace.jsonl").read_bytes() == (
        traced_runs["clean2"] / "trace.jsonl"
    ).read_bytes()


def test_clean_traced_runs_diff_clean(
    traced_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        run_cli(["diff", str(traced_runs["clean"]), str(traced_runs["clean2"]), "--bitwise"]) == 0
    )
    assert capsys.readouterr().out.startswith("DETERMINISTIC")


def test_diff_names_the_first_module_backward(
    traced_runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    a, b = str(traced_runs["clean"]), str(traced_runs["fault"])
    assert run_cli(["diff", a, b, "--bitwise"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == [
        "RECORDED_DIFFERENCES: 1",
        '  train.inject: run_A=[] run_B=["reduction@1"] (setting)',
    ]  # the sidecars record the planted fault, and the advice names it first
    assert lines[2].startswith("FIRST_DIVERGENCE: step=1 leaf=grads.lora "), lines[2]
    advice = next(line for line in lines if line.startswith("advice: "))
    assert advice.startswith(
        'advice: grads.lora: the runs\' sidecars differ in train.inject ([] vs ["reduction@1"]): '
    )
    module = [line for line in lines if line.startswith("FIRST_MODULE:")]
    assert len(module) == 1
    assert module[0].startswith("FIRST_MODULE: step=1 backward lm_head rel="), module[0]
    assert " entry=backward " in module[0]
    assert any("backpropagated differently" in line for line in lines)
    assert lines[lines.index("diverging leaves per step:") - 1].endswith("rows diverged")

    # the truth behind that line: the forward agrees entry for entry, the first difference is
    # the first backward entry, and it is a value difference, not a different event
    ta, tb = read_trace(traced_runs["clean"] / "trace.jsonl", 1), read_trace(b + "/trace.jsonl", 1)
    assert ta is not None and tb is not None
    div = compare_traces(ta, tb, step=1, exact=True)
    assert div is not None and not div.structural and div.first_of_kind
    assert all(e[0] == "forward" for e in ta[: div.position])
    assert ta[: div.position] == tb[: div.position]
    assert (div.kind, div.module, div.call) == ("backward", "lm_head", 0)

    assert run_cli(["diff", a, b, "--bitwise", "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert d["first"]["leaf"] == "grads.lora" and d["first"]["step"] == 1
    fm = d["first_module"]
    assert (fm["step"], fm["direction"], fm["module"], fm["kind"]) == (
        1,
        "backward",
        "lm_head",
        "backward",
    )
    assert d["first_module_line"] == module[0]
    assert d["trace_advice"]["module"] == "lm_head"


def test_diff_without_traces_suggests_trace_step(
    traced_runs: dict[str, Path],
    sft_runs: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    capsys.readouterr()
    # sft_runs["c"] (seed 2) has no trace: the note tells how to get one
    assert run_cli(["diff", str(traced_runs["clean"]), str(sft_runs["c"])]) == 1
    out = capsys.readouterr().out
    assert "FIRST_MODULE" not in out
    assert "trace: runs A and B have no trace at step=0: rerun both with --trace-step 0" in out
