"""Benchmark: what the portable CPU kernels (`--cpu-kernels portable`: exact matrix products, own
transcendental functions, ATen's AVX2 kernels) cost per step against the machine's own
(`native`), and which libraries decide the bytes.

Cost. SFT with LoRA rank 8 (q/k/v/o), f32, chat template on, seed 1, lr 1e-3:
- the toy model (`twinrun toy-model --seed 0`), the 64 shipped SFT examples, batch 4, 1 epoch
  (16 steps), one thread;
- SmolLM2-135M (`python -m testkit.smollm2` builds/caches it), the first 8 shipped examples,
  batch 2, 1 epoch (4 steps), at one and at two threads.
Each pair is one fresh `twinrun tune sft` process per mode, the order alternating. Per step: the
loop's `wall_s` from metrics.jsonl (step 0 left out); portable / native is the ratio of the
pooled medians, with the per-pair ratios as its spread.

What decides the bytes (toy, one thread): the adapter SHA256 of native and portable runs with
one library's code path moved by its own variable — ATen's capability
(`ATEN_CPU_CAPABILITY=default`, native only: the portable mode pins it), MKL's branch
(`MKL_CBWR=COMPATIBLE`, `MKL_CBWR=AVX2`) — and whether oneDNN ran at all (`ONEDNN_VERBOSE=1`
lines). Native bytes move with MKL's branch; portable bytes must not.

    python -m bench portable_cost [--pairs 3] [--smollm2-pairs 2] [--no-smollm2]

Writes bench/results/portable_cost.json, .md and the `portable_cost` section of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import benchkit
from benchkit import ms_spread as fmt
from benchkit import smollm2_dir, update_docs_section, write_toy

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "src" / "twinrun" / "examples" / "sft.jsonl"
PINNED = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "ONEDNN_VERBOSE")


def sft(
    model: Path, examples: Path, out: Path, batch: int, mode: str, threads: int,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    cmd = [
        sys.executable, "-m", "twinrun", "tune", "sft", "--model", str(model),
        "--examples", str(examples), "--output", str(out), "--seed", "1", "--epochs", "1",
        "--batch-size", str(batch), "--accumulation", "1", "--learning-rate", "1e-3",
        "--warmup-steps", "0", "--lr-schedule", "cosine", "--lora-rank", "8", "--lora-alpha", "16",
        "--precision", "f32", "--chat-template", "on", "--threads", str(threads), "--quiet",
        "--cpu-kernels", mode,
    ]  # fmt: skip
    clean = {k: v for k, v in os.environ.items() if k not in PINNED}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=clean | (env or {}))
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x]
    sidecar = json.loads((out / "twinrun.json").read_text())
    return {
        "wall_s": [r["wall_s"] for r in rows[1:]],
        "adapter_sha256": hashlib.sha256(
            (out / "adapter_model.safetensors").read_bytes()
        ).hexdigest(),
        "cpu_kernels": sidecar["determinism"]["cpu_kernels"],
        "onednn_lines": proc.stdout.count("onednn_verbose") + proc.stderr.count("onednn_verbose"),
    }


def measure(
    model: Path, examples: Path, batch: int, pairs: int, threads: int, work: Path
) -> dict[str, Any]:
    runs = []
    for i in range(pairs):
        order = benchkit.alternating(("portable", "native"), i)
        runs.append({m: sft(model, examples, work / f"{model.name}-{threads}-{i}-{m}", batch, m,
                            threads) for m in order})  # fmt: skip
    pooled = {m: [x for r in runs for x in r[m]["wall_s"]] for m in ("portable", "native")}
    med = statistics.median
    per_pair = [med(r["portable"]["wall_s"]) / med(r["native"]["wall_s"]) for r in runs]
    return {
        "threads": threads,
        "portable_step_s": benchkit.spread(pooled["portable"], 5),
        "native_step_s": benchkit.spread(pooled["native"], 5),
        "ratio": statistics.median(pooled["portable"]) / statistics.median(pooled["native"]),
        "ratio_per_pair": benchkit.spread(per_pair, 3),
        "portable_sha256": sorted({r["portable"]["adapter_sha256"] for r in runs}),
        "native_sha256": sorted({r["native"]["adapter_sha256"] for r in runs}),
        "runs": runs,
    }


def deciders(model: Path, work: Path) -> list[dict[str, Any]]:
    """One toy run per code-path variant (see the module docstring)."""
    variants = [
        ("native", "native", {}),
        ("native, ATen DEFAULT (`ATEN_CPU_CAPABILITY=default`)", "native",
         {"ATEN_CPU_CAPABILITY": "default"}),
        ("native, MKL COMPATIBLE (`MKL_CBWR=COMPATIBLE`)", "native", {"MKL_CBWR": "COMPATIBLE"}),
        ("native, MKL AVX2 (`MKL_CBWR=AVX2`)", "native", {"MKL_CBWR": "AVX2"}),
        ("portable (oneDNN traced: `ONEDNN_VERBOSE=1`)", "portable", {"ONEDNN_VERBOSE": "1"}),
        ("portable, MKL COMPATIBLE (`MKL_CBWR=COMPATIBLE`)", "portable",
         {"MKL_CBWR": "COMPATIBLE"}),
        ("portable, MKL AVX2 (`MKL_CBWR=AVX2`)", "portable", {"MKL_CBWR": "AVX2"}),
    ]  # fmt: skip
    out = []
    for i, (name, mode, env) in enumerate(variants):
        r = sft(model, EXAMPLES, work / f"decide-{i}", 4, mode, 1, env)
        keep = ("adapter_sha256", "cpu_kernels", "onednn_lines")
        out.append({"variant": name, **{k: r[k] for k in keep}})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--smollm2-pairs", type=int, default=2)
    ap.add_argument("--no-smollm2", action="store_true")
    a = ap.parse_args()
    load0 = os.getloadavg()[0]
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        toy = write_toy(work / "toy")
        result["decide"] = deciders(toy, work)
        result["toy-1"] = measure(toy, EXAMPLES, 4, a.pairs, 1, work)
        if not a.no_smollm2:
            sm = smollm2_dir()
            few = work / "sft8.jsonl"
            few.write_text("".join(EXAMPLES.read_text().splitlines(True)[:8]))
            for threads in (1, 2):
                result[f"smollm2-{threads}"] = measure(sm, few, 2, a.smollm2_pairs, threads, work)
    meta = benchkit.meta(
        load0, "torch", "transformers", python=platform.python_version(),
        native_capability=result["decide"][0]["cpu_kernels"]["native_capability"],
    )  # fmt: skip
    lines = [
        f"Measured {meta['when']} by `python -m bench portable_cost` on {meta['cpu_count']} CPUs "
        f"({meta['cpu']}, {meta['native_capability']}), torch {meta['torch']}, commit "
        f"{meta['git_commit']}; load average {load0:.2f} at start, {meta['load_avg_end']:.2f} at "
        "end. SFT, LoRA rank 8, f32; per-step `wall_s` in ms, median (min–max), step 0 left out.",
        "",
        "| model | threads | pairs | portable | native | portable / native (per pair) |",
        "|---|---|---|---|---|---|",
    ]  # fmt: skip
    names = {"toy-1": "toy (batch 4)", "smollm2-1": "SmolLM2-135M (batch 2)",
             "smollm2-2": "SmolLM2-135M (batch 2)"}  # fmt: skip
    for key, name in names.items():
        if key not in result:
            continue
        r = result[key]
        pp = r["ratio_per_pair"]
        lines.append(
            f"| {name} | {r['threads']} | {len(r['runs'])} | {fmt(r['portable_step_s'])} | "
            f"{fmt(r['native_step_s'])} | **{r['ratio']:.2f}×** ({pp['min']:.2f}–{pp['max']:.2f}) |"
        )
    lines += ["", "What decides the bytes (toy, one thread; adapter SHA256, first 12 digits):", "",
              "| run | ATen | MKL branch | exact products | oneDNN on | oneDNN calls | adapter |",
              "|---|---|---|---|---|---|---|"]  # fmt: skip
    for d in result["decide"]:
        k = d["cpu_kernels"]
        lines.append(f"| {d['variant']} | {k['aten_capability']} | {k['mkl_cbwr']} | "
                     f"{'yes' if k.get('exact_products') else 'no'} | "
                     f"{'yes' if k['onednn'] else 'no'} | {d['onednn_lines']} | "
                     f"`{d['adapter_sha256'][:12]}` |")  # fmt: skip
    md = "\n".join(lines)
    print(md)
    doc = {"meta": meta, **result}
    benchkit.write_results("portable_cost", doc, "# Portable CPU kernels: cost\n\n" + md + "\n")
    intro = ("What the portable CPU kernels cost per step against the machine's own, and which "
             "libraries decide the bytes (`python -m bench portable_cost`).")  # fmt: skip
    update_docs_section("portable_cost", "Portable CPU kernels: cost", intro, md)


if __name__ == "__main__":
    main()
