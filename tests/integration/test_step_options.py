"""Every step option with the others, on the toy model, for each objective where it applies:
prefetch, spike reruns, diag, trace, checkpoint/resume, planted faults and capture.

Options that must not change a byte (prefetch, spike reruns on a deterministic machine, trace,
checkpoints, resume, capture) are checked against the pinned bytes of the plain run
(test_pinned_bytes.py); a planted fault must still be found by `twinrun diff` at its own step and
leaf with the other options on. The set is pairwise, not the full product: each option meets
each other option in at least one run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testkit.captures import Capture, epoch_source, init_adapter, run_config, shipped
from testkit.toy_runs import OBJECTIVES, run_args, sha256_of, write_examples
from tests.integration.test_pinned_bytes import FILES, PINNED
from twinrun.cli.main import run_cli

# a factor each objective's pinned run exceeds at some step (sft's losses only fall: no spike)
SPIKE = {"sft": "1.01", "dpo": "1.001", "reward": "1.01", "grpo": "1.01"}
# a planted fault per objective, the step and leaf diff must name, and where it meets a spike
FAULT = {
    "sft": ("reduction@1", 1, "grads.lora"),
    "dpo": ("rng@0", 0, "rng.state"),  # dpo spikes at step 1: a rerun runs without the fault
    "reward": ("rng@0", 0, "rng.state"),
    "grpo": ("observation@1", 1, "observation.prompt_0.turn_0"),
}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_examples(tmp_path_factory.mktemp("data"))


def pinned_equal(objective: str, out: Path) -> None:
    got = {key: sha256_of(out / FILES[key]) for key in PINNED[objective]}
    assert got == PINNED[objective], f"{objective}: an option changed the run's bytes"


def rows(out: Path, name: str = "metrics.jsonl") -> list[dict]:
    return [json.loads(line) for line in (out / name).read_text().splitlines()]


def first_divergence(out: str) -> str:
    """diff's FIRST_DIVERGENCE line, after the block naming what the sidecars record differently
    (the planted fault among the options)."""
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("FIRST_DIVERGENCE"))
    assert lines[0].startswith("RECORDED_DIFFERENCES: ")
    assert any(line.startswith("  train.inject: run_A=[] ") for line in lines[1:at]), lines[:at]
    return lines[at]


def prefetch(objective: str) -> list[str]:
    return [] if objective == "grpo" else ["--prefetch", "2"]  # grpo samples from the policy


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_byte_neutral_options_together(
    tmp_path: Path, toy_model_dir: Path, data: dict[str, Path], objective: str
) -> None:
    out = tmp_path / "run"
    extra = ["--diag", *prefetch(objective), "--spike-factor", SPIKE[objective],
             "--spike-window", "1", "--trace-step", "1", "--checkpoint-every", "1"]  # fmt: skip
    assert run_cli(run_args(objective, toy_model_dir, data[objective], out, *extra)) == 0
    pinned_equal(objective, out)
    spikes = json.loads((out / "twinrun.json").read_text())["metrics"]["spikes"]
    if objective != "sft":
        assert spikes and {s["kind"] for s in spikes} == {"intrinsic"}, spikes
        assert [r.get("spike") for r in rows(out)].count("intrinsic") == len(spikes)
    assert [r["step"] for r in rows(out, "trace.jsonl")] == [1]
    assert (out / "checkpoints" / "step-000001").is_dir()


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_resume_with_options_keeps_the_bytes(
    tmp_path: Path, toy_model_dir: Path, data: dict[str, Path], objective: str
) -> None:
    """A run resumed from its newest checkpoint rewrites what follows it bit for bit."""
    out = tmp_path / "run"
    extra = ["--diag", *prefetch(objective), "--checkpoint-every", "1", "--trace-step", "0",
             "--spike-factor", SPIKE[objective], "--spike-window", "1"]  # fmt: skip
    args = run_args(objective, toy_model_dir, data[objective], out, *extra)
    assert run_cli(args) == 0
    for name in ("adapter_model.safetensors", "twinrun.json", "metrics.jsonl"):
        (out / name).unlink()
    with (out / "diag.jsonl").open("a") as fh:
        fh.write('{"step": 99, "torn')  # what a kill mid-row leaves
    assert run_cli([*args, "--resume"]) == 0
    pinned_equal(objective, out)
    assert [r["step"] for r in rows(out, "trace.jsonl")] == [0]


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_fault_found_with_other_options(
    tmp_path: Path,
    toy_model_dir: Path,
    data: dict[str, Path],
    objective: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fault, step, leaf = FAULT[objective]
    clean, faulty = tmp_path / "clean", tmp_path / "faulty"
    assert run_cli(run_args(objective, toy_model_dir, data[objective], clean, "--diag")) == 0
    extra = ["--diag", "--inject", fault, *prefetch(objective), "--trace-step", "1",
             "--checkpoint-every", "1", "--spike-factor", SPIKE[objective],
             "--spike-window", "1"]  # fmt: skip
    assert run_cli(run_args(objective, toy_model_dir, data[objective], faulty, *extra)) == 0
    capsys.readouterr()
    assert run_cli(["diff", str(clean), str(faulty), "--bitwise"]) == 1
    first = first_divergence(capsys.readouterr().out)
    assert first.startswith(f"FIRST_DIVERGENCE: step={step} leaf={leaf} "), first


def test_prefetch_with_spike_rerun_sft(
    tmp_path: Path, toy_model_dir: Path, data: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """The spike rerun trains on the batch the loop took once: with prefetch on it used to end
    in `prefetch out of order`."""
    shape = ["--epochs", "3", "--learning-rate", "3e-1", "--diag"]  # losses rise at step 2
    ref, out = tmp_path / "ref", tmp_path / "out"
    assert run_cli(run_args("sft", toy_model_dir, data["sft"], ref, *shape)) == 0
    extra = ["--prefetch", "4", "--spike-factor", "1.01", "--spike-window", "2"]
    assert run_cli(run_args("sft", toy_model_dir, data["sft"], out, *shape, *extra)) == 0
    spikes = json.loads((out / "twinrun.json").read_text())["metrics"]["spikes"]
    assert [(s["step"], s["kind"]) for s in spikes][:1] == [(2, "intrinsic")]
    for name in ("adapter_model.safetensors", "diag.jsonl"):
        assert (ref / name).read_bytes() == (out / name).read_bytes(), name
    faulty = tmp_path / "faulty"  # an unseeded batch at the spiking step, kept by its rerun
    extra += ["--inject", "sampler@2"]
    assert run_cli(run_args("sft", toy_model_dir, data["sft"], faulty, *shape, *extra)) == 0
    capsys.readouterr()
    assert run_cli(["diff", str(ref), str(faulty), "--bitwise"]) == 1
    first = first_divergence(capsys.readouterr().out)
    assert first.startswith("FIRST_DIVERGENCE: step=2 leaf=batch.sample_indices "), first


def test_capture_inside_a_run_with_options(tmp_path: Path, toy_model_dir: Path) -> None:
    """Capture of step 1 with prefetch, spike reruns, diag and trace on: the run's bytes are
    those of the run without any of them, and the replay reproduces the step's adapter."""
    init = init_adapter(tmp_path / "init", toy_model_dir, seed=5)
    examples = shipped("sft.jsonl", tmp_path, n=8)
    plain = epoch_source("sft", toy_model_dir, init, tmp_path / "plain", examples)
    plain["training"] |= {"max_steps": 2, "warmup_steps": 1}
    plain["optimizer_batch"] = {"capture": False}
    plain["logging"]["diag"] = True
    assert run_config(tmp_path / "plain.toml", plain) == 0
    doc = json.loads(json.dumps(plain))
    doc["logging"] |= {"dir": str(tmp_path / "src"), "trace_step": 1}
    doc["data"]["prefetch"] = 2
    doc["debug"] = {"spike_factor": 1.0001, "spike_window": 1}
    doc["optimizer_batch"] = {"capture": True, "capture_steps": [1]}
    assert run_config(tmp_path / "src.toml", doc) == 0
    for name in ("final/adapter_model.safetensors", "diag.jsonl"):
        assert (tmp_path / "plain" / name).read_bytes() == (tmp_path / "src" / name).read_bytes()
    cap = Capture(doc, tmp_path / "src", 1)
    state = tmp_path / "src" / "optimizer_batch_step_000001.state"
    replay = cap.replay_config(tmp_path / "rep", resume={"from": str(state)})
    replay.pop("debug")  # options of the source's loop, not of the captured step
    replay["data"].pop("prefetch")
    replay["logging"].pop("trace_step")
    assert run_config(tmp_path / "rep.toml", replay) == 0
    (row,) = rows(tmp_path / "rep")
    assert (
        row["optimizer_batch/final_adapter_sha256"]
        == (cap.row["optimizer_batch/final_adapter_sha256"])
    )
    assert {"forward_s", "backward_s", "optimizer_s"} <= set(row)


def test_non_finite_stops_with_a_checkpoint(
    tmp_path: Path, toy_model_dir: Path, data: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    args = run_args("sft", toy_model_dir, data["sft"], out, "--epochs", "2",
                    "--learning-rate", "1e30", "--diag")  # fmt: skip
    assert run_cli(args) == 2  # a TwinrunError's exit status
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "step 1: non-finite loss nan and gradient" in err[0], err
    assert "checkpoint of the 1 good steps written" in err[0]
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-000001"]
    assert not (out / "adapter_model.safetensors").exists()
    assert not (out / "twinrun.json").exists()
    from twinrun.train.outputs.checkpoint import newest_checkpoint

    ckpt = newest_checkpoint(out)
    assert ckpt is not None and ckpt.steps_done == 1 and len(ckpt.state["metrics"]) == 1
