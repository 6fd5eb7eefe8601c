"""Integration fixtures: small example files and SFT runs made once per session."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testkit.toy_runs import sft_args
from twinrun.cli.main import run_cli
from twinrun.data.examples import shipped_examples


@pytest.fixture(scope="session")
def sft_examples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """16 rows of the shipped SFT examples (prompt/completion and messages rows)."""
    lines = shipped_examples("sft.jsonl").read_text().splitlines()[:16]
    out = tmp_path_factory.mktemp("data") / "sft16.jsonl"
    out.write_text("\n".join(lines) + "\n")
    assert all(json.loads(line) for line in lines)
    return out


@pytest.fixture(scope="session")
def sft_runs(
    tmp_path_factory: pytest.TempPathFactory, toy_model_dir: Path, sft_examples: Path
) -> dict[str, Path]:
    """Three SFT runs with --diag: a and b at seed 1, c at seed 2."""
    root = tmp_path_factory.mktemp("sft_runs")
    runs = {}
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        out = root / name
        assert run_cli(sft_args(toy_model_dir, sft_examples, out, seed, "--diag")) == 0
        runs[name] = out
    return runs
