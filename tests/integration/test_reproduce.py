"""`twinrun reproduce RUN --output DIR`: a run of every objective re-run from its sidecar alone
writes the same bytes (exit 0); a moved or missing input is "could not run" (exit 2) naming the
file; a run recorded with other environment facts diverges (exit 1) and names them; a run made
under torchrun reproduces on one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.toy_runs import (
    OBJECTIVES,
    SHAPED_MODULE,
    run_args,
    sha256_of,
    text_args,
    write_corpus,
    write_examples,
)
from tests.distributed.launch import torchrun
from twinrun.cli.main import run_cli

OUTPUTS = ("adapter_model.safetensors", "reward_head.safetensors", "diag.jsonl")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_examples(tmp_path_factory.mktemp("data"))


def reproduce(run: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    capsys.readouterr()
    confirm: list[str] = []  # a run of a plugin reproduces only when the plugin is named
    sidecar = run / "twinrun.json"
    env = json.loads(sidecar.read_text()).get("train", {}).get("env") if sidecar.is_file() else None
    if isinstance(env, str) and env == f"{SHAPED_MODULE}:make":
        confirm = ["--env", env]
    rc = run_cli(["reproduce", str(run), "--output", str(out), *confirm])
    return rc, capsys.readouterr().out.splitlines()


def same_outputs(a: Path, b: Path) -> None:
    names = [n for n in OUTPUTS if (a / n).is_file()]
    assert "adapter_model.safetensors" in names
    for name in names:
        assert sha256_of(a / name) == sha256_of(b / name), name


@pytest.mark.parametrize("objective", [*OBJECTIVES, "text"])
def test_a_run_of_every_objective_reproduces_bit_for_bit(
    tmp_path: Path, toy_model_dir: Path, data: dict[str, Path], objective: str,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    run = tmp_path / "run"
    if objective == "text":
        args = text_args(toy_model_dir, write_corpus(tmp_path / "corpus"), run, "--diag")
    else:
        args = run_args(objective, toy_model_dir, data[objective], run, "--diag")
    assert run_cli(args) == 0
    rc, lines = reproduce(run, tmp_path / "again", capsys)
    assert rc == 0, lines
    sha = sha256_of(run / "adapter_model.safetensors")
    assert lines[0].startswith(f"reproduce: REPRODUCED bit for bit — adapter sha256 {sha}")
    same_outputs(run, tmp_path / "again")


def test_a_changed_or_missing_examples_file_cannot_run(
    tmp_path: Path, toy_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    examples = write_examples(tmp_path / "data")["sft"]
    run = tmp_path / "run"
    assert run_cli(run_args("sft", toy_model_dir, examples, run)) == 0
    examples.write_text(examples.read_text() + examples.read_text().splitlines()[0] + "\n")
    rc, lines = reproduce(run, tmp_path / "again", capsys)
    assert rc == 2 and lines == [lines[0]]
    assert f"could not run — the examples file {examples} changed: recorded sha256" in lines[0]
    assert not (tmp_path / "again").exists()  # refused before anything was written
    examples.unlink()
    rc, lines = reproduce(run, tmp_path / "again", capsys)
    assert rc == 2 and f"the recorded examples file {examples} is missing" in lines[0]


def test_a_directory_without_a_sidecar_cannot_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, lines = reproduce(tmp_path, tmp_path / "again", capsys)
    assert rc == 2 and lines == [f"reproduce: could not run — {tmp_path} has no twinrun.json — "
                                 "give the directory a run wrote"]  # fmt: skip


def test_a_run_on_other_cpu_kernels_diverges_and_names_them(
    tmp_path: Path, toy_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The run is made in a fresh process on ATen's DEFAULT kernels (what a CPU without AVX2
    would run); this process runs AVX2 kernels, so the re-run's bytes differ, and the verdict
    names the recorded facts that differ and the first divergence."""
    examples = write_examples(tmp_path / "data")["sft"]
    run = tmp_path / "run"
    args = run_args("sft", toy_model_dir, examples, run, "--diag", "--cpu-kernels", "native")
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "MKL_CBWR")}
    done = subprocess.run([sys.executable, "-m", "twinrun", *args], capture_output=True,
                          text=True, env=env | {"ATEN_CPU_CAPABILITY": "default"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    recorded = json.loads((run / "twinrun.json").read_text())["determinism"]["cpu_kernels"]
    assert recorded["mode"] == "native" and recorded["aten_capability"] == "DEFAULT"
    rc, lines = reproduce(run, tmp_path / "again", capsys)
    assert rc == 1, lines
    assert lines[0] == "reproduce: DIVERGED — the re-run wrote other bytes"
    facts = lines[lines.index("recorded facts that differ:") + 1 :]
    assert any(f.startswith("  determinism.cpu_kernels.aten_capability: recorded=\"DEFAULT\" "
                            "re-run=\"AVX2\" (environment)") for f in facts), lines  # fmt: skip
    assert any(f.startswith("FIRST_DIVERGENCE: step=0 ") for f in facts), lines
    assert lines[-1].startswith("why: the run used --cpu-kernels native on ")
    assert lines[-1].endswith("train it with --cpu-kernels portable for bytes every x86-64 CPU "
                              "writes")  # fmt: skip


def test_a_native_run_reproduces_on_the_same_machine(tmp_path: Path, toy_model_dir: Path) -> None:
    """A native run and its reproduction, each a fresh `python -m twinrun` process as a user runs
    them (ATen chooses its kernels once per process, at its first kernel): the re-run takes the
    machine's own kernels as the run did — reproduce's check of the run's adapter runs a kernel
    before the re-run starts, and it must not fix them at the portable mode's AVX2."""
    examples = write_examples(tmp_path / "data")["sft"]
    run, again = tmp_path / "run", tmp_path / "again"
    args = run_args("sft", toy_model_dir, examples, run, "--diag", "--cpu-kernels", "native")
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "MKL_CBWR")}
    for argv in (args, ["reproduce", str(run), "--output", str(again)]):
        done = subprocess.run([sys.executable, "-m", "twinrun", *argv], capture_output=True,
                              text=True, env=env)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("reproduce: REPRODUCED bit for bit"), done.stdout
    kernels = [json.loads((d / "twinrun.json").read_text())["determinism"]["cpu_kernels"]
               for d in (run, again)]  # fmt: skip
    assert kernels[0]["aten_capability"] == kernels[1]["aten_capability"]
    assert kernels[0]["aten_capability"] == kernels[0]["native_capability"]
    same_outputs(run, again)


def test_a_torchrun_run_reproduces_on_one_process(
    tmp_path: Path, toy_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    examples = write_examples(tmp_path / "data")["sft"]
    run = tmp_path / "run"
    job = torchrun(2, ["-m", "twinrun", *run_args("sft", toy_model_dir, examples, run, "--diag")])
    assert job.returncode == 0, job.stderr[-2000:]
    rc, lines = reproduce(run, tmp_path / "again", capsys)
    assert rc == 0, lines
    assert "  runtime.processes: recorded=2 re-run=null (environment)" in lines
    same_outputs(run, tmp_path / "again")
