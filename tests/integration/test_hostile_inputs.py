"""Hostile inputs and hostile environments end in one clear line and leave nothing half-written:
unusable output locations, a full disk (a real tmpfs), hostile JSON, rows GRPO cannot use,
generation past the model's positions, a config.json with a quoted size, secrets in every line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from testkit.fake_trainer import fake
from testkit.toy_runs import sft_args
from tests.integration.test_evaluate_generate_cli import gen
from tests.integration.test_grpo_cli import grpo_args
from tests.integration.test_resume import cli
from tests.tiny_disk import tiny_disk
from twinrun.cli.main import run_cli
from twinrun.data.examples import shipped_examples

CANARY = "CANARY7f3a9"


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "internal error" not in lines[0] and "Traceback" not in err
    return lines[0]


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("where", ["under_file", "loop"])
def test_output_under_a_file_or_on_a_symlink_loop(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path, capsys: pytest.CaptureFixture[str],
    where: str,
) -> None:  # fmt: skip
    (tmp_path / "f").write_text("x")
    (tmp_path / "l1").symlink_to(tmp_path / "l2")
    (tmp_path / "l2").symlink_to(tmp_path / "l1")
    out = tmp_path / ("f/run" if where == "under_file" else "l1/run")
    before = tree(tmp_path)
    assert run_cli(sft_args(toy_model_dir, sft_examples, out, 1)) == 2
    line = one_line(capsys.readouterr().err)
    assert ("is a file and not a directory" if where == "under_file" else "symlink loop") in line
    assert tree(tmp_path) == before


def test_full_disk_is_one_line_naming_the_path(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path
) -> None:
    with tiny_disk(tmp_path / "disk", "48k") as disk:
        out = disk / "run"
        res = cli(sft_args(toy_model_dir, sft_examples, out, 1, "--diag"))  # a real process
        assert res.returncode == 2
        line = one_line(res.stderr)
        assert "No space left on device" in line and str(out) in line
        assert not [p for p in disk.rglob("*") if p.name.endswith(".tmp")]  # nothing half-written
        assert not (out / "twinrun.json").exists()  # the run is not marked finished
        assert not list(disk.glob(".*twinrun-lock"))  # released when the process ended


def test_init_adapter_on_a_full_disk_leaves_no_directory(
    tmp_path: Path, toy_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with tiny_disk(tmp_path / "disk", "16k") as disk:
        args = ["init-adapter", str(disk / "init"), "--model", str(toy_model_dir), "--seed", "1",
                "--lora-rank", "4", "--lora-alpha", "8"]  # fmt: skip
        assert run_cli(args) == 2
        assert "No space left on device" in one_line(capsys.readouterr().err)
        assert tree(disk) == []


@pytest.mark.parametrize(
    ("content", "expect"),
    [
        ('{"prompt": "a", "completion": ' + "9" * 5000 + "}\n", "more than 40 digits"),
        ("[" * 100_000 + "]" * 100_000 + "\n", "nesting deeper than"),
        ('{"prompt": "\\ud800", "completion": "x"}\n', "surrogate"),
        ('{"prompt": "' + "a" * (9 << 20) + '", "completion": "x"}\n', "over the limit"),
    ],
    ids=["digits", "depth", "surrogate", "row-bytes"],
)
def test_hostile_example_files(
    tmp_path: Path, toy_model_dir: Path, capsys: pytest.CaptureFixture[str], content: str,
    expect: str,
) -> None:  # fmt: skip
    ex = tmp_path / "ex.jsonl"
    ex.write_text(content)
    out = tmp_path / "run"
    assert run_cli(sft_args(toy_model_dir, ex, out, 1)) == 2
    assert expect in one_line(capsys.readouterr().err)
    assert tree(tmp_path) == ["ex.jsonl"]


def test_grpo_rows_are_validated_before_any_output(
    tmp_path: Path, toy_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = shipped_examples("arith.jsonl").read_text().splitlines()[:5]
    bad = json.loads(rows[4]) | {"answer": "not a number"}
    ex = tmp_path / "arith.jsonl"
    ex.write_text("\n".join([*rows[:4], json.dumps(bad)]) + "\n")
    out = tmp_path / "run"
    assert run_cli(grpo_args(toy_model_dir, ex, out, 1, "--env", "arithmetic")) == 2
    line = one_line(capsys.readouterr().err)
    assert f"{ex}:5" in line and "is not an integer" in line
    assert tree(tmp_path) == ["arith.jsonl"]


def test_generate_past_the_models_positions(
    toy_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = gen(toy_model_dir, "--seed", "0", "--temperature", "0")
    args[args.index("--max-new-tokens") + 1] = "100000"
    assert run_cli(args) == 2
    assert "runs past the model's" in one_line(capsys.readouterr().err)


def test_quoted_size_in_config_json(tmp_path: Path, toy_model_dir: Path) -> None:
    from twinrun.core.errors import ModelError
    from twinrun.model.loading import read_model_config

    model = tmp_path / "model"
    shutil.copytree(toy_model_dir, model)
    cfg = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(cfg | {"hidden_size": "64"}))
    with pytest.raises(ModelError, match="hidden_size must be positive integers"):
        read_model_config(model)


def test_evidence_on_a_metrics_row_that_is_an_array(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("src", "rep"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("[1, 2]\n")
    assert run_cli(["evidence", str(tmp_path / "src"), str(tmp_path / "rep")]) == 2
    assert "must be a JSON object, got list" in one_line(capsys.readouterr().err)


def test_canaries_never_reach_a_line_or_a_file(
    tmp_path: Path, toy_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A secret passed where a secret can sit — an --env-arg value, URL userinfo, a secret query
    parameter, a secret-named flag — appears in no stdout/stderr line and no file written."""
    secrets = ["--env-arg", f"token={CANARY}", f"https://u:{CANARY}@h/x?token={CANARY}",
               f"--api-key={CANARY}"]  # fmt: skip
    keep = tmp_path / "keep"
    rc = run_cli(["check", "--json", "--keep", str(keep), "--", *fake(), *secrets])
    out = capsys.readouterr()
    assert rc == 0, out.err
    # an error that echoes a path: a URL with userinfo given as --examples and as --model
    for flag in ("--examples", "--model"):
        args = sft_args(toy_model_dir, tmp_path / "ex.jsonl", tmp_path / "run", 1)
        args[args.index(flag) + 1] = f"https://user:{CANARY}@hub.example/x?api_key={CANARY}"
        assert run_cli(args) == 2
    both = out.out + out.err + "".join(capsys.readouterr())
    assert CANARY not in both
    assert json.loads(out.out)["runs"][0]["argv"][-4:] == [
        "--env-arg", "token=<redacted>", "https://<redacted>@h/x?token=<redacted>",
        "--api-key=<redacted>",
    ]  # fmt: skip
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert written and not [p for p in written if CANARY.encode() in p.read_bytes()
                            and not p.name.endswith(".log")]  # fmt: skip
