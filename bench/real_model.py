"""Benchmark: twinrun on a real checkpoint (SmolLM2-135M-Instruct) against a plain
transformers + PEFT loop, and the toy model's whole-process SFT time.

1. SmolLM2 SFT per step, one thread. twinrun = `python -m twinrun tune sft --threads 1`
   (eager attention, its default); plain = `bench/plain_sft.py --attention eager --threads 1`
   (transformers' `AutoModelForCausalLM` + `peft.get_peft_model`, torch AdamW). Both on the
   same token rows and batches (the plain loop uses twinrun's encoding and batch plan) and the
   same LoRA (rank 8 on q/k/v/o, twinrun's A init), f32. Per process, the per-step wall times of
   the `--steps` optimizer steps are read from its metrics.jsonl, step 0 (warm-up) left out,
   and their median taken; the processes alternate order per repeat. twinrun/plain is the ratio
   of the medians over repeats (per-repeat ratios give its spread). Goal ≤ 1.0.
2. SmolLM2 peak RSS (`ru_maxrss` from `os.wait4` on each process): twinrun / plain.
3. Toy whole-process SFT: wall time of a fresh `python -m twinrun tune sft` process on the toy
   model (`twinrun toy-model`, seed 0) over the shipped sft.jsonl, one epoch, batch 4 — the
   interpreter start, imports, model build and training. The issue's goal compares it with
   TRL's `SFTTrainer` on the same work (twinrun / TRL ≤ 0.7); TRL is not a dependency and is not
   measured here yet, so the table says so.

    python -m bench real_model [--repeats 3] [--steps 6] [--quick]

Writes bench/results/real_model.json and .md and the `real_model` section of
docs/benchmarks.md (`--quick`: 1 repeat, 3 steps, prints only).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import benchkit
from benchkit import ROOT, cpu_name, git, package_versions, spread, update_docs_section

sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

SHIPPED_SFT = ROOT / "src" / "twinrun" / "examples" / "sft.jsonl"
SEED, RANK, ALPHA, LR, BATCH = 0, 8, 16.0, 1e-3, 4


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, int]:
    """(wall seconds, peak RSS bytes) of one child process."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"failed: {' '.join(cmd)}")
    return wall, usage.ru_maxrss * 1024


def step_walls(run: Path) -> list[float]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["wall_s"] for r in rows[1:]]  # step 0 is the warm-up


def rows_file(work: Path, n: int) -> Path:
    path = work / f"sft{n}.jsonl"
    path.write_text("\n".join(SHIPPED_SFT.read_text().splitlines()[:n]) + "\n")
    return path


def twinrun_sft(model: Path, data: Path, out: Path, batch: int) -> list[str]:
    return [sys.executable, "-m", "twinrun", "tune", "sft", "--model", str(model),
            "--examples", str(data), "--output", str(out), "--seed", str(SEED), "--epochs", "1",
            "--batch-size", str(batch), "--accumulation", "1", "--learning-rate", str(LR),
            "--warmup-steps", "0", "--lr-schedule", "cosine", "--lora-rank", str(RANK),
            "--lora-alpha", str(ALPHA), "--precision", "f32", "--chat-template", "on",
            "--threads", "1", "--quiet"]  # fmt: skip


def plain_sft(model: Path, data: Path, out: Path) -> list[str]:
    return [sys.executable, str(ROOT / "bench" / "plain_sft.py"), "--model", str(model),
            "--examples", str(data), "--output", str(out), "--seed", str(SEED), "--epochs", "1",
            "--batch-size", str(BATCH), "--learning-rate", str(LR), "--warmup-steps", "0",
            "--lora-rank", str(RANK), "--lora-alpha", str(ALPHA), "--chat-template", "on",
            "--threads", "1", "--attention", "eager", "--twinrun-init"]  # fmt: skip


def measure(repeats: int, steps: int, work: Path) -> dict[str, Any]:
    from testkit.smollm2 import ensure_smollm2

    env = os.environ | {"PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    smol = ensure_smollm2()
    data = rows_file(work, BATCH * steps)
    toy = work / "toy"
    subprocess.run([sys.executable, "-m", "twinrun", "toy-model", str(toy), "--seed", "0"],
                   env=env, check=True, capture_output=True)  # fmt: skip
    per_step: dict[str, list[float]] = {"twinrun": [], "plain": []}
    rss: dict[str, list[int]] = {"twinrun": [], "plain": []}
    losses: dict[str, list[float]] = {}
    whole: dict[str, list[float]] = {"twinrun": []}
    for rep in range(repeats):
        order = ("twinrun", "plain") if rep % 2 == 0 else ("plain", "twinrun")
        for name in order:
            out = work / f"{name}-{rep}"
            cmd = (
                twinrun_sft(smol, data, out, BATCH)
                if name == "twinrun"
                else plain_sft(smol, data, out)
            )
            _, peak = timed(cmd, env)
            per_step[name].append(statistics.median(step_walls(out)))
            rss[name].append(peak)
            rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
            losses[name] = [r["loss"] for r in rows]
        wall, _ = timed(twinrun_sft(toy, SHIPPED_SFT, work / f"whole-{rep}", 4), env)
        whole["twinrun"].append(wall)
        print(f"  repeat {rep + 1}/{repeats}: per step twinrun {per_step['twinrun'][-1]:.3f} s, "
              f"plain {per_step['plain'][-1]:.3f} s; toy process twinrun "
              f"{whole['twinrun'][-1]:.2f} s", file=sys.stderr, flush=True)  # fmt: skip
    res: dict[str, Any] = {
        "smollm2": {
            "rows": BATCH * steps,
            "batch_size": BATCH,
            "steps": steps,
            "timed_steps": steps - 1,
            "per_step_s": {k: spread(v) for k, v in per_step.items()},
            "ratio_per_step": statistics.median(per_step["twinrun"])
            / statistics.median(per_step["plain"]),
            "ratio_per_step_per_repeat": spread(
                [a / b for a, b in zip(per_step["twinrun"], per_step["plain"], strict=True)]
            ),
            "max_rss_mib": {k: spread([x / 2**20 for x in v]) for k, v in rss.items()},
            "ratio_max_rss": statistics.median(rss["twinrun"]) / statistics.median(rss["plain"]),
            "losses": losses,
            "max_abs_loss_diff": max(
                abs(a - b) for a, b in zip(losses["twinrun"], losses["plain"], strict=True)
            ),
        },
        "toy_process_s": {k: spread(v) for k, v in whole.items()},
    }
    return res


def markdown(res: dict[str, Any]) -> str:
    s, m = res["smollm2"], res["machine"]

    def sp(d: dict[str, Any], fmt: str = "{:.3f}") -> str:
        return f"{fmt.format(d['median'])} ({fmt.format(d['min'])}–{fmt.format(d['max'])})"

    r = s["ratio_per_step_per_repeat"]
    lines = [
        f"{m['cpu']}, one thread, {res['repeats']} repeats, median (min–max); "
        f"torch {m['versions']['torch']}, transformers {m['versions']['transformers']}, "
        f"peft {m['versions']['peft']}; commit {m['commit']}.",
        "",
        "| measure | twinrun | reference | twinrun / reference | goal |",
        "|---|---|---|---|---|",
        f"| SmolLM2 SFT s/step (batch {s['batch_size']}, {s['timed_steps']} timed steps) | "
        f"{sp(s['per_step_s']['twinrun'])} | plain loop {sp(s['per_step_s']['plain'])} | "
        f"**{s['ratio_per_step']:.3f}×** ({r['min']:.3f}–{r['max']:.3f}) | ≤ 1.0 |",
        f"| SmolLM2 SFT max RSS, MiB | {sp(s['max_rss_mib']['twinrun'], '{:.0f}')} | plain loop "
        f"{sp(s['max_rss_mib']['plain'], '{:.0f}')} | **{s['ratio_max_rss']:.3f}×** | – |",
        f"| toy whole-process SFT, s | {sp(res['toy_process_s']['twinrun'], '{:.2f}')} | "
        "TRL not measured (not installed) | – | ≤ 0.7 vs TRL |",
        "",
        f"Same tokens, same LoRA init: the largest per-step loss difference between twinrun and "
        f"the plain loop is {s['max_abs_loss_diff']:.2e}.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6, help="SmolLM2 optimizer steps per process")
    ap.add_argument("--quick", action="store_true", help="1 repeat, 3 steps, nothing written")
    args = ap.parse_args()
    repeats, steps = (1, 3) if args.quick else (args.repeats, args.steps)
    if steps < 2:
        sys.exit("--steps must be at least 2 (step 0 is a warm-up)")
    started = time.perf_counter()
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="twinrun-bench-real-") as tmp:
        res = measure(repeats, steps, Path(tmp))
    load.append(os.getloadavg()[0])
    res |= {
        "repeats": repeats,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpu": cpu_name(),
            "cores": os.cpu_count(),
            "load_1min_before_after": load,
            "commit": git("rev-parse", "--short", "HEAD"),
            "versions": package_versions("torch", "transformers", "peft"),
        },  # fmt: skip
        "bench_s": time.perf_counter() - started,
    }
    body = markdown(res)
    print(body)
    if args.quick:
        return
    benchkit.write_results("real_model", res, "# real_model\n\n" + body)
    update_docs_section(
        "real_model",
        "real_model — SmolLM2 per step and memory vs a plain loop; the toy SFT process",
        "`python -m bench real_model` (bench/real_model.py; its docstring says what is timed).",
        body,
    )


if __name__ == "__main__":
    main()
