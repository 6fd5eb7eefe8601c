"""Every config in examples/ runs: each trainer's writes its run directory, and the capture
source, its pinned replays and `twinrun evidence --require A --require B` pass, in-process; the
commands of docs/capture.md §4 pass gate B on the native kernels, as a user's shell runs them."""

from __future__ import annotations

import hashlib
import json
import os
import runpy
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from twinrun.cli.main import run_cli
from twinrun.objectives.registry import NAMES

from .conftest import REPO

EXAMPLES = REPO / "examples"
TRAINERS = NAMES  # every objective has an example config
RUN_FILES = ("adapter_model.safetensors", "adapter_config.json", "twinrun.json", "metrics.jsonl",
             "diag.jsonl")  # fmt: skip


def metrics(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_every_config_in_examples_is_run_here() -> None:
    tested = {f"{t}.toml" for t in TRAINERS} | {"capture-source.toml", "capture-replay.toml"}
    assert {p.name for p in EXAMPLES.glob("*.toml")} == tested


@pytest.mark.parametrize("trainer", TRAINERS)
def test_trainer_config_runs(repo_like: Path, trainer: str) -> None:
    config = tomllib.loads((EXAMPLES / f"{trainer}.toml").read_text())
    assert config["training"]["trainer"] == trainer
    assert run_cli(["run", f"examples/{trainer}.toml", "--quiet"]) == 0
    out = repo_like / config["logging"]["dir"]
    for name in RUN_FILES:
        assert (out / name).is_file(), name
    sidecar = json.loads((out / "twinrun.json").read_text())
    assert sidecar["train"]["objective"] == trainer
    rows = metrics(out)
    planned = config["training"].get("stop_after", config["training"].get("max_steps"))
    assert [r["step"] for r in rows] == list(range(planned))
    adapter = hashlib.sha256((out / "adapter_model.safetensors").read_bytes()).hexdigest()
    assert sidecar["adapter"]["sha256"] == adapter
    if trainer == "reward":
        assert (out / "reward_head.safetensors").is_file()


def test_capture_replay_evidence(repo_like: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["init-adapter", "runs/examples/init", "--model", "runs/toy", "--seed", "5",
                    "--lora-rank", "4", "--lora-alpha", "8"]) == 0  # fmt: skip
    assert run_cli(["run", "examples/capture-source.toml", "--quiet"]) == 0
    source = repo_like / "runs/examples/source"
    assert (source / "optimizer_batch_step_000000.manifest.json").is_file()

    # The template's placeholders are refused before anything is written.
    assert run_cli(["run", "examples/capture-replay.toml", "--quiet"]) != 0
    assert not (repo_like / "runs/examples/replay-1").exists()

    argv = sys.argv
    sys.argv = ["pin_replay.py", str(source), "examples/capture-replay.toml",
                "runs/examples/replay.toml"]  # fmt: skip
    try:
        runpy.run_path(str(EXAMPLES / "pin_replay.py"), run_name="__main__")
    finally:
        sys.argv = argv
    pinned = tomllib.loads((repo_like / "runs/examples/replay.toml").read_text())
    row = metrics(source)[0]
    assert (
        pinned["optimizer_batch"]["expected_logical_sha256"]
        == row["optimizer/logical_batch_sha256"]
    )
    manifest = source / "optimizer_batch_step_000000.manifest.json"
    assert (
        pinned["optimizer_batch"]["expected_manifest_sha256"]
        == hashlib.sha256(manifest.read_bytes()).hexdigest()
    )

    assert run_cli(["explain", "runs/examples/replay.toml"]) == 0
    assert run_cli(["run", "runs/examples/replay.toml", "--quiet"]) == 0
    assert run_cli(["run", "runs/examples/replay.toml", "--output", "runs/examples/replay-2",
                    "--quiet"]) == 0  # fmt: skip
    capsys.readouterr()
    code = run_cli(["evidence", "runs/examples/source", "runs/examples/replay-1",
                    "runs/examples/replay-2", "--require", "A", "--require", "B"])  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "gate A (exact-input systems claim): PASS" in printed
    assert "gate B (bitwise update claim): PASS" in printed
    final = {
        hashlib.sha256((repo_like / d / "final/adapter_model.safetensors").read_bytes()).digest()
        for d in ("runs/examples/source", "runs/examples/replay-1", "runs/examples/replay-2")
    }
    assert len(final) == 1


@pytest.mark.slow  # six twinrun processes
def test_the_documented_evidence_commands_pass_gate_b_on_native_kernels(repo_like: Path) -> None:
    """docs/capture.md §4, each command its own process from a shell that sets nothing (the
    native kernels): `evidence … --repeat 1 … --require B` starts its replay with the user's
    environment, not the portable pin its own start-up set, so the replay runs the kernels its
    source ran, records them, and writes its bytes."""
    shell = {k: v for k, v in os.environ.items()
             if k not in ("ATEN_CPU_CAPABILITY", "TWINRUN_CPU_KERNELS")}  # fmt: skip
    shell["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), shell.get("PYTHONPATH", "")])

    def twinrun(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "twinrun", *args], env=shell,
                              capture_output=True, text=True, check=False)  # fmt: skip
        assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-2000:])
        return done.stdout

    twinrun("init-adapter", "runs/examples/init", "--model", "runs/toy", "--seed", "5",
            "--lora-rank", "4", "--lora-alpha", "8")  # fmt: skip
    twinrun("run", "examples/capture-source.toml", "--quiet")
    pin = [sys.executable, "examples/pin_replay.py", "runs/examples/source",
           "examples/capture-replay.toml", "runs/examples/replay.toml"]  # fmt: skip
    subprocess.run(pin, env=shell, check=True, capture_output=True)
    twinrun("run", "runs/examples/replay.toml", "--quiet")
    report = json.loads(twinrun("evidence", "runs/examples/source", "runs/examples/replay-1",
                                "--repeat", "1", "runs/examples/replay.toml", "--require", "B",
                                "--json"))  # fmt: skip
    assert report["gates"]["B"]["ok"], report["gates"]["B"]
    runs = ("source", "replay-1", "replay-1.repeat-1")
    kernels = [
        json.loads((repo_like / "runs/examples" / r / "twinrun.json").read_text())["determinism"][
            "cpu_kernels"
        ]
        for r in runs
    ]
    fresh = subprocess.run([sys.executable, "-c", "import torch; "
                            "print(torch.backends.cpu.get_cpu_capability())"],
                           env=shell, capture_output=True, text=True, check=True)  # fmt: skip
    assert {(k["mode"], k["aten_capability"]) for k in kernels} == {
        ("native", fresh.stdout.strip())
    }
