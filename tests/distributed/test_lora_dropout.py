"""With `--lora-dropout`, runs on 2 processes (torchrun, gloo on loopback) write the bytes of 1
process, also with the base sharded (`--shard-base`, whose processes pad to the same number of
forwards): each row's masks are keyed by its index within the step, which no process split
changes (each process runs its own forwards of the step's rows)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testkit.captures import metrics
from testkit.toy_runs import run_args, sha256_of, write_examples
from tests.distributed.launch import torchrun_many
from tests.distributed.runs import timeless, with_flags
from twinrun.cli.main import run_cli

OBJECTIVES = ("sft", "dpo", "grpo")
SHARDED = ("sft", "grpo")  # grpo: 3 update forwards a step, so one process pads


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, toy_model_dir: Path) -> dict[str, list[Path]]:
    """Each objective's run with dropout on 1 process (here) and on 2 (one torchrun job)."""
    root = tmp_path_factory.mktemp("dropout")
    data = write_examples(root / "data")
    args = {o: run_args(o, toy_model_dir, data[o], root / "one" / o, "--lora-dropout", "0.2")
            for o in OBJECTIVES}  # fmt: skip
    for objective in OBJECTIVES:
        assert run_cli(args[objective]) == 0
    two = [with_flags(args[o], output=str(root / "two" / o)) for o in OBJECTIVES]
    two += [[*with_flags(args[o], output=str(root / "sharded" / o)), "--shard-base"]
            for o in SHARDED]  # fmt: skip
    job = torchrun_many(2, two, root / "two", paths=(root / "data",))
    assert job.returncode == 0, job.stderr[-3000:]
    out = {o: [root / "one" / o, root / "two" / o] for o in OBJECTIVES}
    return out | {f"{o}-sharded": [root / "one" / o, root / "sharded" / o] for o in SHARDED}


@pytest.mark.parametrize("name", [*OBJECTIVES, *(f"{o}-sharded" for o in SHARDED)])
def test_two_processes_write_the_bytes_of_one_with_dropout(
    runs: dict[str, list[Path]], name: str
) -> None:
    one, two = runs[name]
    adapter = "adapter_model.safetensors"
    assert sha256_of(two / adapter) == sha256_of(one / adapter)
    assert timeless(metrics(two)) == timeless(metrics(one))
    sidecar = json.loads((two / "twinrun.json").read_text())
    assert sidecar["runtime"]["processes"] == 2 and sidecar["train"]["lora_dropout"] == 0.2
