"""The portable CPU kernels and the thread count, through the CLI: what a run records, what is
refused (one line, nothing written), and that the kernels decide the bytes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.toy_runs import run_args, sha256_of, write_examples
from twinrun.cli.main import run_cli


def without_threads(args: list[str]) -> list[str]:
    i = args.index("--threads")
    return args[:i] + args[i + 2 :]


def test_a_native_cpu_run_without_threads_is_refused(
    tmp_path: Path, toy_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    examples = write_examples(tmp_path / "data")["sft"]
    out = tmp_path / "run"
    args = without_threads(run_args("sft", toy_model_dir, examples, out, "--cpu-kernels", "native"))
    capsys.readouterr()
    assert run_cli(args) == 2
    err = capsys.readouterr().err
    assert err == ("twinrun: error: missing required flag: --threads — every training number "
                   "must be given (twinrun has no silent defaults), or --defaults trl takes "
                   "TRL's\n")  # fmt: skip
    assert not out.exists()


def test_a_run_records_the_portable_kernels(tmp_path: Path, toy_model_dir: Path) -> None:
    examples = write_examples(tmp_path / "data")["sft"]
    out = tmp_path / "run"
    assert run_cli(run_args("sft", toy_model_dir, examples, out)) == 0
    side = json.loads((out / "twinrun.json").read_text())
    kernels = side["determinism"]["cpu_kernels"]
    assert side["train"]["cpu_kernels"] == "portable" and kernels["mode"] == "portable"
    assert kernels["aten_capability"] == "AVX2" and kernels["exact_products"] is True
    assert kernels["portable_functions"] is True and kernels["sdpa_fused"] is False
    assert kernels["onednn"] is False and kernels["native_capability"] in ("AVX2", "AVX512")
    assert kernels["cpu_model"] == side["determinism"]["device_name"]
    assert kernels["promise"] == "the same bytes on every x86-64 CPU with AVX2, at any thread count"


def test_without_the_suites_default_a_run_takes_native_kernels_and_needs_threads(
    tmp_path: Path, toy_model_dir: Path
) -> None:
    """The suite sets TWINRUN_CPU_KERNELS=portable (tests/conftest.py); a user's shell does not:
    there the default is native, whose bytes depend on the thread count."""
    examples = write_examples(tmp_path / "data")["sft"]
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "TWINRUN_CPU_KERNELS"}
    args = without_threads(run_args("sft", toy_model_dir, examples, out))
    done = subprocess.run([sys.executable, "-m", "twinrun", *args], capture_output=True,
                          text=True, env=env)  # fmt: skip
    assert done.returncode == 2 and "missing required flag: --threads" in done.stderr
    assert not out.exists()
    done = subprocess.run([sys.executable, "-m", "twinrun", *args, "--threads", "1"],
                          capture_output=True, text=True, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    kernels = json.loads((out / "twinrun.json").read_text())["determinism"]["cpu_kernels"]
    assert kernels["mode"] == "native" and kernels["exact_products"] is False
    assert kernels["promise"].startswith("the same bytes on this kind of CPU (")


@pytest.mark.parametrize("extra", [[], ["--batch-invariant"]], ids=["padded", "batch-invariant"])
def test_threads_1_2_and_4_write_the_same_bytes_and_the_count_is_optional(
    tmp_path: Path, toy_model_dir: Path, extra: list[str]
) -> None:
    """Exact products and per-row sums: the thread count no longer shapes a portable run's
    bytes, so --threads may be left out (torch's default count is used and recorded)."""
    examples = write_examples(tmp_path / "data")["sft"]
    shas, recorded = {}, {}
    for name, threads in (("t1", "1"), ("t2", "2"), ("t4", "4"), ("default", None)):
        args = run_args("sft", toy_model_dir, examples, tmp_path / name, "--diag", *extra)
        if threads is None:
            args = without_threads(args)
        else:
            args[args.index("--threads") + 1] = threads
        assert run_cli(args) == 0
        shas[name] = sha256_of(tmp_path / name / "adapter_model.safetensors")
        side = json.loads((tmp_path / name / "twinrun.json").read_text())
        recorded[name] = (side["train"]["threads"], side["determinism"]["threads"])
    assert len(set(shas.values())) == 1, shas
    assert recorded["t4"] == (4, 4) and recorded["default"][0] is None
    assert recorded["default"][1] >= 1


def test_native_threads_1_and_2_may_differ_and_each_reproduces(
    tmp_path: Path, toy_model_dir: Path
) -> None:
    """Why native runs still name --threads: MKL's own sums split by thread."""
    examples = write_examples(tmp_path / "data")["sft"]
    shas = {}
    for name, threads in (("a1", "1"), ("b1", "1"), ("a2", "2"), ("b2", "2")):
        args = run_args("sft", toy_model_dir, examples, tmp_path / name, "--cpu-kernels", "native")
        args[args.index("--threads") + 1] = threads
        assert run_cli(args) == 0
        shas[name] = sha256_of(tmp_path / name / "adapter_model.safetensors")
    assert shas["a1"] == shas["b1"] and shas["a2"] == shas["b2"]


def test_kernels_that_did_not_take_are_refused_before_anything_is_written(
    tmp_path: Path, toy_model_dir: Path
) -> None:
    """A conflicting ATEN_CPU_CAPABILITY in the environment: a fresh process refuses the portable
    mode with one line (the same line torch gets when it chose its kernels too early)."""
    examples = write_examples(tmp_path / "data")["sft"]
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    done = subprocess.run(
        [sys.executable, "-m", "twinrun", *run_args("sft", toy_model_dir, examples, out)],
        capture_output=True, text=True, env=env | {"ATEN_CPU_CAPABILITY": "default"},
    )  # fmt: skip
    assert done.returncode != 0 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(
        "twinrun: error: portable CPU kernels did not take: torch runs DEFAULT kernels, not AVX2"
    )
    assert "ATEN_CPU_CAPABILITY=default" in done.stderr and "--cpu-kernels native" in done.stderr
    assert not out.exists()
