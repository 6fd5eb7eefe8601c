"""`python -m bench`: the registry names every benchmark script in bench/, `--list` prints each,
an unknown name is one line, and every benchmark runs with `--quick` — in seconds, into a
temporary folder, leaving bench/results/ and docs/ as they were — or, where it cannot be made
that small, says in one line what it needs."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.registry import BENCH, BENCHMARKS, BY_NAME, HELPERS

ROOT = Path(__file__).resolve().parents[2]
QUICK = [b.name for b in BENCHMARKS if b.quick_skip is None]
SKIPPED = [b.name for b in BENCHMARKS if b.quick_skip is not None]


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m bench ARGS` as a user runs it: without the suite's portable-kernels default
    (tests/conftest.py) or the pin it sets, so each benchmark runs at its own defaults."""
    from twinrun.core.pinning import user_environment

    env = user_environment()
    env.pop("TWINRUN_CPU_KERNELS", None)
    return subprocess.run(
        [sys.executable, "-m", "bench", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )


def committed_outputs() -> dict[str, str]:
    """SHA256 of every file a full run writes: bench/results/* and the docs pages."""
    files = [*(ROOT / "bench" / "results").glob("*"), *(ROOT / "docs").glob("*.md")]
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files if p.is_file()}


def test_every_script_in_bench_is_a_benchmark_or_a_named_helper() -> None:
    scripts = {p.stem for p in BENCH.glob("*.py")}
    registered = {b.script for b in BENCHMARKS}
    assert scripts == registered | set(HELPERS), "register it in bench/registry.py"
    assert not registered & set(HELPERS)
    assert len(BY_NAME) == len(BENCHMARKS)
    for b in BENCHMARKS:
        assert b.path.is_file(), b.name
        assert b.results and all(r.startswith(b.name) for r in b.results), b.name
        assert all((ROOT / t).is_file() for t in b.tests), b.name
        assert (b.kind == "sweep") <= bool(b.tests), f"{b.name}: a sweep names its tests"


def test_list_names_every_benchmark_with_its_goal() -> None:
    proc = bench("--list")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    named = [ln.split()[0] for ln in lines if ln and not ln[0].isspace()]
    assert named == [b.name for b in BENCHMARKS]
    goals = [ln.split("goal: ", 1)[1] for ln in lines if ln.lstrip().startswith("goal: ")]
    assert goals == [b.goal or "none (the figures inform)" for b in BENCHMARKS]


def test_an_unknown_name_is_one_line_with_the_closest_name() -> None:
    proc = bench("sumq", "--quick")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == "bench: no benchmark named 'sumq'; did you mean sumsq?\n"


@pytest.mark.parametrize("name", SKIPPED)
def test_quick_says_in_one_line_what_a_long_benchmark_needs(name: str) -> None:
    proc = bench(name, "--quick")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{name}: skipped: needs {BY_NAME[name].quick_skip}\n"


@pytest.mark.slow  # a few fresh processes on the toy model each, seconds
@pytest.mark.parametrize("name", QUICK)
def test_quick_runs_and_writes_only_to_its_own_folder(name: str, tmp_path: Path) -> None:
    before = committed_outputs()
    proc = bench(name, "--quick", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    written = sorted(p.name for p in (tmp_path / "results").iterdir())
    assert written == sorted(BY_NAME[name].results)
    assert committed_outputs() == before
    assert os.listdir(tmp_path) in (["results"], ["results", "docs"], ["docs", "results"])
