"""Benchmark: what strict deterministic mode (`--strict`, the default) costs per step, and
whether it changes a byte.

SFT with LoRA rank 8 (q/k/v/o), f32, chat template on, one torch thread, seed 1, lr 1e-3, on
two models:
- the toy model (`twinrun toy-model --seed 0`), the 64 shipped SFT examples, batch 4, 1 epoch
  (16 steps);
- SmolLM2-135M (`python -m testkit.smollm2` builds/caches it), the first 8 shipped examples,
  batch 2, 1 epoch (4 steps).
Each pair is one fresh `twinrun tune sft` process with `--strict` and one with `--no-strict`,
the order alternating. Per step: the loop's `wall_s` from metrics.jsonl (step 0 left out);
strict / non-strict is the ratio of the pooled medians, with the per-pair ratios as its spread.
Bytes: the SHA256 of every run's adapter_model.safetensors, and whether the loss columns of
metrics.jsonl are equal.

    python -m bench strict_mode [--pairs 3] [--smollm2-pairs 2] [--no-smollm2]

Writes bench/results/strict_mode.json, .md and the `strict_mode` section of docs/benchmarks.md.
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


def sft(model: Path, examples: Path, out: Path, batch: int, strict: bool) -> dict[str, Any]:
    cmd = [
        sys.executable, "-m", "twinrun", "tune", "sft", "--model", str(model),
        "--examples", str(examples), "--output", str(out), "--seed", "1", "--epochs", "1",
        "--batch-size", str(batch), "--accumulation", "1", "--learning-rate", "1e-3",
        "--warmup-steps", "0", "--lr-schedule", "cosine", "--lora-rank", "8", "--lora-alpha", "16",
        "--precision", "f32",
        "--chat-template", "on", "--threads", "1", "--quiet",
        "--strict" if strict else "--no-strict",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x]
    adapter = (out / "adapter_model.safetensors").read_bytes()
    return {
        "wall_s": [r["wall_s"] for r in rows[1:]],
        "losses": [r["loss"] for r in rows],
        "adapter_sha256": hashlib.sha256(adapter).hexdigest(),
    }


def measure(model: Path, examples: Path, batch: int, pairs: int, work: Path) -> dict[str, Any]:
    runs = []
    for i in range(pairs):
        got = {}
        for strict in benchkit.alternating((True, False), i):
            mode = "strict" if strict else "plain"
            got[mode] = sft(model, examples, work / f"{model.name}-{i}-{mode}", batch, strict)
        runs.append(got)
    strict = [x for r in runs for x in r["strict"]["wall_s"]]
    plain = [x for r in runs for x in r["plain"]["wall_s"]]
    per_pair = [statistics.median(r["strict"]["wall_s"]) / statistics.median(r["plain"]["wall_s"])
                for r in runs]  # fmt: skip
    shas = {r[m]["adapter_sha256"] for r in runs for m in ("strict", "plain")}
    return {
        "steps_per_run": len(runs[0]["strict"]["losses"]),
        "strict_step_s": benchkit.spread(strict, 5),
        "plain_step_s": benchkit.spread(plain, 5),
        "ratio": statistics.median(strict) / statistics.median(plain),
        "ratio_per_pair": benchkit.spread(per_pair, 3),
        "adapter_sha256": sorted(shas),
        "same_bytes": len(shas) == 1,
        "same_losses": all(r["strict"]["losses"] == r["plain"]["losses"] for r in runs),
        "runs": runs,
    }


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
        result["toy"] = measure(write_toy(work / "toy"), EXAMPLES, 4, a.pairs, work)
        if not a.no_smollm2:
            sm = smollm2_dir()
            few = work / "sft8.jsonl"
            few.write_text("".join(EXAMPLES.read_text().splitlines(True)[:8]))
            result["smollm2"] = measure(sm, few, 2, a.smollm2_pairs, work)
    meta = benchkit.meta(load0, "torch", "transformers", python=platform.python_version())
    lines = [
        f"Measured {meta['when']} by `python -m bench strict_mode` on {meta['cpu_count']} CPUs "
        f"({meta['cpu']}), torch {meta['torch']}, transformers {meta['transformers']}, commit "
        f"{meta['git_commit']}; load average {load0:.2f} at start, {meta['load_avg_end']:.2f} at "
        "end. SFT, LoRA rank 8, f32, one thread; per-step `wall_s` in ms, median (min–max), "
        "step 0 left out.", "",
        "| model | steps/run | pairs | `--strict` | `--no-strict` | strict / non-strict "
        "(per pair) | same adapter bytes | same losses |",
        "|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for name, key in (("toy (batch 4)", "toy"), ("SmolLM2-135M (batch 2)", "smollm2")):
        if key not in result:
            continue
        r = result[key]
        pp = r["ratio_per_pair"]
        lines.append(
            f"| {name} | {r['steps_per_run']} | {len(r['runs'])} | {fmt(r['strict_step_s'])} | "
            f"{fmt(r['plain_step_s'])} | **{r['ratio']:.3f}×** ({pp['min']:.3f}–{pp['max']:.3f}) "
            f"| {'yes' if r['same_bytes'] else 'no'} | {'yes' if r['same_losses'] else 'no'} |"
        )
    same = all(r["same_bytes"] for r in result.values())
    lines += [
        "",
        "On the CPU strict mode sets `torch.use_deterministic_algorithms(True)`, the thread "
        "count and the attention implementation, and checks and records each; on CUDA it also "
        "pins cuBLAS workspaces and cuDNN (not measured here: no GPU on this machine). Measured: "
        + ("every run of a model, strict or not, wrote the same adapter bytes."
           if same else "the adapter bytes differ between modes (see the SHA256s in the JSON)."),
    ]  # fmt: skip
    md = "\n".join(lines)
    print(md)
    res = {"meta": meta, **result}
    benchkit.write_results("strict_mode", res, "# Strict mode: cost and bytes\n\n" + md + "\n")
    intro = ("What `--strict` (the default) costs per step and whether it changes a byte "
             "(`python -m bench strict_mode`).")  # fmt: skip
    update_docs_section("strict_mode", "Strict mode: cost and bytes", intro, md)


if __name__ == "__main__":
    main()
