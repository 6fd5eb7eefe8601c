"""`--attention blockwise` and `--gradient-checkpointing` end to end through the CLI, on the toy
model (portable kernels, the suite's default): both are recorded, and checkpointing writes the
same adapter bytes as the same run without it (eager and blockwise alike)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testkit.toy_runs import sft_args
from twinrun.cli.main import run_cli
from twinrun.core.digest import sha256_file


def _run(toy: Path, examples: Path, out: Path, *extra: str) -> Path:
    assert run_cli(sft_args(toy, examples, out, 1, *extra)) == 0
    return out


@pytest.fixture(scope="module")
def runs(
    tmp_path_factory: pytest.TempPathFactory, toy_model_dir: Path, sft_examples: Path
) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("blockwise_runs")
    plans = {
        "eager": (),
        "eager_gc": ("--gradient-checkpointing",),
        "blockwise": ("--attention", "blockwise"),
        "blockwise_gc": ("--attention", "blockwise", "--gradient-checkpointing"),
    }
    return {k: _run(toy_model_dir, sft_examples, root / k, *v) for k, v in plans.items()}


def _adapter(run: Path) -> str:
    return sha256_file(run / "adapter_model.safetensors")


def test_blockwise_trains_and_is_recorded(runs: dict[str, Path]) -> None:
    side = json.loads((runs["blockwise"] / "twinrun.json").read_text())
    assert side["train"]["attention"] == "blockwise"
    # its block temporaries go back to the system once freed: glibc's threshold, recorded
    runtime = json.dumps(side)
    assert '"malloc_mmap_threshold": 1048576' in runtime
    assert "malloc_mmap_threshold" not in (runs["eager"] / "twinrun.json").read_text()
    assert side["adapter"]["sha256"] == _adapter(runs["blockwise"])
    rows = [json.loads(x) for x in (runs["blockwise"] / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(r["loss"] == r["loss"] for r in rows)  # finite, not NaN
    # its own bytes, not eager's (another summation order)
    assert _adapter(runs["blockwise"]) != _adapter(runs["eager"])


@pytest.mark.parametrize("attention", ["eager", "blockwise"])
def test_gradient_checkpointing_writes_the_same_adapter_bytes(
    runs: dict[str, Path], attention: str
) -> None:
    plain, checkpointed = runs[attention], runs[f"{attention}_gc"]
    assert _adapter(checkpointed) == _adapter(plain)
    side = json.loads((checkpointed / "twinrun.json").read_text())
    assert side["train"]["gradient_checkpointing"] is True
    assert json.loads((plain / "twinrun.json").read_text())["train"]["gradient_checkpointing"] is (
        False
    )
