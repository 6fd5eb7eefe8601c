"""`twinrun tune evaluate`, `twinrun generate` and `twinrun toy-model` through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from twinrun.cli.main import run_cli


def eval_args(model: Path, examples: Path, out: Path, bs: int, *extra: str) -> list[str]:
    return [
        "tune", "evaluate", "--model", str(model), "--examples", str(examples),
        "--chat-template", "on", "--precision", "f32", "--batch-size", str(bs),
        "--output", str(out), "--threads", "1", "--quiet", *extra,
    ]  # fmt: skip


def test_evaluate_report(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path, sft_runs: dict[str, Path]
) -> None:
    out = tmp_path / "report.json"
    adapter = ["--adapter", str(sft_runs["a"])]
    assert run_cli(eval_args(toy_model_dir, sft_examples, out, 4, *adapter)) == 0
    report = json.loads(out.read_text())
    assert report["examples"] == 16
    assert [e["index"] for e in report["per_example"]] == list(range(16))
    assert report["loss"] == sum(e["loss"] for e in report["per_example"]) / 16
    assert report["tokens"] == sum(e["tokens"] for e in report["per_example"])
    assert report["batch_size"] == 4 and report["precision"] == "f32"
    assert report["chat_template"] == "on"
    assert report["adapter_sha256"] and report["model_sha256"] and report["data_sha256"]
    # batch 1 vs 4 at hidden 64: per-example losses agree (to float tolerance at least)
    out1 = tmp_path / "report1.json"
    assert (
        run_cli(eval_args(toy_model_dir, sft_examples, out1, 1, "--adapter", str(sft_runs["a"])))
        == 0
    )
    r1 = json.loads(out1.read_text())
    for a, b in zip(report["per_example"], r1["per_example"], strict=True):
        assert a["tokens"] == b["tokens"]
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    # the adapter lowers the loss it was trained on
    base = tmp_path / "base.json"
    assert run_cli(eval_args(toy_model_dir, sft_examples, base, 4)) == 0
    assert json.loads(base.read_text())["loss"] > report["loss"]


def test_evaluate_refuses_existing_report(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, toy_model_dir: Path, sft_examples: Path
) -> None:
    out = tmp_path / "r.json"
    out.write_text("keep")
    assert run_cli(eval_args(toy_model_dir, sft_examples, out, 4)) != 0
    assert "exists" in capsys.readouterr().err and out.read_text() == "keep"
    assert run_cli(["tune", "evaluate", "--output", str(out)]) != 0
    assert "--model" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["evaluate", "extract"])
def test_a_file_mixing_pairs_and_examples_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, toy_model_dir: Path, command: str
) -> None:
    """Every row a pair: a pairs file; none: an examples file; a mix is refused, whichever row
    comes first, naming a row of each kind (evaluate and extract read files by one rule)."""
    from tests.integration.test_extract_steer import extract_args
    from twinrun.data.examples import shipped_examples

    pair, example = (shipped_examples(name).read_text().splitlines()[0]
                     for name in ("pairs.jsonl", "sft.jsonl"))  # fmt: skip
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(f"{example}\n{example}\n{pair}\n")
    if command == "evaluate":
        args = eval_args(toy_model_dir, mixed, tmp_path / "r.json", 2)
    else:
        args = extract_args(toy_model_dir, mixed, tmp_path / "h.safetensors")
    capsys.readouterr()
    assert run_cli(args) == 2
    err = capsys.readouterr().err
    assert f"{mixed}:1 is an example and {mixed}:3 a preference pair" in err, err
    assert "not both" in err and err.count("\n") == 1
    assert not list(tmp_path.glob("[rh].*"))


def gen(model: Path, *extra: str) -> list[str]:
    return [
        "generate", "--model", str(model), "--prompt", "What is 2 + 3?", "--max-new-tokens", "6",
        "--chat-template", "on", "--precision", "f32", "--threads", "1", "--json", *extra,
    ]  # fmt: skip


def test_generate_greedy_and_sampled(
    capsys: pytest.CaptureFixture[str], toy_model_dir: Path
) -> None:
    def run(*extra: str) -> dict:
        assert run_cli(gen(toy_model_dir, *extra)) == 0
        return json.loads(capsys.readouterr().out)

    g1 = run("--temperature", "0", "--seed", "0")
    g2 = run("--temperature", "0", "--seed", "9")
    assert g1 == g2 == run("--temperature", "0")  # greedy ignores the seed, and needs none
    assert run_cli(gen(toy_model_dir, "--temperature", "1.0")) == 2
    assert "missing required flag: --seed" in capsys.readouterr().err  # sampling needs one
    assert g1["prompt_tokens"][0] == 256 and 1 <= len(g1["tokens"]) <= 6
    s1 = run("--temperature", "1.0", "--seed", "3")
    s2 = run("--temperature", "1.0", "--seed", "3")
    s3 = run("--temperature", "1.0", "--seed", "4")
    assert s1 == s2
    assert s1["tokens"] != s3["tokens"]
    from twinrun.model.tokens import load_tokenizer

    assert s1["text"] == load_tokenizer(toy_model_dir).decode(s1["tokens"])


def test_generate_needs_its_flags(capsys: pytest.CaptureFixture[str], toy_model_dir: Path) -> None:
    assert run_cli(["generate", "--model", str(toy_model_dir)]) == 2
    err = capsys.readouterr().err
    assert "--prompt" in err and "--temperature" in err and "--seed" in err
    assert "--precision" in err  # no silent f32: it shapes the tokens


def test_toy_model_cli_same_seed_same_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for d, seed in ((a, 5), (b, 5), (c, 6)):
        assert run_cli(["toy-model", str(d), "--seed", str(seed)]) == 0
    files = sorted(p.name for p in a.iterdir())
    assert "model.safetensors" in files and "tokenizer.json" in files
    for name in files:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
    assert run_cli(["toy-model", str(a), "--seed", "5"]) != 0  # exists: refused
    assert "overwrite" in capsys.readouterr().err
    assert run_cli(["toy-model", str(tmp_path / "d"), "--seed", "-3"]) != 0
