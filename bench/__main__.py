"""`python -m bench`: the benchmarks of bench/registry.py, listed and run.

    python -m bench --list                      # every benchmark: what it measures, its goal
    python -m bench NAME [ARGS...]              # run it (ARGS go to its script); writes
                                                # bench/results/ and its docs section
    python -m bench NAME --quick [--out DIR]    # a seconds-long run on the toy model, written
                                                # to DIR (default: a new temporary folder)

A benchmark runs as a fresh `python bench/<script>.py` process from the repository root, so that
what it measures starts as a user's process would. A quick run sets `TWINRUN_BENCH_OUT` (see
bench/benchkit.py): its results and docs sections go there, never over bench/results/ or docs/.
Errors are one line and exit 2.
"""

from __future__ import annotations

import argparse
import difflib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.registry import BENCHMARKS, BY_NAME, Benchmark

ROOT = Path(__file__).resolve().parent.parent
OUT_ENV = "TWINRUN_BENCH_OUT"  # benchkit.OUT_ENV (benchkit is imported by the scripts only)


def listing() -> str:
    width = max(len(b.name) for b in BENCHMARKS)
    lines = []
    for b in BENCHMARKS:
        tag = "" if b.kind == "benchmark" else f" [{b.kind}]"
        lines.append(f"{b.name:<{width}}  {b.measures}{tag}")
        lines.append(f"{'':<{width}}  goal: {b.goal or 'none (the figures inform)'}")
        if b.quick_skip:
            lines.append(f"{'':<{width}}  --quick: skipped (needs {b.quick_skip})")
    return "\n".join(lines)


def unknown(name: str) -> str:
    close = difflib.get_close_matches(name, list(BY_NAME), n=1)
    hint = f"; did you mean {close[0]}?" if close else "; `python -m bench --list` names them"
    return f"bench: no benchmark named {name!r}{hint}"


def run(b: Benchmark, quick: bool, out: Path | None, extra: list[str]) -> int:
    env = dict(os.environ)
    if quick and b.quick_skip:
        print(f"{b.name}: skipped: needs {b.quick_skip}")
        return 0
    if quick and out is None:
        out = Path(tempfile.mkdtemp(prefix=f"bench-{b.name}-"))
    if out is not None:
        env[OUT_ENV] = str(out.resolve())
    args = [*(b.quick if quick else ()), *extra]
    code = subprocess.run([sys.executable, str(b.path), *args], cwd=ROOT, env=env).returncode
    if out is not None:
        print(f"{b.name}: results in {out}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench",
        description="Run one of twinrun's benchmarks (bench/registry.py).",
        epilog="Any other argument goes to the benchmark's own script.",
    )
    ap.add_argument("name", nargs="?", help="the benchmark (see --list)")
    ap.add_argument("--list", action="store_true", help="list every benchmark and its goal")
    ap.add_argument("--quick", action="store_true", help="a seconds-long run; results to --out")
    ap.add_argument("--out", type=Path, help="write results and docs sections here instead")
    args, extra = ap.parse_known_args(argv)
    if args.list:
        print(listing())
        return 0
    if args.name is None:
        print("bench: name a benchmark (`python -m bench --list` names them)", file=sys.stderr)
        return 2
    if args.name not in BY_NAME:
        print(unknown(args.name), file=sys.stderr)
        return 2
    return run(BY_NAME[args.name], args.quick, args.out, extra)


if __name__ == "__main__":
    sys.exit(main())
