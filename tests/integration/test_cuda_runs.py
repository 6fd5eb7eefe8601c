"""On a CUDA device (skipped without one): every objective's run, repeated at one seed in strict
mode, writes the same adapter and diag bytes; its numbers stay close to the CPU run's; a
torchrun job of one process (nccl) writes the bytes of the plain process; a capture made on the
GPU replays on it bit for bit (gate B); batch-invariant evaluation gives 64 of 64 equal losses at
batch sizes 1 and 8."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testkit.captures import (
    Capture,
    arith,
    grpo_source,
    init_adapter,
    metrics,
    plugin,
    run_config,
    write_toml,
)
from testkit.toy_runs import OBJECTIVES, run_args, sha256_of, write_examples
from tests.distributed.launch import torchrun
from twinrun.cli.main import run_cli

pytestmark = pytest.mark.gpu

CUDA = ("--device", "cuda:0")
BYTES = ("adapter_model.safetensors", "diag.jsonl")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, toy_model_dir: Path) -> dict[str, Path]:
    """Each objective on cuda:0 twice (a, b) and once on the CPU, all with --diag."""
    root = tmp_path_factory.mktemp("cuda")
    examples = write_examples(root / "data")
    out: dict[str, Path] = {}
    for objective in OBJECTIVES:
        for name, extra in (("a", CUDA), ("b", CUDA), ("cpu", ())):
            run = root / f"{objective}-{name}"
            args = run_args(objective, toy_model_dir, examples[objective], run, "--diag", *extra)
            assert run_cli(args) == 0, (objective, name)
            out[f"{objective}-{name}"] = run
    return out


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_cuda_run_repeats_its_bytes(runs: dict[str, Path], objective: str) -> None:
    a, b = runs[f"{objective}-a"], runs[f"{objective}-b"]
    for name in BYTES:
        assert sha256_of(a / name) == sha256_of(b / name), name
    record = json.loads((a / "twinrun.json").read_text())
    assert record["train"]["device"] == "cuda:0"
    assert record["determinism"]["device"] == "cuda:0" and record["determinism"]["cuda"]


@pytest.mark.parametrize("objective", ("sft", "dpo", "reward"))
def test_cuda_losses_close_to_cpu(runs: dict[str, Path], objective: str) -> None:
    gpu = [r["loss"] for r in metrics(runs[f"{objective}-a"])]
    cpu = [r["loss"] for r in metrics(runs[f"{objective}-cpu"])]
    assert len(gpu) == len(cpu) > 0
    assert gpu == pytest.approx(cpu, rel=1e-3, abs=1e-4)


def test_torchrun_one_process_nccl_writes_the_plain_bytes(
    runs: dict[str, Path], toy_model_dir: Path, tmp_path: Path
) -> None:
    examples = write_examples(tmp_path / "data")
    out = tmp_path / "nccl"
    args = run_args("sft", toy_model_dir, examples["sft"], out, "--diag", *CUDA)
    job = torchrun(1, ["-m", "twinrun", *args], timeout=300)
    assert job.returncode == 0, job.stderr[-2000:]
    for name in BYTES:
        assert sha256_of(out / name) == sha256_of(runs["sft-a"] / name), name


def test_cuda_capture_replays_bitwise(tmp_path: Path, toy_model_dir: Path) -> None:
    env = plugin(tmp_path)
    init = init_adapter(tmp_path / "init", toy_model_dir)
    doc = grpo_source(toy_model_dir, arith(tmp_path), env, init, tmp_path / "source")
    doc["backend"]["devices"] = "cuda:0"
    assert run_config(tmp_path / "source.toml", doc) == 0
    cap = Capture(doc, tmp_path / "source", 0)
    cfg = write_toml(tmp_path / "replay.toml", cap.replay_config(tmp_path / "r1"))
    assert run_cli(["run", str(cfg), "--quiet"]) == 0
    assert run_cli(["run", str(cfg), "--quiet", "--output", str(tmp_path / "r2")]) == 0
    final = "final/adapter_model.safetensors"
    for name in ("r1", "r2"):
        assert sha256_of(tmp_path / name / final) == sha256_of(cap.out / final)
    rc = run_cli(["evidence", str(cap.out), str(tmp_path / "r1"), str(tmp_path / "r2"),
                  "--require", "B"])  # fmt: skip
    assert rc == 0


def test_cuda_batch_invariant_evaluate_equal_at_batch_1_and_8(
    tmp_path: Path, toy_model_dir: Path
) -> None:
    from twinrun.data.examples import shipped_examples

    losses = {}
    for bs in (1, 8):
        out = tmp_path / f"eval{bs}.json"
        args = ["tune", "evaluate", "--model", str(toy_model_dir),
                "--examples", str(shipped_examples("sft.jsonl")), "--output", str(out),
                "--batch-size", str(bs), "--precision", "f32", "--chat-template", "off",
                "--quiet", "--batch-invariant", *CUDA]  # fmt: skip
        assert run_cli(args) == 0
        losses[bs] = [e["loss"] for e in json.loads(out.read_text())["per_example"]]
    assert len(losses[1]) == 64 and losses[1] == losses[8]
