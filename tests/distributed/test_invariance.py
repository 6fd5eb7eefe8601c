"""Runs on 2 processes (torchrun, gloo on loopback) write the bytes of 1 process: the adapter,
the metrics (wall times aside) and diag.jsonl, for every objective; also when the accumulation
is not a multiple of the process count. A capture made on 2 processes replays on 1 (gate B);
a checkpoint written on 2 processes resumes on 1, bit for bit."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from testkit.captures import Capture, metrics, write_toml
from testkit.toy_runs import OBJECTIVES, sha256_of
from tests.distributed.launch import torchrun_many
from tests.distributed.runs import (
    EXTRA_GRPO,
    OneProcess,
    replays_twice_gate_b,
    resumable,
    timeless,
    with_flags,
)
from twinrun.cli.main import run_cli


@dataclass
class Runs:
    one: dict[str, Path]  # the runs of one process (in this process, no torchrun)
    two: dict[str, Path]  # the same runs on two processes
    args: dict[str, list[str]]  # the 1-process argument lists
    capture: Capture  # a GRPO capture made on two processes


@pytest.fixture(scope="module")
def runs(one_process: OneProcess) -> Runs:
    base = one_process
    root = base.root / "two"
    source = dict(base.grpo_capture, logging={"dir": str(root / "capture")})
    toml = write_toml(base.root / "capture-two.toml", source)
    two = {name: root / name for name in base.one}
    many = [base.elsewhere(name, out) for name, out in two.items()]
    # batch-invariant rows split 2 x 2 over the processes: each forward's 2 rows apart
    many[list(two).index("sft-invariant")] = with_flags(
        base.args["sft-invariant"], output=str(two["sft-invariant"]), batch_size="2",
        accumulation="2",
    )  # fmt: skip
    many.append(["run", str(toml), "--quiet"])
    job = torchrun_many(2, many, root, paths=(base.data,))
    assert job.returncode == 0, job.stderr[-3000:]
    return Runs(base.one, two, base.args, Capture(source, root / "capture", 0))


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_two_processes_write_the_bytes_of_one(
    runs: Runs, objective: str, capsys: pytest.CaptureFixture[str]
) -> None:
    one, two = runs.one[objective], runs.two[objective]
    assert sha256_of(two / "adapter_model.safetensors") == sha256_of(
        one / "adapter_model.safetensors"
    )
    if objective == "reward":
        head = "reward_head.safetensors"
        assert sha256_of(two / head) == sha256_of(one / head)
    assert timeless(metrics(two)) == timeless(metrics(one))
    assert (two / "diag.jsonl").read_bytes() == (one / "diag.jsonl").read_bytes()
    capsys.readouterr()
    assert run_cli(["diff", "--bitwise", str(one), str(two)]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("DETERMINISTIC"))
    # the sidecars differ in the process count (recorded first), the bytes do not
    assert lines[0].startswith("RECORDED_DIFFERENCES: ")
    assert "  runtime.processes: run_A=null run_B=2 (environment)" in lines[1:at]
    sidecar = json.loads((two / "twinrun.json").read_text())
    assert sidecar["runtime"]["processes"] == 2
    assert "processes" not in json.loads((one / "twinrun.json").read_text())["runtime"]


def test_evaluation_in_training_on_two_processes(runs: Runs) -> None:
    """Every process evaluates every batch; rank 0 writes the eval rows of diag and metrics."""
    one, two = runs.one["sft-eval"], runs.two["sft-eval"]
    assert (two / "diag.jsonl").read_bytes() == (one / "diag.jsonl").read_bytes()
    assert timeless(metrics(two)) == timeless(metrics(one))
    assert all("eval_loss" in row for row in metrics(one))


def test_grpo_blocks_on_two_processes_write_the_bytes_of_one(runs: Runs) -> None:
    """Whole blocks of prompt groups go to processes (block b on rank b % 2): the adapter, diag
    and metrics of two processes are those of one."""
    one, two = runs.one["grpo-blocks"], runs.two["grpo-blocks"]
    for name in ("adapter_model.safetensors", "diag.jsonl"):
        assert (two / name).read_bytes() == (one / name).read_bytes()
    assert timeless(metrics(two)) == timeless(metrics(one))
    assert json.loads((two / "twinrun.json").read_text())["train"]["rollout_block"] == 2


@pytest.mark.parametrize("name", sorted(EXTRA_GRPO))
def test_environments_on_two_processes_write_the_bytes_of_one(runs: Runs, name: str) -> None:
    """A stateful single-turn environment and a multi-turn tool environment: 1 and 2 processes
    write the same adapter, diag (every observation leaf) and metrics."""
    one, two = runs.one[name], runs.two[name]
    for file in ("adapter_model.safetensors", "diag.jsonl"):
        assert (two / file).read_bytes() == (one / file).read_bytes(), file
    assert timeless(metrics(two)) == timeless(metrics(one))
    leaves = json.loads((one / "diag.jsonl").read_text().splitlines()[0])["checksums"]
    observed = sum(leaf.startswith("observation.") for leaf in leaves)
    # single-turn: one per prompt group; multi-turn: one per turn of each of the 2 x 3 episodes
    assert observed > 6 if name == "grpo-tools" else observed == 2


def test_uneven_accumulation_steps(runs: Runs) -> None:
    """The sft runs' steps have 3, 3 and 2 forwards: rank 0 ran 2, 2, 1 of them, rank 1 1, 1, 1."""
    rows = metrics(runs.two["sft"])
    assert [r["rows"] for r in rows] == [3, 3, 2]


def test_checkpoint_of_two_processes_resumes_on_one(runs: Runs, tmp_path: Path) -> None:
    """The 2-process sft run checkpointed after steps 1 and 2; one process resumes after step 2
    (from the newest) and ends with the bytes of the uninterrupted 1-process run."""
    resumed = resumable(runs.two["sft"], tmp_path / "resumed")
    ckpts = sorted(p.name for p in (resumed / "checkpoints").iterdir())
    assert ckpts == ["step-000001", "step-000002"]
    args = with_flags(runs.args["sft"], output=str(resumed))
    assert run_cli([*args, "--resume"]) == 0
    one = runs.one["sft"]
    assert sha256_of(resumed / "adapter_model.safetensors") == sha256_of(
        one / "adapter_model.safetensors"
    )
    assert (resumed / "diag.jsonl").read_bytes() == (one / "diag.jsonl").read_bytes()
    assert timeless(metrics(resumed)) == timeless(metrics(one))


def test_capture_of_two_processes_replays_on_one_gate_b(
    runs: Runs, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cap = runs.capture
    manifest = json.loads(cap.manifest.read_text())
    assert manifest["rows"] == 8 and manifest["forwards"] == 2  # 2 groups of 4, every row
    replays_twice_gate_b(cap, tmp_path, capsys)


def test_batch_invariant_rows_split_over_processes_write_the_bytes_of_one(runs: Runs) -> None:
    """8 rows in steps of 4: 1 process at batch 1 x accumulation 4, and 2 processes at batch
    2 x accumulation 2 (each process one forward of 2 rows a step): the rows' gradients are
    gathered apart and added in row order, so the adapter and every step's loss are the same."""
    one, two = runs.one["sft-invariant"], runs.two["sft-invariant"]
    assert sha256_of(two / "adapter_model.safetensors") == sha256_of(
        one / "adapter_model.safetensors"
    )
    assert [r["loss"] for r in metrics(two)] == [r["loss"] for r in metrics(one)]
    assert json.loads((two / "twinrun.json").read_text())["train"]["batch_size"] == 2
