"""`--shard-base`: the frozen base sharded with FSDP2 on 2 processes (torchrun, gloo on
loopback) writes the bytes of 1 unsharded process — adapter, reward head, metrics (wall times
aside) and diag.jsonl — for every objective, GRPO blocks, a stateful environment and a
multi-turn tool environment, also when the accumulation is not a multiple of the process count;
on 3 processes for sft, dpo, grpo, GRPO blocks (a rank that samples nothing) and evaluation in
training. Each sharded process loads only its own rows of the base (tests/distributed/
test_sharded_loading.py checks the reads).
A checkpoint written sharded resumes unsharded on 1 process and the reverse; a capture made
sharded replays on 1 process. A rank killed mid-step ends every process; SIGINT to the torchrun
parent stops every process after the same step, with its checkpoint; two torchrun launchers
meeting at a c10d rendezvous (2 nodes x 2 processes) write the bytes of 1 process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from testkit.captures import Capture, metrics, write_toml
from testkit.toy_runs import OBJECTIVES, sha256_of
from tests.distributed.launch import (
    FAULT_ENV,
    FAULT_TIMEOUT_S,
    MANY,
    free_port,
    launch_env,
    torchrun_many,
)
from tests.distributed.runs import (
    OneProcess,
    replays_twice_gate_b,
    resumable,
    timeless,
    with_flags,
)
from twinrun.cli.main import run_cli

FILES = ("adapter_model.safetensors", "diag.jsonl")
# on 3 processes: rank 2 pads sft's last step, samples no block of grpo-blocks, and sft-eval
# evaluates after each step; dpo and grpo as on 2 (every objective runs sharded on 2 processes).
# Every sharded run loads its base sharded: each process reads only its rows of the weights
THREE = ("sft", "dpo", "grpo", "grpo-blocks", "sft-eval")


@dataclass
class Sharded:
    base: OneProcess
    two: dict[str, Path]  # the 1-process runs again, sharded on 2 processes
    three: dict[str, Path]  # THREE, sharded on 3 processes
    resumed_three: Path  # the 1-process sft run's checkpoint, resumed sharded on 3 processes
    capture: Capture  # a GRPO capture made sharded on 2 processes


@pytest.fixture(scope="module")
def sharded(one_process: OneProcess) -> Sharded:
    base = one_process
    root = base.root / "sharded"
    # every run but the batch-invariant one (--shard-base refuses that mode)
    two = {name: root / "two" / name for name in base.one if name != "sft-invariant"}
    source = dict(base.grpo_capture, logging={"dir": str(root / "capture")})
    source["backend"] = {
        **source["backend"],
        "options": {**source["backend"]["options"], "shard_base": True},
    }
    toml = write_toml(root.parent / "capture-sharded.toml", source)
    many = [base.elsewhere(name, out, "--shard-base") for name, out in two.items()]
    many.append(["run", str(toml), "--quiet"])
    job = torchrun_many(2, many, root, paths=(base.data,))
    assert job.returncode == 0, job.stderr[-3000:]
    three = {name: root / "three" / name for name in THREE}
    resumed = resumable(base.one["sft"], root / "three-resumed")
    many = [base.elsewhere(name, out, "--shard-base") for name, out in three.items()]
    many.append(base.elsewhere("sft", resumed, "--shard-base", "--resume"))
    # and unsharded: 2 prompt groups a step, so rank 2 samples nothing and in steps of 2
    # forwards computes none; it still takes part in every gather
    three["grpo-unsharded"] = root / "three" / "grpo-unsharded"
    many.append(base.elsewhere("grpo", three["grpo-unsharded"]))
    job = torchrun_many(3, many, root, paths=(base.data,))
    assert job.returncode == 0, job.stderr[-3000:]
    return Sharded(base, two, three, resumed, Capture(source, root / "capture", 0))


def assert_same_run(run: Path, one: Path) -> None:
    for name in FILES:
        assert (run / name).read_bytes() == (one / name).read_bytes(), name
    head = one / "reward_head.safetensors"
    if head.exists():
        assert sha256_of(run / head.name) == sha256_of(head)
    assert timeless(metrics(run)) == timeless(metrics(one))


@pytest.mark.parametrize(
    "name", [*OBJECTIVES, "grpo-blocks", "grpo-stateful", "grpo-tools", "sft-eval"]
)
def test_two_sharded_processes_write_the_bytes_of_one(sharded: Sharded, name: str) -> None:
    assert_same_run(sharded.two[name], sharded.base.one[name])


@pytest.mark.parametrize("name", THREE)
def test_three_sharded_processes_write_the_bytes_of_one(sharded: Sharded, name: str) -> None:
    """sft's steps have 3, 3 and 2 forwards: on 3 processes rank 2 pads the last step, on 2
    processes rank 1 pads every step; grpo-blocks has 2 blocks, so rank 2 samples nothing and
    answers the others' decoding forwards."""
    assert_same_run(sharded.three[name], sharded.base.one[name])


def test_three_unsharded_processes_one_without_forwards(sharded: Sharded) -> None:
    assert_same_run(sharded.three["grpo-unsharded"], sharded.base.one["grpo"])
    runtime = json.loads((sharded.three["grpo-unsharded"] / "twinrun.json").read_text())["runtime"]
    assert runtime["processes"] == 3 and "shard_base_processes" not in runtime


def test_the_sidecar_records_the_base_divided_across_processes(sharded: Sharded) -> None:
    runtimes = [
        json.loads((runs[name] / "twinrun.json").read_text())["runtime"]
        for runs, name in ((sharded.two, "sft"), (sharded.three, "sft"))
    ]
    for size, runtime in zip((2, 3), runtimes, strict=True):
        assert runtime["processes"] == runtime["shard_base_processes"] == size
        whole = runtime["base_bytes"]
        # rank 0 holds ceil(rows / size) rows of each weight: a little more than 1/size
        assert whole / size <= runtime["base_bytes_here"] < whole / size + whole / 20
    assert runtimes[0]["base_bytes"] == runtimes[1]["base_bytes"]
    unsharded = json.loads((sharded.base.one["sft"] / "twinrun.json").read_text())["runtime"]
    assert "shard_base_processes" not in unsharded


def test_a_sharded_checkpoint_resumes_unsharded_on_one_process(
    sharded: Sharded, tmp_path: Path
) -> None:
    resumed = resumable(sharded.two["sft"], tmp_path / "resumed")
    assert sorted(p.name for p in (resumed / "checkpoints").iterdir()) == [
        "step-000001",
        "step-000002",
    ]
    args = with_flags(sharded.base.args["sft"], output=str(resumed))
    assert run_cli([*args, "--resume"]) == 0
    assert_same_run(resumed, sharded.base.one["sft"])


def test_an_unsharded_checkpoint_resumes_sharded_on_three_processes(sharded: Sharded) -> None:
    assert_same_run(sharded.resumed_three, sharded.base.one["sft"])


def test_a_sharded_capture_replays_on_one_process_gate_b(
    sharded: Sharded, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    replays_twice_gate_b(
        sharded.capture, tmp_path, capsys, **{"backend.options": {"shard_base": False}}
    )


def long_sft(base: OneProcess, out: Path) -> list[str]:
    """The sft run, 10 epochs of 8 one-row steps (80 steps), a checkpoint after each."""
    args = with_flags(base.args["sft"], output=str(out), accumulation="1", epochs="10")
    return [a for a in args if a != "--diag"]


def test_sigint_to_torchrun_stops_every_process_after_one_step_with_its_checkpoint(
    one_process: OneProcess, tmp_path: Path
) -> None:
    """Ctrl-C reaches the torchrun parent once step 3 is checkpointed: every process stops
    after the same step, rank 0 writes that step's checkpoint, and a 1-process resume from it
    ends with the bytes of the uninterrupted run."""
    out = tmp_path / "interrupted"
    args = long_sft(one_process, out)
    job = start_long_sft(one_process, out)
    job.send_signal(signal.SIGINT)
    _, stderr = job.communicate(timeout=60)
    assert job.returncode != 0
    ours = [line for line in stderr.splitlines() if line.startswith("twinrun: ")]
    assert len(ours) == 2 and ours[0] == ours[1], ours  # both ranks, the same step
    newest = sorted(p.name for p in (out / "checkpoints").iterdir())[-1]
    done = int(newest.removeprefix("step-"))
    assert 3 <= done < 80
    assert ours[0] == (
        f"twinrun: error: interrupted (SIGINT) with {done} of 80 steps done: checkpoint "
        f"step-{done:06d} written — rerun the same command with --resume to continue from it"
    )
    assert not (out / "adapter_model.safetensors").exists()
    assert not (out / "metrics.jsonl").exists()  # a finished run's file
    # the uninterrupted run, and the interrupted one resumed on one process unsharded
    assert run_cli(long_sft(one_process, tmp_path / "whole")) == 0
    assert run_cli([*args, "--resume"]) == 0
    assert sha256_of(out / "adapter_model.safetensors") == sha256_of(
        tmp_path / "whole" / "adapter_model.safetensors"
    )
    assert timeless(metrics(out)) == timeless(metrics(tmp_path / "whole"))


def rank_pid(parent: int, rank: int) -> int:
    """The pid of torchrun's worker process of this rank (read from its environment)."""
    for child in Path(f"/proc/{parent}/task/{parent}/children").read_text().split():
        environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        if f"RANK={rank}".encode() in environ:
            return int(child)
    raise AssertionError(f"no worker of rank {rank} under {parent}")


def start_long_sft(
    base: OneProcess, out: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """The long sft run, sharded on 2 processes, once its step 3 is checkpointed (600 s at
    most: a hang, far from the seconds it takes)."""
    cmd, full_env = launch_env(2, ["-m", "twinrun", *long_sft(base, out), "--shard-base"],
                               (base.data,), env)  # fmt: skip
    job = subprocess.Popen(
        cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 600
    while not (out / "checkpoints" / "step-000003").is_dir():
        assert job.poll() is None and time.monotonic() < deadline, "the run never reached step 3"
        time.sleep(0.05)
    return job


def test_a_killed_rank_ends_every_sharded_process(one_process: OneProcess, tmp_path: Path) -> None:
    """SIGKILL of rank 1 while the sharded steps run: torchrun ends rank 0 long before the
    collective timeout (FAULT_TIMEOUT_S here); no adapter or sidecar is written, and the
    checkpoints there are whole (a 1-process resume from the newest runs to the end)."""
    out = tmp_path / "killed"
    job = start_long_sft(one_process, out, FAULT_ENV)
    t0 = time.monotonic()
    os.kill(rank_pid(job.pid, 1), signal.SIGKILL)
    _, stderr = job.communicate(timeout=FAULT_TIMEOUT_S + 120)
    assert job.returncode != 0 and "Signal 9 (SIGKILL)" in stderr
    assert time.monotonic() - t0 < FAULT_TIMEOUT_S  # rank 0 did not wait for the timeout
    assert not (out / "adapter_model.safetensors").exists()
    assert not (out / "twinrun.json").exists()
    assert run_cli([*long_sft(one_process, out), "--resume"]) == 0


def test_two_nodes_of_two_processes_write_the_bytes_of_one(
    one_process: OneProcess, tmp_path: Path
) -> None:
    """Two torchrun launchers (one per "node") meet at a c10d rendezvous on loopback: 4
    processes, the base sharded over all of them, write the 1-process sft and dpo bytes."""
    port = free_port()
    outs = {name: tmp_path / name for name in ("sft", "dpo")}
    spec = tmp_path / "runs.json"
    spec.write_text(
        json.dumps([one_process.elsewhere(n, out, "--shard-base") for n, out in outs.items()])
    )
    rdzv = ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--rdzv-id", "twinrun-test"]  # fmt: skip
    nodes = []
    for _ in range(2):
        cmd, env = launch_env(2, [str(MANY), str(spec)], (one_process.data,), rdzv=rdzv)
        nodes.append(
            subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        )  # fmt: skip
    for node in nodes:
        _, err = node.communicate(timeout=240)
        assert node.returncode == 0, err[-3000:]
    for name, out in outs.items():
        assert_same_run(out, one_process.one[name])
        assert json.loads((out / "twinrun.json").read_text())["runtime"]["processes"] == 4
