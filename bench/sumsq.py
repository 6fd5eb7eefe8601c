"""Benchmark: exact `twinrun.diag.sumsq` vs a naive float64 `(x.double()**2).sum()`.

Both run side by side in one process on the same tensor (default: 16M float32 values from a
seeded normal), alternating order each repeat. Reports medians, min/max and the ratio of the
medians; the goal is exact <= 3x naive. Also times bfloat16 and float64 inputs (fewer repeats).

    python -m bench sumsq [--n 16777216] [--repeats 9] [--threads N]

Writes bench/results/sumsq.json and bench/results/sumsq.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Callable

import benchkit
import torch

from twinrun.diag.checksum import sumsq

GOAL = 3.0


def naive(x: torch.Tensor) -> float:
    return float((x.double() ** 2).sum())


def timed(fn: Callable[[torch.Tensor], float], x: torch.Tensor) -> tuple[float, float]:
    t0 = time.perf_counter()
    v = fn(x)
    return time.perf_counter() - t0, v


def pair(x: torch.Tensor, repeats: int) -> dict[str, object]:
    naive(x), sumsq(x)  # warm up allocators and kernels
    tn: list[float] = []
    te: list[float] = []
    vals: dict[str, float] = {}
    for i in range(repeats):
        order = [("naive", naive), ("exact", sumsq)]
        for name, fn in benchkit.alternating(order, i):
            t, v = timed(fn, x)
            (tn if name == "naive" else te).append(t)
            vals[name] = v
    sn, se = benchkit.spread(tn, 6), benchkit.spread(te, 6)
    return {
        "dtype": str(x.dtype).removeprefix("torch."),
        "n": x.numel(),
        "repeats": repeats,
        "naive_s": sn,
        "exact_s": se,
        "ratio_median": se["median"] / sn["median"],
        "value_exact": vals["exact"],
        "value_naive": vals["naive"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=16 * 1024 * 1024)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.n, generator=g)
    load_before = os.getloadavg()[0]
    threads = torch.get_num_threads()
    main_row = pair(x, args.repeats)
    main_row["threads"] = threads
    others = []
    if threads != 1:  # single-threaded too: immune to OpenMP barrier stalls on a busy machine
        torch.set_num_threads(1)
        one = pair(x, args.repeats)
        one["threads"] = 1
        others.append(one)
    for dt in (torch.bfloat16, torch.float64):
        row = pair(x.to(dt), 3)
        row["threads"] = torch.get_num_threads()
        others.append(row)
    torch.set_num_threads(threads)
    out = {
        "benchmark": "sumsq",
        "goal": f"exact <= {GOAL}x naive (float32, median)",
        "pass": main_row["ratio_median"] <= GOAL,
        "float32": main_row,
        "other_dtypes": others,
        "env": {
            "loadavg_1min_before": load_before,
            "loadavg_1min_after": os.getloadavg()[0],
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "cpus": os.cpu_count(),
            "machine": platform.machine(),
            "processor": platform.processor(),
            "python": platform.python_version(),
        },
    }
    lines = [
        "# sumsq: exact vs naive float64",
        "",
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, 1-min load average "
        f"{load_before:.2f} before / {out['env']['loadavg_1min_after']:.2f} after; "
        "input: seeded normal; naive and exact alternate on the same tensor.",
        "",
        "| dtype | threads | n | repeats | naive median s (min–max) | exact median s (min–max) "
        "| ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in [main_row, *others]:
        sn, se = r["naive_s"], r["exact_s"]
        lines.append(
            f"| {r['dtype']} | {r['threads']} | {r['n']:,} | {r['repeats']} "
            f"| {sn['median']:.4f} ({sn['min']:.4f}–{sn['max']:.4f}) "
            f"| {se['median']:.4f} ({se['min']:.4f}–{se['max']:.4f}) "
            f"| {r['ratio_median']:.2f}x |"
        )
    verdict = "PASS" if out["pass"] else "FAIL"
    lines += ["", f"Goal (float32): exact <= {GOAL}x naive — {verdict}.", ""]
    benchkit.write_results("sumsq", out, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
