"""Benchmark: SFT time per epoch, twinrun vs a plain PyTorch + PEFT loop (bench/plain_sft.py).

Every run is a fresh process on the toy model (`python -m twinrun toy-model DIR --seed 0`, made
once in a temporary directory) and the 64 shipped examples, threads 1, f32, chat template on,
accumulation 1, lr 1e-3, warmup 0, LoRA rank 8 alpha 16, seed 1:

- twinrun: `python -m twinrun tune sft ... --quiet --threads 1` (strict mode on, its default);
- plain:   `python bench/plain_sft.py ...` — HF `LlamaForCausalLM` + `peft.get_peft_model`,
  AdamW, the same token rows, the same batches in the same order, the same number of steps.
  Its LoRA A factors are drawn as twinrun draws them (`--twinrun-init`), so the two loops'
  per-step losses can be compared: that check is in the results.

Per-epoch time = (time of an E-epoch run - time of a 1-epoch run) / (E - 1), E = 9 by default,
so start-up (imports, loading, writing) cancels. CPU time is the child processes' user + sys
(`resource.getrusage(RUSAGE_CHILDREN)` deltas); wall time is measured around each process. Each
repeat runs all four processes per batch size, alternating which loop goes first. Reported:
median and min/max over repeats, and twinrun/plain as the ratio of the medians (goal <= 1.05).
The 1-epoch processes also give the whole-process wall time a user waits for (goal: twinrun
<= 4 s).

    python -m bench sft_epoch [--quick] [--repeats 5] [--batch-sizes 1,4,8] [--epochs 9]
                              [--code HEAD|REV|worktree]

twinrun is timed from a copy of src/twinrun taken at the start (by default the committed HEAD,
via `git archive`), imported through PYTHONPATH, so edits made while the bench runs do not mix
into its figures; `--code worktree` times src/ as it is on disk instead.

Writes bench/results/sft_epoch.json, bench/results/sft_epoch.md and the section between
`<!-- sft_epoch:begin -->` and `<!-- sft_epoch:end -->` in docs/benchmarks.md. `--quick`
(1 repeat, batch size 4) is a smoke run: it prints the table and writes nothing unless `--write`.
`--render` measures nothing and regenerates the .md and the docs section from the saved JSON.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import benchkit
from benchkit import cpu_name, git, package_versions, update_docs_section

ROOT = Path(__file__).resolve().parent.parent
RESULTS = benchkit.RESULTS
DOCS = ROOT / "docs" / "benchmarks.md"
SNAPSHOT_FILES = {"plain_sft.py": ROOT / "bench" / "plain_sft.py"}
RATIO_GOAL = 1.05
WALL_GOAL_S = 4.0
LOOPS = ("twinrun", "plain")

SETTINGS = {
    "seed": 1,
    "accumulation": 1,
    "learning_rate": 1e-3,
    "warmup_steps": 0,
    "lr_schedule": "cosine",
    "lora_rank": 8,
    "lora_alpha": 16,
    "precision": "f32",
    "chat_template": "on",
    "threads": 1,
}


def command(loop: str, snap: Path, model: Path, out: Path, epochs: int, batch: int) -> list[str]:
    s = SETTINGS
    examples = snap / "src" / "twinrun" / "examples" / "sft.jsonl"
    common = [
        "--model", str(model), "--examples", str(examples), "--output", str(out),
        "--seed", str(s["seed"]), "--epochs", str(epochs), "--batch-size", str(batch),
        "--learning-rate", str(s["learning_rate"]), "--warmup-steps", str(s["warmup_steps"]),
        "--lr-schedule", "cosine",
        "--lora-rank", str(s["lora_rank"]), "--lora-alpha", str(s["lora_alpha"]),
        "--chat-template", str(s["chat_template"]), "--threads", str(s["threads"]),
    ]  # fmt: skip
    if loop == "twinrun":
        return [
            sys.executable, "-m", "twinrun", "tune", "sft", *common,
            "--accumulation", str(s["accumulation"]), "--precision", str(s["precision"]),
            "--quiet",
        ]  # fmt: skip
    return [sys.executable, str(snap / "plain_sft.py"), *common, "--twinrun-init"]


def snapshot(work: Path, code: str) -> tuple[Path, dict[str, str], str]:
    """Copy src/twinrun (from git revision `code`, or the working tree when `code` is
    "worktree") and the plain script into `work`, so that every run of the bench times the
    same code even while the working tree changes; returns (snapshot dir, the environment that
    imports twinrun from it, sha256 of the copied files)."""
    snap = work / "snapshot"
    if code == "worktree":
        shutil.copytree(
            ROOT / "src" / "twinrun",
            snap / "src" / "twinrun",
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        )
    else:
        snap.mkdir()
        archive = subprocess.run(
            ["git", "archive", "--format=tar", code, "src/twinrun"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(snap)], input=archive, check=True)
    for name, path in SNAPSHOT_FILES.items():
        shutil.copy2(path, snap / name)
    digest = hashlib.sha256()
    for f in sorted(p for p in snap.rglob("*") if p.is_file()):
        digest.update(f.relative_to(snap).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(snap / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    where = subprocess.run(
        [sys.executable, "-c", "import twinrun; print(twinrun.__file__)"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not Path(where).is_relative_to(snap):
        sys.exit(f"the snapshot is not what the runs import (twinrun from {where})")
    return snap, env, digest.hexdigest()


def cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_timed(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """(cpu_s, wall_s) of one process, start to exit."""
    c0, t0 = cpu_children(), time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - t0, cpu_children() - c0
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-4000:]}")
    return cpu, wall


def losses(run_dir: Path) -> list[float]:
    with open(run_dir / "metrics.jsonl", encoding="utf-8") as f:
        return [json.loads(line)["loss"] for line in f if line.strip()]


def spread(xs: list[float]) -> dict[str, Any]:
    return benchkit.spread(xs, 4)


def machine(code: str) -> dict[str, Any]:
    commit = git("rev-parse", "--short", "HEAD" if code == "worktree" else code)
    dirty = git("status", "--porcelain", "src")
    return {
        "cpu_count": os.cpu_count(),
        "cpu": cpu_name(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        **package_versions("torch", "transformers", "peft", "tokenizers"),
        "git_commit": commit or None,
        # the runs used src/ as on disk, and it differed from the commit (untracked files too)
        "src_modified": code == "worktree" and bool(dirty),
        "env": {
            k: os.environ.get(k)
            for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONDONTWRITEBYTECODE")
        },
    }


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    snap, env, src_sha256 = snapshot(work, args.code)
    model = work / "toy"
    subprocess.run(
        [sys.executable, "-m", "twinrun", "toy-model", str(model), "--seed", "0"],
        cwd=work,
        env=env,
        check=True,
        capture_output=True,
    )
    long_e = args.epochs
    # times[batch][loop][epochs] -> list of (cpu, wall), one per repeat
    times: dict[int, dict[str, dict[int, list[tuple[float, float]]]]] = {
        b: {loop: {1: [], long_e: []} for loop in LOOPS} for b in args.batch_sizes
    }
    checks: dict[int, dict[str, Any]] = {}
    for rep in range(args.repeats):
        for k, batch in enumerate(args.batch_sizes):
            order = benchkit.alternating(LOOPS, rep + k)
            for epochs in (1, long_e):
                for loop in order:
                    out = work / f"{loop}-b{batch}-e{epochs}-r{rep}"
                    cmd = command(loop, snap, model, out, epochs, batch)
                    cpu, wall = run_timed(cmd, env, work)
                    times[batch][loop][epochs].append((cpu, wall))
                    print(
                        f"  repeat {rep + 1}/{args.repeats} batch {batch} {loop:7s} "
                        f"{epochs} epoch(s): cpu {cpu:6.2f} s  wall {wall:6.2f} s",
                        file=sys.stderr,
                        flush=True,
                    )
            if rep == 0:
                checks[batch] = same_work_check(work, batch, long_e)
            for p in work.glob(f"*-b{batch}-e*-r{rep}"):
                shutil.rmtree(p)

    rows = []
    for batch in args.batch_sizes:
        row: dict[str, Any] = {"batch_size": batch, "steps_per_epoch": -(-64 // batch)}
        for loop in LOOPS:
            t1, tl = times[batch][loop][1], times[batch][loop][long_e]
            pairs = list(zip(t1, tl, strict=True))
            row[loop] = {
                "epoch_cpu_s": spread([(b[0] - a[0]) / (long_e - 1) for a, b in pairs]),
                "epoch_wall_s": spread([(b[1] - a[1]) / (long_e - 1) for a, b in pairs]),
                "process_1epoch_wall_s": spread([a[1] for a in t1]),
                "process_1epoch_cpu_s": spread([a[0] for a in t1]),
                f"process_{long_e}epoch_cpu_s": spread([b[0] for b in tl]),
            }
        for kind in ("epoch_cpu_s", "epoch_wall_s", "process_1epoch_wall_s"):
            row[f"ratio_{kind}"] = row["twinrun"][kind]["median"] / row["plain"][kind]["median"]
        row["same_work_check"] = checks[batch]
        rows.append(row)
    return {"rows": rows, "snapshot_sha256": src_sha256}


def same_work_check(work: Path, batch: int, long_e: int) -> dict[str, Any]:
    """Both loops took the same steps on the same batches: compare their per-step losses."""
    out: dict[str, Any] = {}
    for epochs in (1, long_e):
        tw = losses(work / f"twinrun-b{batch}-e{epochs}-r0")
        pl = losses(work / f"plain-b{batch}-e{epochs}-r0")
        out[f"{epochs}_epoch"] = {
            "steps": [len(tw), len(pl)],
            "max_abs_loss_diff": max(abs(a - b) for a, b in zip(tw, pl, strict=True)),
            "final_loss": [tw[-1], pl[-1]],
        }
    summary = json.loads((work / f"plain-b{batch}-e1-r0" / "summary.json").read_text())
    out["plain_attn"] = summary["attn_implementation"]
    return out


def paired_ratios(tw: list[float], pl: list[float]) -> list[float]:
    return [a / b if b > 0 else float("inf") for a, b in zip(tw, pl, strict=True)]


def fmt(s: dict[str, Any], digits: int = 3) -> str:
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"


def markdown(res: dict[str, Any]) -> str:
    """The body shared by bench/results/sft_epoch.md and docs/benchmarks.md."""
    m, e = res["machine"], res["epochs_long"]
    rows = res["rows"]
    code = f"git {m['git_commit']}" + (" plus uncommitted changes" if m["src_modified"] else "")
    ok = all(r["ratio_epoch_cpu_s"] <= RATIO_GOAL for r in rows)
    lines = [
        f"Measured {res['date']} by `python -m bench sft_epoch{' --quick' if res['quick'] else ''}`"
        f" on {m['cpu_count']} CPUs ({m['cpu']}), torch {m['torch']}, transformers "
        f"{m['transformers']}, peft {m['peft']}, Python {m['python']}; load average "
        f"{res['loadavg_start'][0]:.2f} at start, {res['loadavg_end'][0]:.2f} at end (the machine "
        "is shared, hence medians). Toy model (`twinrun toy-model --seed 0`), the 64 shipped "
        "examples, threads 1, f32, chat template on, accumulation 1, lr 1e-3, warmup 0, LoRA "
        "rank 8 alpha 16 on q/k/v/o. Each figure: median (min–max) over "
        f"{res['repeats']} repeat(s). Every run is a fresh process. Code: twinrun at "
        f"{code}, copied aside when the bench started (all runs time the same code; snapshot "
        f"sha256 {res['snapshot_sha256'][:12]}).",
        "",
        f"### Seconds per epoch: ({e}-epoch run − 1-epoch run) / {e - 1}",
        "",
        "plain = `bench/plain_sft.py`: HF `LlamaForCausalLM` (attention "
        f"`{res['plain_attn']}`) + `peft.get_peft_model`, AdamW, same token rows, same batches, "
        "same number of optimizer steps. CPU = user + sys of the process.",
        "",
        "| batch | steps/epoch | twinrun CPU s | plain CPU s | twinrun/plain CPU "
        "| per-repeat ratios | twinrun wall s | plain wall s | twinrun/plain wall |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        tw, pl = r["twinrun"], r["plain"]
        paired = paired_ratios(tw["epoch_cpu_s"]["all"], pl["epoch_cpu_s"]["all"])
        lines.append(
            f"| {r['batch_size']} | {r['steps_per_epoch']} "
            f"| {fmt(tw['epoch_cpu_s'])} | {fmt(pl['epoch_cpu_s'])} "
            f"| **{r['ratio_epoch_cpu_s']:.2f}** | {min(paired):.2f}–{max(paired):.2f} "
            f"| {fmt(tw['epoch_wall_s'])} | {fmt(pl['epoch_wall_s'])} "
            f"| {r['ratio_epoch_wall_s']:.2f} |"
        )
    lines += [
        "",
        f"Goal: twinrun/plain CPU ≤ {RATIO_GOAL} at every batch size — "
        f"{benchkit.verdict(ok)} (on the ratio of the medians). Per-repeat ratios pair "
        "the twinrun and plain runs made one after the other in the same repeat; their range "
        "shows the noise: a per-epoch figure is the difference of two whole-process times "
        f"divided by {e - 1}. Wall figures include time spent waiting for a core behind other "
        "processes (see the load average), so they are much noisier than CPU and can even come "
        "out negative; compare CPU.",
        "",
        "### Whole process, 1 epoch on 64 examples (imports and set-up included)",
        "",
        "| batch | twinrun wall s | plain wall s | twinrun/plain | twinrun CPU s | plain CPU s |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        tw, pl = r["twinrun"], r["plain"]
        lines.append(
            f"| {r['batch_size']} | {fmt(tw['process_1epoch_wall_s'], 2)} "
            f"| {fmt(pl['process_1epoch_wall_s'], 2)} | {r['ratio_process_1epoch_wall_s']:.2f} "
            f"| {fmt(tw['process_1epoch_cpu_s'], 2)} | {fmt(pl['process_1epoch_cpu_s'], 2)} |"
        )
    worst = max(r["twinrun"]["process_1epoch_wall_s"]["median"] for r in rows)
    lines += [
        "",
        f"Goal: twinrun ≤ {WALL_GOAL_S:g} s wall — {benchkit.verdict(worst <= WALL_GOAL_S)} "
        f"(slowest median {worst:.2f} s, at load average ~{res['loadavg_start'][0]:.1f} on "
        f"{m['cpu_count']} CPUs). CPU s is the process's own user + sys, close to what the wall "
        "time is on an idle core.",
        "",
        "### Same work",
        "",
        "The plain loop draws its LoRA A factors as twinrun does, so both should follow the same "
        "loss curve (eager vs SDPA attention and op order differ in the last bits, and Adam "
        "amplifies that over many steps):",
        "",
        "| batch | steps (1 epoch) | max abs loss diff, 1 epoch "
        f"| steps ({e} epochs) | final loss twinrun / plain, {e} epochs |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        c1, cl = r["same_work_check"]["1_epoch"], r["same_work_check"][f"{e}_epoch"]
        lines.append(
            f"| {r['batch_size']} | {c1['steps'][0]} / {c1['steps'][1]} "
            f"| {c1['max_abs_loss_diff']:.2e} | {cl['steps'][0]} / {cl['steps'][1]} "
            f"| {cl['final_loss'][0]:.5f} / {cl['final_loss'][1]:.5f} |"
        )
    if e != 9:
        lines += ["", f"Note: {e} vs 1 epochs were run (not 9 vs 1), to keep the run short."]
    return "\n".join(lines) + "\n"


def update_docs(body: str) -> None:
    """Replace only this benchmark's section of docs/benchmarks.md; append it if missing."""
    update_docs_section(
        "sft_epoch",
        "SFT epoch time",
        (
            "twinrun's SFT loop against a plain PyTorch + PEFT loop doing the same batches, "
            "and the whole-process time a user waits for. Generated by `python "
            "bench/sft_epoch.py` (also in `bench/results/sft_epoch.md`); do not edit between "
            "the markers."
        ),
        body,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 repeat, batch size 4, no files")
    ap.add_argument("--repeats", type=int, default=None, help="default 5 (1 with --quick)")
    ap.add_argument("--batch-sizes", default=None, help="default 1,4,8 (4 with --quick)")
    ap.add_argument("--epochs", type=int, default=9, help="the long run's epochs (default 9)")
    ap.add_argument(
        "--code",
        default="HEAD",
        help="the twinrun to time: a git revision (default HEAD, the committed code) or "
        "'worktree' (src/ as it is on disk, uncommitted changes included)",
    )
    ap.add_argument("--write", action=argparse.BooleanOptionalAction, default=None)
    ap.add_argument(
        "--render",
        action="store_true",
        help="measure nothing: regenerate the .md and the docs section from the saved JSON",
    )
    args = ap.parse_args()
    if args.render:
        res = json.loads((RESULTS / "sft_epoch.json").read_text(encoding="utf-8"))
        write_outputs(res, markdown(res))
        return
    args.repeats = args.repeats or (1 if args.quick else 5)
    args.batch_sizes = [
        int(b) for b in (args.batch_sizes or ("4" if args.quick else "1,4,8")).split(",")
    ]
    write = (not args.quick) if args.write is None else args.write
    if args.epochs < 2:
        ap.error("--epochs must be at least 2")

    started = time.perf_counter()
    loadavg_start = os.getloadavg()
    info = machine(args.code)  # the git state now, when the snapshot of src/ is taken
    with tempfile.TemporaryDirectory(prefix="sft_epoch_") as tmp:
        measured = measure(args, Path(tmp))
    res: dict[str, Any] = {
        "benchmark": "sft_epoch",
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "quick": args.quick,
        "repeats": args.repeats,
        "epochs_long": args.epochs,
        "batch_sizes": args.batch_sizes,
        "settings": SETTINGS | {"examples": 64, "model": "twinrun toy-model --seed 0"},
        "goals": {"ratio_epoch_cpu_s_max": RATIO_GOAL, "twinrun_process_wall_s_max": WALL_GOAL_S},
        "machine": info,
        "loadavg_start": loadavg_start,
        "loadavg_end": os.getloadavg(),
        "bench_wall_s": round(time.perf_counter() - started, 1),
        **measured,
    }
    res["plain_attn"] = res["rows"][0]["same_work_check"]["plain_attn"]
    res["pass"] = {
        "epoch_ratio": all(r["ratio_epoch_cpu_s"] <= RATIO_GOAL for r in res["rows"]),
        "process_wall": all(
            r["twinrun"]["process_1epoch_wall_s"]["median"] <= WALL_GOAL_S for r in res["rows"]
        ),
    }
    body = markdown(res)
    print(body)
    print(f"bench took {res['bench_wall_s']} s", file=sys.stderr)
    if write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "sft_epoch.json").write_text(json.dumps(res, indent=2) + "\n", encoding="utf-8")
        write_outputs(res, body)


def write_outputs(res: dict[str, Any], body: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "sft_epoch.md").write_text(
        "# SFT epoch time: twinrun vs plain PyTorch + PEFT\n\n" + body, encoding="utf-8"
    )
    update_docs(body)
    print(f"wrote {RESULTS}/sft_epoch.{{json,md}} and {DOCS}", file=sys.stderr)


if __name__ == "__main__":
    main()
