"""Benchmark: the per-step cost of `--diag` on toy SFT and on SmolLM2, per diag engine, idle
and under load (goal: <= 5% per SmolLM2 step, under load as well as idle; the toy's figure is
reported, not judged: a step of milliseconds cannot carry a digest of its logits at 5%).

Runs on the toy model (`python -m twinrun toy-model DIR --seed 0`, made once in a temporary
directory) and the 64 shipped SFT examples, threads 1, f32, chat template on, batch 4, lr 1e-3,
warmup 0, LoRA rank 8 alpha 16, seed 1, about 48 steps per run, every run a fresh
`python -m twinrun tune sft` process. The modes, interleaved: `plain` (no `--diag`) and one
`--diag` run per engine, the order rotating from round to round (5 rounds by default):

- `sync`: the recorder's own `record_later`, which computes and appends the row on the loop's
  thread before it returns;
- `thread` (emulated by this script, the engine twinrun had before): the row computed on one
  background thread from copies of the late leaves, GIL switch interval 0.5 ms.

Each round is run at load 0 and under load 1 (one extra `python -c "while True: pass"` process
started by this script for the loaded runs, stopped after them; the order of the two loads
alternates from round to round). Two configurations: accumulation 1 (the goal's: one forward of
4 rows per step) and accumulation 4 (four forwards per step: the same diag leaves except 4x the
logits and tokens, on a 4x longer step); `--quick` runs accumulation 1 only, 3 rounds.

The figures: `wall_s` from metrics.jsonl (the loop's own per-step time, the diag hook included:
what the goal is judged on), and the whole process's wall and CPU time (user + system of the
child, every thread: the total work, the final flush included). Step 0 (lazy imports, optimizer
state creation) is left out. For each figure: the pooled median of each mode (over steps and
rounds), each engine's ratio to `plain`, and the spread of the per-round ratios (median, min,
max). The goal is met by an engine whose accumulation-1 per-step overhead is <= 5% at both
loads. Each `sync` run also times the diag hook itself around its calls (the child writes the
per-step sums to a file): its share of the rest of the same step, a figure two processes' noise
cannot move (on a shared host, runs without and with `--diag` differ by +-25% from round to
round), though blind to what the row's work costs the next step in cache. At accumulation 1 each
round adds one `floor` run: a `--diag` run that, where the hook runs and just before it, times
the digests (XXH3-128) and exact sums of the row's two large leaves alone (the logits, the four LoRA
leaves read in place) — the row's floor, with the caches as a step leaves them, as a share of
the rest of the step (its wall less the hook and all the floor run adds). Also recorded: the
rows' size, the machine's load average, and (in this process) what one row costs to compute.

`--smollm2` also measures `sync` against no `--diag` on SmolLM2-135M-Instruct (the first 32
shipped examples, one epoch of 8 steps, the same settings otherwise), at both loads, the same
number of rounds: where a step takes seconds, not milliseconds. The goal is judged there, on the
hook's own time inside the `sync` runs as a share of the rest of the step (the larger of the
two loads' medians): two processes' step times differ by more than 5% from round to round.
Without `--smollm2` the results say the goal was not judged.

Also recorded, in this process: what hashing and checksumming a SmolLM2-sized logits leaf
(4 × 64 × 49,152 float32) costs per byte: the leaf digest (XXH3-128), SHA256 (the digest of
the format's first version) and the exact sum of squares.

    python -m bench diag_overhead [--rounds 5] [--steps 48] [--engines sync,thread] [--quick]
                                  [--smollm2] [--write/--no-write] [--render]

Writes bench/results/diag_overhead.json, bench/results/diag_overhead.md and the section between
`<!-- diag_overhead:begin -->` and `<!-- diag_overhead:end -->` in docs/benchmarks.md (created if
missing; nothing else in it is touched). `--quick` (about 2-3 minutes) writes nothing unless
`--write`. `--render` measures nothing and regenerates the .md and the docs section from the JSON.
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
from benchkit import spread, update_docs_section

ROOT = Path(__file__).resolve().parent.parent
RESULTS = benchkit.RESULTS
DOCS = ROOT / "docs" / "benchmarks.md"
EXAMPLES = ROOT / "src" / "twinrun" / "examples" / "sft.jsonl"
GOAL = 0.05
FIGURES = ("wall_s", "process_s", "process_cpu_s")
LOADS = (0, 1)  # extra busy processes

ACCUMULATIONS = (1, 4)  # the goal is judged on the first
EXAMPLES_N = 64
SETTINGS = {
    "seed": 1,
    "batch_size": 4,
    "learning_rate": 1e-3,
    "warmup_steps": 0,
    "lr_schedule": "cosine",
    "lora_rank": 8,
    "lora_alpha": 16,
    "precision": "f32",
    "chat_template": "on",
    "threads": 1,
}

#: The engines: what each does to the recorder in the child before twinrun's main runs.
ENGINES: dict[str, str] = {
    "sync": "the recorder as it is: the row computed and appended on the loop's thread",
    "thread": "emulated here: the row computed on one background thread from copies of the late "
    "leaves, GIL switch interval 0.5 ms",
}

# The child: `python -c LAUNCH ENGINE twinrun-args...`.
LAUNCH = """
import sys
engine = sys.argv.pop(1)
if engine == "thread":
    from concurrent.futures import ThreadPoolExecutor
    import twinrun.train.hooks.diag as hook
    from twinrun.diag.recorder import DiagRecorder
    record, close, late = DiagRecorder.record, DiagRecorder.close, hook.late_leaves
    pool, pending = [], []
    def later(self, step, leaves, phase=None):
        self.begin(step, phase)
        for f in [f for f in pending if f.done()]:
            pending.remove(f)
            f.result()
        if not pool:
            pool.append(ThreadPoolExecutor(1))
            sys.setswitchinterval(0.0005)
        pending.append(pool[0].submit(record, self, step, leaves, phase))
    def flush(self):
        while pending:
            pending.pop(0).result()
    def closed(self):
        flush(self)
        close(self)
    DiagRecorder.record_later, DiagRecorder.flush, DiagRecorder.close = later, flush, closed
    hook.late_leaves = lambda view, copy=False: late(view, copy=True)
elif engine != "sync":
    sys.exit(f"unknown engine {engine!r}")
import os
if os.environ.get("TWINRUN_BENCH_HOOK_LOG"):  # the diag hook's own time per step, in this run
    import atexit, json, time
    import twinrun.train.hooks.diag as hook
    spent, steps = [0.0], []
    forward, update = hook.DiagHook.after_forward, hook.DiagHook.after_update
    def timed_forward(self, view, fw):
        t = time.perf_counter()
        forward(self, view, fw)
        spent[0] += time.perf_counter() - t
    def timed_update(self, view):
        t = time.perf_counter()
        update(self, view)
        steps.append(spent[0] + time.perf_counter() - t)
        spent[0] = 0.0
    hook.DiagHook.after_forward, hook.DiagHook.after_update = timed_forward, timed_update
    def write():
        with open(os.environ["TWINRUN_BENCH_HOOK_LOG"], "w") as f:
            json.dump(steps, f)
    atexit.register(write)
if os.environ.get("TWINRUN_BENCH_FLOOR_LOG"):  # the row's floor, where the hook runs, before it
    import atexit, json, time
    import twinrun.train.hooks.diag as hook
    from twinrun.diag.checksum import leaf_hasher
    from twinrun.diag.extract import rounded_sumsq_rows
    floors, inner = [], hook.DiagHook.after_update
    def floored(self, view):  # logs (floor, all this wrapper adds to the step before the hook)
        t0 = time.perf_counter()
        lora = [leaf.group.spans[leaf.index] for leaf in
                [hook.late_leaves(view)[name] for name in hook.LORA_LEAVES]]
        arrays = [t.numpy() for t in lora]
        logits = [t.numpy().reshape(-1) for _, parts in self.forwards for t in parts]
        t = time.perf_counter()
        for a in arrays + logits:
            leaf_hasher(b"").update(memoryview(a).cast("B"))
        rounded_sumsq_rows(arrays)
        for a in logits:
            rounded_sumsq_rows([a])
        t1 = time.perf_counter()
        floors.append((t1 - t, t1 - t0))
        inner(self, view)
    hook.DiagHook.after_update = floored
    def write_floors():
        with open(os.environ["TWINRUN_BENCH_FLOOR_LOG"], "w") as f:
            json.dump(floors, f)
    atexit.register(write_floors)
from twinrun.cli.main import main
sys.argv[0] = "twinrun"
main()
"""


# -- the parent ---------------------------------------------------------------------------------


def tune_args(
    model: Path, out: Path, epochs: int, accumulation: int, diag: bool, examples: Path = EXAMPLES
) -> list[str]:
    s = SETTINGS
    args = [
        "tune", "sft", "--model", str(model), "--examples", str(examples), "--output", str(out),
        "--seed", str(s["seed"]), "--epochs", str(epochs), "--batch-size", str(s["batch_size"]),
        "--accumulation", str(accumulation), "--learning-rate", str(s["learning_rate"]),
        "--warmup-steps", str(s["warmup_steps"]),
        "--lr-schedule", "cosine", "--lora-rank", str(s["lora_rank"]),
        "--lora-alpha", str(s["lora_alpha"]), "--precision", str(s["precision"]),
        "--chat-template", str(s["chat_template"]), "--threads", str(s["threads"]), "--quiet",
    ]  # fmt: skip
    return [*args, "--diag"] if diag else args


def run_once(
    work: Path, model: Path, epochs: int, accumulation: int, mode: str, tag: str,
    examples: Path = EXAMPLES,
) -> dict[str, Any]:  # fmt: skip
    """One fresh `twinrun tune sft` process in `mode` ("plain" or an engine)."""
    out = work / f"run_{tag}"
    args = tune_args(model, out, epochs, accumulation, mode != "plain", examples)
    cmd = [sys.executable, "-c", LAUNCH, "sync" if mode in ("plain", "floor") else mode, *args]
    log = work / f"log_{tag}.txt"
    t0 = time.perf_counter()
    hook_log, floor_log = work / f"hook_{tag}.json", work / f"floor_{tag}.json"
    env = None
    if mode in ("sync", "floor"):
        env = {**os.environ, "TWINRUN_BENCH_HOOK_LOG": str(hook_log)}
    if mode == "floor":
        env["TWINRUN_BENCH_FLOOR_LOG"] = str(floor_log)
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own CPU time, not the load's
    process_s = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        tail = log.read_text(encoding="utf-8", errors="replace")[-4000:]
        sys.exit(f"failed ({proc.returncode}): {mode} {' '.join(args)}\n{tail}")
    with open(out / "metrics.jsonl", encoding="utf-8") as f:
        steps = [{"step": r["step"], "wall_s": r["wall_s"]} for r in map(json.loads, f) if r]
    n = len(steps)
    walls = [s["wall_s"] for s in steps if s["step"] > 0]
    res: dict[str, Any] = {
        "mode": mode,
        "process_s": process_s,
        "process_cpu_s": usage.ru_utime + usage.ru_stime,
        "steps": n,
        "wall_s": statistics.median(walls),
        "per_step_wall_s": [round(w, 6) for w in walls],
    }
    if mode != "plain":
        res["diag_bytes_per_row"] = (out / "diag.jsonl").stat().st_size / n
    if mode == "sync":  # the hook's share of each step, both from this run: hook / (wall - hook)
        hooks = json.loads(hook_log.read_text())
        pairs = [(w["wall_s"], h) for w, h in zip(steps, hooks, strict=True) if w["step"] > 0]
        res["hook_s"] = statistics.median(h for _, h in pairs)
        res["in_run_share"] = [round(h / (w - h), 5) for w, h in pairs]
    if mode == "floor":  # the floor's share of the step less the hook and what the bench added
        hooks, floors = json.loads(hook_log.read_text()), json.loads(floor_log.read_text())
        rows = [(w["wall_s"], h, f, added) for w, h, (f, added)
                in zip(steps, hooks, floors, strict=True) if w["step"] > 0]  # fmt: skip
        res["floor_s"] = statistics.median(f for _, _, f, _ in rows)
        res["floor_share"] = [round(f / (w - h - added), 5) for w, h, f, added in rows]
    return res


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    model = benchkit.write_toy(work / "toy")
    run_once(work, model, 1, 1, args.engines[0], "warmup")  # page cache, bytecode
    modes = ["plain", *args.engines]
    configs = []
    for acc in args.accumulations:
        per_epoch = EXAMPLES_N // (SETTINGS["batch_size"] * acc)
        epochs = max(1, round(args.steps / per_epoch))
        rounds: dict[int, list[dict[str, Any]]] = {load: [] for load in LOADS}
        for i in range(args.rounds):
            for load in benchkit.alternating(LOADS, i):
                order = modes[i % len(modes) :] + modes[: i % len(modes)]
                if acc == 1 and "sync" in modes:  # the row's floor, in a run of its own
                    order = [*order, "floor"]
                with benchkit.Load(load):
                    runs = {
                        m: run_once(work, model, epochs, acc, m, f"a{acc}_l{load}_{i}_{m}")
                        for m in order
                    }
                rounds[load].append({"order": order, **runs})
                print(f"accumulation {acc} load {load} round {i}: " + ", ".join(
                    f"{m} {1e3 * runs[m]['wall_s']:.2f} ms" for m in modes
                ), file=sys.stderr)  # fmt: skip
        configs.append(
            {
                "accumulation": acc,
                "epochs": epochs,
                "loads": [
                    {"load": load, "rounds": rounds[load], "summary": summarise(rounds[load], args)}
                    for load in LOADS
                ],
            }
        )
    return {"configs": configs}


def measure_smollm2(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """`sync` against no `--diag` on SmolLM2-135M-Instruct (the first 32 shipped examples, one
    epoch of 8 steps, the toy's other settings), at both loads, `args.rounds` rounds."""
    from benchkit import smollm2_dir

    model = smollm2_dir()
    examples = work / "sft32.jsonl"
    examples.write_text("".join(EXAMPLES.read_text().splitlines(keepends=True)[:32]))
    rounds: dict[int, list[dict[str, Any]]] = {load: [] for load in LOADS}
    modes = ["plain", "sync"]
    for i in range(args.rounds):
        for load in benchkit.alternating(LOADS, i):
            order = benchkit.alternating(modes, i)
            with benchkit.Load(load):
                runs = {m: run_once(work, model, 1, 1, m, f"smol_l{load}_{i}_{m}", examples)
                        for m in order}  # fmt: skip
            rounds[load].append({"order": order, **runs})
            said = ", ".join(f"{m} {1e3 * runs[m]['wall_s']:.0f} ms" for m in modes)
            print(f"smollm2 load {load} round {i}: {said}", file=sys.stderr)
    engines = argparse.Namespace(engines=["sync"])
    return {
        "examples": 32,
        "loads": [{"load": load, "rounds": rounds[load],
                   "summary": summarise(rounds[load], engines)} for load in LOADS],
    }  # fmt: skip


def summarise(rounds: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Per figure: each mode's pooled median, each engine's ratio to plain and its spread."""
    summary: dict[str, Any] = {}
    for f in FIGURES:
        if f == "wall_s":
            pooled = {
                m: statistics.median(x for r in rounds for x in r[m]["per_step_wall_s"])
                for m in ["plain", *args.engines]
            }
        else:
            pooled = {
                m: statistics.median(r[m][f] for r in rounds) for m in ["plain", *args.engines]
            }
        summary[f] = {
            "median_s": pooled,
            "overhead": {e: pooled[e] / pooled["plain"] - 1.0 for e in args.engines},
            "per_round_overhead": {
                e: spread([round(r[e][f] / r["plain"][f] - 1.0, 4) for r in rounds])
                for e in args.engines
            },
        }
    if "sync" in args.engines:
        shares = [r["sync"]["in_run_share"] for r in rounds]
        summary["in_run"] = {
            "share": statistics.median(x for per in shares for x in per),
            "per_round": spread([round(statistics.median(per), 4) for per in shares]),
            "hook_s": statistics.median(r["sync"]["hook_s"] for r in rounds),
        }
    if all("floor" in r for r in rounds):
        shares = [r["floor"]["floor_share"] for r in rounds]
        summary["floor"] = {
            "share": statistics.median(x for per in shares for x in per),
            "per_round": spread([round(statistics.median(per), 4) for per in shares]),
            "floor_s": statistics.median(r["floor"]["floor_s"] for r in rounds),
        }
    return summary


def row_profile(repeats: int = 50) -> dict[str, float]:
    """Milliseconds per leaf (checksum + digest) of a toy SFT step's row, in this process: the
    toy's LoRA leaves (rank 8 on q/k/v/o of 4 layers: 32 parts, 14,336 floats), logits of one
    forward of 4 rows x 25 tokens, tokens, indices, loss, lr and the torch RNG state."""
    import torch

    from twinrun.core.tiles import tiled
    from twinrun.diag.recorder import leaf_value
    from twinrun.train.hooks.diag import copied

    g = torch.Generator().manual_seed(0)
    parts = [
        t
        for _ in range(4)
        for out in (64, 32, 32, 64)
        for t in (torch.randn(8, 64, generator=g), torch.randn(out, 8, generator=g))
    ]
    # each leaf in one buffer, as training keeps them (twinrun.core.tiles)
    lora = [tiled(parts), tiled(parts), tiled([p.abs() for p in parts]), tiled(parts)]
    leaves = {
        "batch.sample_indices": torch.arange(4), "batch.tokens": [torch.randint(0, 259, (4, 25))],
        "forward.logits": [torch.randn(4, 25, 259, generator=g)],
        "loss": [0.5], "lr": [1e-3], "rng.state": [torch.get_rng_state()],
    }  # fmt: skip
    out = {}
    for name, value in leaves.items():
        leaf_value(value)
        t0 = time.perf_counter()
        for _ in range(repeats):
            leaf_value(value)
        out[name] = 1e3 * (time.perf_counter() - t0) / repeats
    groups = [copied(lora, copy=False) for _ in range(repeats + 1)]  # a group computes once
    [leaf_value(v) for v in groups[0]]
    t0 = time.perf_counter()
    for group in groups[1:]:
        for v in group:
            leaf_value(v)
    out["the 4 LoRA leaves (one pass)"] = 1e3 * (time.perf_counter() - t0) / repeats
    out["row total"] = sum(out.values())
    t0 = time.perf_counter()
    for _ in range(repeats):
        copied(lora)  # what the thread engine adds: the four LoRA leaves copied to one buffer
    out["LoRA copies (the thread engine's snapshot)"] = 1e3 * (time.perf_counter() - t0) / repeats
    return out


def toy_overhead(res: dict[str, Any], engine: str) -> float:
    """The toy's figure (reported, not judged): accumulation 1, the loop's per-step wall_s, the
    larger of the two loads'."""
    loads = res["configs"][0]["loads"]
    return max(float(x["summary"]["wall_s"]["overhead"][engine]) for x in loads)


def judged(res: dict[str, Any]) -> float | None:
    """The overhead the goal is judged on: SmolLM2's diag hook inside the `sync` runs, as a share
    of the rest of the step, the larger of the two loads' medians; None without SmolLM2."""
    smol = res.get("smollm2")
    if not smol:
        return None
    return max(float(x["summary"]["in_run"]["share"]) for x in smol["loads"])


def goal_met(res: dict[str, Any]) -> bool | None:
    share = judged(res)
    return None if share is None else share <= GOAL


def hash_rates(repeats: int = 7) -> dict[str, float]:
    """ns per byte of a SmolLM2-sized logits leaf (4 x 64 x 49,152 float32, 50 MB): the leaf
    digest, SHA256 and the exact sum of squares (medians of `repeats`)."""
    import hashlib

    import numpy as np

    from twinrun.diag.checksum import leaf_hasher, sumsq

    a = np.random.default_rng(0).standard_normal((4 * 64 * 49152,), dtype=np.float32) * 3
    mv = memoryview(a).cast("B")
    work = {
        "digest (XXH3-128)": lambda: leaf_hasher(b"").update(mv),
        "SHA256 (the v1 digest)": lambda: hashlib.sha256(mv).digest(),
        "exact sum of squares": lambda: sumsq(a),
    }
    out = {}
    for name, fn in work.items():
        fn()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        out[name] = 1e9 * statistics.median(times) / a.nbytes
    return out


def pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def in_run(loads: list[dict[str, Any]]) -> str:
    """The hook's own time per step, measured inside the `sync` runs, per load (a sentence)."""
    said = []
    for x in loads:
        r = x["summary"].get("in_run")
        if r:
            said.append(
                f"{1e3 * r['hook_s']:.2f} ms per step, **{pct(r['share'])}** of the rest of the "
                f"step at load {x['load']} (per round {pct(r['per_round']['min'])} – "
                f"{pct(r['per_round']['max'])})"
            )
    if not said:
        return ""
    return (
        "The diag hook's own time, timed inside each `sync` run around the hook (so free of "
        "the noise between processes, but blind to what the row's work costs the next step in "
        "cache): " + "; ".join(said) + " (median over steps)."
    )


def floor(loads: list[dict[str, Any]]) -> str:
    """The row's floor per load, from the `floor` runs (a sentence)."""
    said = [
        f"{1e3 * r['floor_s']:.2f} ms, **{pct(r['share'])}** of the rest of the step at load "
        f"{x['load']} (per round {pct(r['per_round']['min'])} – {pct(r['per_round']['max'])})"
        for x in loads
        if (r := x["summary"].get("floor"))
    ]
    if not said:
        return ""
    return (
        "The row's floor: the digests (XXH3-128) and the exact sums of squares of its two large "
        "leaves alone (the logits and the four LoRA leaves, read in place: no framing, no "
        "row), timed in one more `--diag` run per round where the hook runs, just before it, "
        "so with the caches as a training step leaves them: " + "; ".join(said) + " (median "
        "over steps). Whatever the rest of the row costs comes on top of this."
    )


def markdown(res: dict[str, Any]) -> str:
    m = res["machine"]
    engines = res["engines"]
    la0, la1 = res["loadavg_start"][0], res["loadavg_end"][0]
    lines = [
        f"Measured {res['date']} by `python -m bench diag_overhead` on {m['cpu_count']} CPUs "
        f"({m['cpu']}), torch {m['torch']}, numpy {m['numpy']}, Python {m['python']}, commit "
        f"{m['git_commit']}; load average {la0:.2f} at start, {la1:.2f} at end (besides the "
        "benchmark's own busy process). Toy model, the 64 shipped examples, batch 4, threads 1, "
        f"f32, LoRA rank 8 on q/k/v/o. {res['rounds']} rounds of fresh processes per "
        "configuration and load, each round one run without `--diag` and one per engine, the "
        "order rotating; step 0 left out. Engines: "
        + "; ".join(f"`{e}`: {ENGINES.get(e, e)}" for e in engines)
        + ".",
        "",
        "| accumulation (steps/run) | load | engine | per-step `wall_s`: without → with "
        "`--diag` | per-step overhead (pooled medians) | per-round (min – max) | whole-process "
        "CPU overhead | per-round (min – max) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in res["configs"]:
        steps = c["loads"][0]["rounds"][0]["plain"]["steps"]
        for x in c["loads"]:
            w, cpu = x["summary"]["wall_s"], x["summary"]["process_cpu_s"]
            for e in engines:
                ww, cc = w["per_round_overhead"][e], cpu["per_round_overhead"][e]
                lines.append(
                    f"| {c['accumulation']} ({steps}) | {x['load']} | `{e}` | "
                    f"{1e3 * w['median_s']['plain']:.2f} → {1e3 * w['median_s'][e]:.2f} ms | "
                    f"**{pct(w['overhead'][e])}** | {pct(ww['min'])} – {pct(ww['max'])} | "
                    f"{pct(cpu['overhead'][e])} | {pct(cc['min'])} – {pct(cc['max'])} |"
                )
    first = c = res["configs"][0]
    toy = ", ".join(f"`{e}` {pct(toy_overhead(res, e))}" for e in engines)
    share, met = judged(res), goal_met(res)
    if share is None:
        verdicts = "**not judged** (SmolLM2 was not measured: `--smollm2`)"
    else:
        verdicts = f"`sync` **{benchkit.verdict(bool(met))}** ({pct(share)})"
    row_kb = (
        statistics.median(
            r[e]["diag_bytes_per_row"] for r in first["loads"][0]["rounds"] for e in engines
        )
        / 1024
    )
    lines += [
        "",
        f"Goal: `--diag` costs ≤ {GOAL:.0%} per SmolLM2 step at load 0 and at load 1 (the "
        "hook's own time inside the run, below) — judged on the larger: "
        f"{verdicts}. The toy's figure (accumulation {first['accumulation']}, the loop's "
        f"`wall_s`, pooled medians, the larger load) is reported, not judged: {toy}. Per toy "
        "step `--diag` computes an exact checksum and a digest (XXH3-128) of the "
        "sampled indices, the tokens, the logits (4 rows × T × 259 floats per forward), the "
        "loss, the LoRA gradients, both Adam moments, the LoRA parameters (4 × 14,336 floats) "
        f"and the RNG state, and appends a {row_kb:.1f} KB row (flushed; the same bytes with "
        "every engine).",
    ]
    if said := in_run(first["loads"]):
        lines += ["", said]
    if said := floor(first["loads"]):
        lines += ["", said]
    if res.get("row_profile_ms"):
        prof = res["row_profile_ms"]
        step_ms = 1e3 * first["loads"][0]["summary"]["wall_s"]["median_s"]["plain"]
        lines += [
            "",
            "What one row costs (ms, the median of 7 measurements in the benchmark process on "
            "the toy's shapes; the four LoRA leaves each tiled in one buffer, as training keeps "
            "them, read in place, checksummed as rows in one set of passes and hashed leaf by "
            "leaf over their buffers):",
            "",
            "| part | ms |",
            "|---|---|",
            *(f"| {k} | {v:.3f} |" for k, v in prof.items()),
            "",
            f"The row total is {100 * prof['row total'] / step_ms:.1f}% of a step without "
            f"`--diag` ({step_ms:.2f} ms at load 0): what `sync` adds to each step, wherever "
            "the step runs. `thread` moves that work off the loop's thread but not off its GIL "
            "(the Python-level parts of a row hold it) and adds the snapshot of the LoRA leaves; "
            "what it gains needs a second core: an idle one, or, on a machine busy with other "
            "processes, a second share of the CPU taken from them (the scheduler shares CPU "
            "time per thread).",
        ]
    if res.get("smollm2"):
        lines += ["", "The same on SmolLM2-135M-Instruct (the first 32 shipped examples, one epoch "
                  "of 8 steps, threads 1, LoRA rank 8 on q/k/v/o; per step `--diag` also digests "
                  "4 rows × T × 49,152 logits and 4 × 921,600-float LoRA leaves):", "",
                  "| load | per-step `wall_s`: without → with `--diag` | per-step overhead "
                  "(pooled medians) | per-round (min – max) | whole-process CPU overhead |",
                  "|---|---|---|---|---|"]  # fmt: skip
        for x in res["smollm2"]["loads"]:
            w, cpu = x["summary"]["wall_s"], x["summary"]["process_cpu_s"]
            ww = w["per_round_overhead"]["sync"]
            lines.append(
                f"| {x['load']} | {1e3 * w['median_s']['plain']:.0f} → "
                f"{1e3 * w['median_s']['sync']:.0f} ms | **{pct(w['overhead']['sync'])}** | "
                f"{pct(ww['min'])} – {pct(ww['max'])} | {pct(cpu['overhead']['sync'])} |"
            )
        if said := in_run(res["smollm2"]["loads"]):
            lines += ["", said]
    if res.get("hash_ns_per_byte"):
        rates = res["hash_ns_per_byte"]
        lines += ["", "What reading a SmolLM2-sized logits leaf (4 × 64 × 49,152 float32, 50 MB) "
                  "costs per byte, in the benchmark process (median of 7):", "",
                  "| work | ns per byte |", "|---|---|",
                  *(f"| {k} | {v:.3f} |" for k, v in rates.items())]  # fmt: skip
    if res.get("note"):
        lines += ["", res["note"]]
    if res.get("quick"):
        lines += ["", "Note: a `--quick` run (fewer rounds, accumulation 1 only)."]
    return "\n".join(lines) + "\n"


def update_docs(body: str) -> None:
    """Replace only this benchmark's section of docs/benchmarks.md; append it if missing."""
    update_docs_section(
        "diag_overhead",
        "Diag overhead",
        (
            "What `--diag` (exact checksums and digests of every leaf at every step) "
            "costs per SFT step, on SmolLM2 and on the toy model. Generated by `python "
            "bench/diag_overhead.py` (also in `bench/results/diag_overhead.md`); do not edit "
            "between the markers."
        ),
        body,
    )


def write_outputs(res: dict[str, Any], body: str) -> None:
    benchkit.write_results(
        "diag_overhead", res, "# diag overhead: toy SFT with and without --diag\n\n" + body
    )
    update_docs(body)
    print(f"wrote {RESULTS}/diag_overhead.{{json,md}} and {DOCS}", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=None, help="default 5 (3 with --quick)")
    ap.add_argument("--steps", type=int, default=None, help="per run, about (default 48)")
    ap.add_argument("--engines", default=",".join(ENGINES), help="comma-separated")
    ap.add_argument("--quick", action="store_true", help="a short run; writes nothing")
    ap.add_argument("--write", action=argparse.BooleanOptionalAction, default=None)
    ap.add_argument("--note", default="", help="a sentence added to the .md (e.g. how noisy)")
    ap.add_argument("--render", action="store_true", help="regenerate .md/docs from the JSON")
    ap.add_argument("--smollm2", action="store_true", help="also measure SmolLM2 (sync only)")
    args = ap.parse_args()
    if args.render:
        res = json.loads((RESULTS / "diag_overhead.json").read_text(encoding="utf-8"))
        res["pass"] = goal_met(res)
        res["note"] = args.note or res.get("note", "")
        write_outputs(res, markdown(res))
        return
    args.engines = [e for e in args.engines.split(",") if e]
    unknown = [e for e in args.engines if e not in ENGINES]
    if unknown or not args.engines:
        ap.error(f"--engines: choose from {', '.join(ENGINES)}")
    args.rounds = args.rounds or (3 if args.quick else 5)
    args.steps = args.steps or 48
    args.accumulations = ACCUMULATIONS[:1] if args.quick else ACCUMULATIONS
    write = (not args.quick) if args.write is None else args.write
    started = time.perf_counter()
    loadavg_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="diag_overhead_") as tmp:
        measured = measure(args, Path(tmp))
        if args.smollm2:
            measured["smollm2"] = measure_smollm2(args, Path(tmp))
    res: dict[str, Any] = {
        "benchmark": "diag_overhead",
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "quick": args.quick,
        "rounds": args.rounds,
        "steps_target": args.steps,
        "engines": args.engines,
        "loads": list(LOADS),
        "settings": SETTINGS | {"examples": EXAMPLES_N, "model": "twinrun toy-model --seed 0"},
        "goal_overhead_max": GOAL,
        "machine": benchkit.machine("torch", "numpy", "transformers"),
        "loadavg_start": loadavg_start,
        "loadavg_end": os.getloadavg(),
        "bench_wall_s": round(time.perf_counter() - started, 1),
        "note": args.note,
        **measured,
    }
    res["pass"] = goal_met(res)
    res["hash_ns_per_byte"] = hash_rates()
    profiles = [row_profile() for _ in range(7)]  # a busy moment inflates one; take medians
    res["row_profile_ms"] = {k: statistics.median(p[k] for p in profiles) for k in profiles[0]}
    body = markdown(res)
    print(body)
    print(f"bench took {res['bench_wall_s']} s", file=sys.stderr)
    if write:
        write_outputs(res, body)


if __name__ == "__main__":
    main()
