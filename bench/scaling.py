"""Benchmark: how a SmolLM2 SFT step's cost grows — with sequence length, batch size and process
count — and what `--diag` and a capture cost as the rows grow.

Every configuration is a fresh process on SmolLM2-135M-Instruct (f32, LoRA rank 8 on q/k/v/o,
eager attention, chat template off, one thread per process, `--cpu-kernels native` by default to
fit the budget: the portable kernels multiply the matmul time, see bench/utilisation.py), on
generated rows of exactly T tokens (`utilisation.exact_rows`):

1. Sequence length: batch 1 x T = 64, 256, 1024, 2048 tokens.
2. Batch size: B = 1, 4, 16 rows x 64 tokens.
   Both as `twinrun run CONFIG.toml` (the flags' TOML twins) with
   `[optimizer_batch] capture = true, capture_steps = [0]`, so each run also writes a capture of
   its step 0 (which the timing leaves out). Per-step `wall_s` from metrics.jsonl, step 0 left
   out, median; peak RSS = `ru_maxrss` of the process (`os.wait4`), and its growth over the
   smallest configuration. Beside the measured time ratio (to 1 x 64): the expected one — the
   ratio of model FLOPs from `utilisation.step_flops` (time ∝ FLOPs: ∝ tokens while the linear
   layers dominate, plus attention's T^2 share) and the plain token ratio; a measured/expected
   ratio outside 0.8–1.25 is flagged. For memory: the size of one f32 T x T copy of every layer's
   attention probabilities (layers x B x heads x T^2 x 4 bytes), the eager attention's T^2 term.
3. Process count: `tune sft`, batch 2, accumulation 2, 64 tokens, 1 process against 2
   (`python -m torch.distributed.run --nproc-per-node 2 -m twinrun ...`, gloo on loopback):
   each of the 2 does one of the step's 2 forwards. RSS: the largest process of the tree.
4. `--diag` vs rows: the batch-size runs again with `[logging] diag = true` (each right after its
   twin without): per-step `wall_s`, the whole process's CPU seconds, diag.jsonl bytes per step.
5. Capture size vs rows: the bytes of the step-0 capture of every run in 1 and 2 — the payload
   and manifest (`optimizer_batch_step_000000.{safetensors,manifest.json}`), and with the state
   before and the adapter after the step (`.state/`, `.final/`).

6. Long rows (`--long-rows`, measured on its own and kept under `long_rows` in the JSON): batch 1,
   eager attention at 1,024 and 2,048 tokens against `--attention blockwise` (memory linear in
   T; its SFT loss in token chunks) at 2,048 without checkpointing and at 2,048 and 8,192 with
   `gradient_checkpointing = true`: per-step time and peak RSS (a fresh process each).

    python -m bench scaling [--steps 3] [--cpu-kernels native|portable] [--quick] [--render]
                            [--long-rows]

Writes bench/results/scaling.json and .md and the `scaling` section of docs/benchmarks.md
(`--quick`: 16 and 32 tokens, batches 1 and 2, 2 steps; prints only; `--render` measures
nothing and regenerates the .md and the docs section from the JSON).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchkit  # noqa: E402
from benchkit import (  # noqa: E402
    cpu_name,
    git,
    package_versions,
    smollm2_dir,
    spread,
    update_docs_section,
)
from utilisation import (  # noqa: E402
    ALPHA,
    LR,
    RANK,
    SEED,
    attention_share,
    child_env,
    exact_rows,
    model_config,
    run_child,
    step_flops,
    step_walls,
)

RESULTS = benchkit.RESULTS
SEQ_LENGTHS = (64, 256, 1024, 2048)
BATCHES = (1, 4, 16)
BATCH_SEQ = 64
TOLERANCE = (0.8, 1.25)  # measured / expected outside this: flagged
BIG = 1024  # tokens per step from which a configuration runs 2 steps (1 timed)
LONG_EAGER = (1024, 2048)  # --long-rows: eager attention at batch 1
LONG_BLOCKWISE = (2048, 8192)  # --long-rows: --attention blockwise (+ gradient checkpointing)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def toml_config(
    model: Path,
    data: Path,
    out: Path,
    batch: int,
    seq: int,
    kernels: str,
    diag: bool,
    attention: str = "eager",
    checkpointing: bool = False,
) -> str:
    return f"""[training]
trainer = "sft"
seed = {SEED}
epochs = 1
batch_size = {batch}
accumulation = 1
learning_rate = {LR}
warmup_steps = 0
lr_schedule = "cosine"
precision = "f32"
max_length = {seq}

[model]
path = "{model}"
chat_template = "off"
attention = "{attention}"
lora_rank = {RANK}
lora_alpha = {ALPHA}

[data]
examples = "{data}"

[backend]
devices = "cpu"
[backend.options]
threads = 1
cpu_kernels = "{kernels}"
gradient_checkpointing = {"true" if checkpointing else "false"}

[logging]
dir = "{out}"
diag = {"true" if diag else "false"}

[optimizer_batch]
capture = true
capture_steps = [0]
"""


def tree_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def capture_bytes(out: Path) -> dict[str, int]:
    stem = out / "optimizer_batch_step_000000"
    payload = tree_bytes(Path(f"{stem}.safetensors")) + tree_bytes(Path(f"{stem}.manifest.json"))
    state = tree_bytes(Path(f"{stem}.state")) + tree_bytes(Path(f"{stem}.final"))
    return {"payload_manifest": payload, "with_state_final": payload + state}


class Runner:
    def __init__(self, work: Path, model: Path, args: argparse.Namespace) -> None:
        self.work, self.model, self.args = work, model, args
        self.n = 0
        self.extra_env: dict[str, str] = {}

    def steps_for(self, tokens: int) -> int:
        return 2 if tokens >= BIG and not self.args.quick else self.args.steps

    def rows(self, batch: int, seq: int, steps: int) -> Path:
        path = self.work / f"rows-{batch}x{seq}x{steps}.jsonl"
        return path if path.exists() else exact_rows(self.model, path, batch * steps, seq)

    def toml_run(
        self,
        batch: int,
        seq: int,
        diag: bool,
        attention: str = "eager",
        checkpointing: bool = False,
    ) -> dict[str, Any]:
        self.n += 1
        steps = self.steps_for(batch * seq)
        out = self.work / f"run{self.n}"
        cfg = self.work / f"run{self.n}.toml"
        data = self.rows(batch, seq, steps)
        cfg.write_text(toml_config(self.model, data, out, batch, seq, self.args.cpu_kernels, diag,
                                   attention, checkpointing))  # fmt: skip
        cmd = [sys.executable, "-m", "twinrun", "run", str(cfg), "--quiet"]
        wall, cpu, rss = run_child(cmd, child_env(1) | self.extra_env)
        walls = step_walls(out)
        res = {
            "batch": batch, "seq": seq, "tokens": batch * seq, "steps": steps, "diag": diag,
            "step_s": spread(walls, 4), "process_s": wall, "process_cpu_s": cpu,
            "max_rss_mib": rss / 2**20, "capture_bytes": capture_bytes(out),
        }  # fmt: skip
        if diag:
            res["diag_bytes_per_step"] = (out / "diag.jsonl").stat().st_size / steps
        res |= {"attention": attention, "gradient_checkpointing": checkpointing}
        tag = ("diag" if diag else "plain") + f", {attention}" + (" + gc" if checkpointing else "")
        print(f"  {batch} x {seq} ({tag}): {res['step_s']['median']:.3f} s/step, "
              f"{res['max_rss_mib']:.0f} MiB, process {wall:.1f} s", file=sys.stderr)  # fmt: skip
        return res

    def procs_run(self, nproc: int) -> dict[str, Any]:
        self.n += 1
        steps, batch, acc = self.args.steps, 2, 2
        seq = 16 if self.args.quick else BATCH_SEQ
        out = self.work / f"run{self.n}"
        data = self.rows(batch * acc, seq, steps)
        launch = [sys.executable, "-m", "twinrun"]
        if nproc > 1:
            launch = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                      str(nproc), "--master-addr", "127.0.0.1", "--master-port",
                      str(free_port()), "-m", "twinrun"]  # fmt: skip
        args = ["tune", "sft", "--model", str(self.model), "--examples", str(data),
                "--output", str(out), "--seed", str(SEED), "--epochs", "1",
                "--batch-size", str(batch), "--accumulation", str(acc),
                "--learning-rate", str(LR), "--warmup-steps", "0", "--lr-schedule", "cosine",
                "--lora-rank", str(RANK), "--lora-alpha", str(ALPHA), "--precision", "f32",
                "--chat-template", "off", "--max-length", str(seq), "--threads", "1",
                "--cpu-kernels", self.args.cpu_kernels, "--quiet"]  # fmt: skip
        wall, cpu, rss = run_child([*launch, *args], child_env(1))
        res = {
            "processes": nproc, "batch": batch, "accumulation": acc, "seq": seq, "steps": steps,
            "step_s": spread(step_walls(out), 4), "process_s": wall, "process_cpu_s": cpu,
            "max_rss_mib": rss / 2**20,
        }  # fmt: skip
        print(f"  {nproc} process(es): {res['step_s']['median']:.3f} s/step, "
              f"{res['max_rss_mib']:.0f} MiB", file=sys.stderr, flush=True)  # fmt: skip
        return res


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    model = smollm2_dir()
    cfg = model_config(model)
    run = Runner(work, model, args)
    seqs, batches, batch_seq = (
        ((16, 32), (1, 2), 16) if args.quick else (SEQ_LENGTHS, BATCHES, BATCH_SEQ)
    )
    runs: dict[tuple[int, int, bool], dict[str, Any]] = {}
    for b in batches:  # the batch sweep, each with its --diag twin right after
        for diag in (False, True):
            runs[(b, batch_seq, diag)] = run.toml_run(b, batch_seq, diag)
    for t in seqs:
        if (1, t, False) not in runs:
            runs[(1, t, False)] = run.toml_run(1, t, False)
    procs = [run.procs_run(1), run.procs_run(2)]
    base = runs[(1, min(seqs), False)]
    base_flops = step_flops(cfg, 1, min(seqs))
    heads, layers = cfg["num_attention_heads"], cfg["num_hidden_layers"]

    def growth(r: dict[str, Any]) -> dict[str, Any]:
        b, t = r["batch"], r["seq"]
        measured = r["step_s"]["median"] / base["step_s"]["median"]
        expected = step_flops(cfg, b, t) / base_flops
        return {
            "batch": b, "seq": t, "tokens": b * t, "steps": r["steps"],
            "step_s": r["step_s"], "measured_ratio": measured,
            "expected_flops_ratio": expected, "token_ratio": b * t / base["tokens"],
            "attention_share": attention_share(cfg, b, t), "measured_over_expected":
            measured / expected, "flagged": not TOLERANCE[0] <= measured / expected <= TOLERANCE[1],
            "gflop": step_flops(cfg, b, t) / 1e9, "max_rss_mib": r["max_rss_mib"],
            "rss_growth_mib": r["max_rss_mib"] - base["max_rss_mib"],
            "t2_copy_mib": layers * b * heads * t * t * 4 / 2**20,
            "capture_bytes": r["capture_bytes"],
        }  # fmt: skip

    diag_rows = []
    for b in batches:
        off, on = runs[(b, batch_seq, False)], runs[(b, batch_seq, True)]
        diag_rows.append({
            "batch": b, "seq": batch_seq, "rows": b,
            "step_s": {"without": off["step_s"], "with": on["step_s"]},
            "overhead": on["step_s"]["median"] / off["step_s"]["median"] - 1,
            "process_cpu_s": {"without": off["process_cpu_s"], "with": on["process_cpu_s"]},
            "cpu_overhead_s": on["process_cpu_s"] - off["process_cpu_s"],
            "steps": on["steps"], "diag_bytes_per_step": on["diag_bytes_per_step"],
        })  # fmt: skip
    return {
        "seq_sweep": [growth(runs[(1, t, False)]) for t in seqs],
        "batch_sweep": [growth(runs[(b, batch_seq, False)]) for b in batches],
        "processes": procs,
        "process_speedup": procs[0]["step_s"]["median"] / procs[1]["step_s"]["median"],
        "diag": diag_rows,
        "runs": [v | {"key": list(k)} for k, v in runs.items()],
    }


def measure_long(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    """Long rows at batch 1: eager at LONG_EAGER tokens, blockwise attention with gradient
    checkpointing at LONG_BLOCKWISE tokens (and without checkpointing at the shortest)."""
    model = smollm2_dir()
    cfg = model_config(model)
    run = Runner(work, model, args)
    eager, blockwise = ((16, 32), (32, 64)) if args.quick else (LONG_EAGER, LONG_BLOCKWISE)
    plans = [(t, "eager", False) for t in eager] + [(blockwise[0], "blockwise", False)]
    plans += [(t, "blockwise", True) for t in blockwise]
    if args.mmap_threshold:  # the allocator rows: blockwise + checkpointing only
        run.extra_env = {"MALLOC_MMAP_THRESHOLD_": str(args.mmap_threshold)}
        plans = [(t, "blockwise", True) for t in blockwise]
    rows = []
    for t, attention, gc in plans:
        r = run.toml_run(1, t, False, attention, gc)
        rows.append({
            "seq": t, "attention": attention, "gradient_checkpointing": gc, "steps": r["steps"],
            "step_s": r["step_s"], "max_rss_mib": r["max_rss_mib"], "process_s": r["process_s"],
            "malloc_mmap_threshold": args.mmap_threshold,
            "logits_mib": t * cfg["vocab_size"] * 4 / 2**20,
            "t2_copy_mib": cfg["num_hidden_layers"] * cfg["num_attention_heads"] * t * t * 4
            / 2**20,
        })  # fmt: skip
    return rows


def long_table(long: dict[str, Any], extra: dict[str, Any] | None = None) -> list[str]:
    m = long["machine"]
    la0, la1 = m["load_1min_start_end"]
    lines = [
        f"**Long rows** (batch 1; measured {long['date']}, commit {m['commit']}, "
        f"`--cpu-kernels {long['settings']['cpu_kernels']}`, load average {la0:.2f} at start, "
        f"{la1:.2f} at end; {long['settings']['steps_note']}): eager attention against "
        "`--attention blockwise` (memory linear in T) with and without "
        "`--gradient-checkpointing`. One f32 copy of the logits is T × vocabulary × 4 bytes.",
        "",
        "| T | attention | checkpointing | glibc mmap threshold | s/step | peak RSS MiB "
        "| one T² f32 copy MiB | one logits copy MiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    allocator = (extra or {}).get("rows", [])
    for r in long["rows"] + allocator:
        threshold = r.get("malloc_mmap_threshold")
        lines.append(
            f"| {r['seq']} | {r['attention']} | {'yes' if r['gradient_checkpointing'] else 'no'} "
            f"| {f'{threshold >> 20} MiB' if threshold else 'glibc default'} "
            f"| {sp(r['step_s'])} | **{r['max_rss_mib']:.0f}** | {r['t2_copy_mib']:.0f} "
            f"| {r['logits_mib']:.0f} |"
        )
    if allocator:
        assert extra is not None
        e = extra["machine"]
        lines += [
            "",
            f"The rows with a fixed mmap threshold (`MALLOC_MMAP_THRESHOLD_` in the process's "
            f"environment; measured {extra['date']}, load average "
            f"{e['load_1min_start_end'][0]:.2f} → {e['load_1min_start_end'][1]:.2f}): by "
            "default glibc raises its threshold to the size of each large block freed, so the "
            "blockwise loop's freed block temporaries stay in the heap between the live "
            "tensors — the process keeps freed memory it no longer uses. The allocator changes "
            "no byte of the run.",
        ]
    return [*lines, ""]


def sp(s: dict[str, Any], fmt: str = "{:.3f}") -> str:
    return f"{fmt.format(s['median'])} ({fmt.format(s['min'])}–{fmt.format(s['max'])})"


def growth_table(rows: list[dict[str, Any]], first: str) -> list[str]:
    lines = [
        f"| {first} | tokens | timed steps | s/step | measured ratio | expected (FLOPs) "
        "| tokens ratio | attention share of FLOPs | measured ÷ expected | peak RSS MiB "
        "| RSS growth MiB | one T² f32 copy MiB | growth ÷ T² copy |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        key = f"{r['batch']} × {r['seq']}"
        flag = " ⚠" if r["flagged"] else ""
        lines.append(
            f"| {key} | {r['tokens']} | {r['steps'] - 1} | {sp(r['step_s'])} | "
            f"{r['measured_ratio']:.2f}× | {r['expected_flops_ratio']:.2f}× | "
            f"{r['token_ratio']:.0f}× | {100 * r['attention_share']:.1f}% | "
            f"**{r['measured_over_expected']:.2f}**{flag} | {r['max_rss_mib']:.0f} | "
            f"{r['rss_growth_mib']:+.0f} | {r['t2_copy_mib']:.0f} | "
            f"{r['rss_growth_mib'] / r['t2_copy_mib']:.1f} |"
        )
    return lines


def markdown(res: dict[str, Any]) -> str:
    m = res["machine"]
    la0, la1 = m["load_1min_start_end"]
    flagged = [r for r in res["seq_sweep"] + res["batch_sweep"] if r["flagged"]]
    lines = [
        f"Measured {res['date']} by `python -m bench scaling` on {m['cores']} CPUs ({m['cpu']}), "
        f"torch {m['versions']['torch']}, transformers {m['versions']['transformers']}, commit "
        f"{m['commit']}; load average {la0:.2f} at start, {la1:.2f} at end (a shared machine: "
        "single processes, medians over few steps). SmolLM2-135M, f32, LoRA rank 8 on q/k/v/o, "
        f"eager attention, one thread per process, `--cpu-kernels {res['settings']['cpu_kernels']}`"
        f"; {res['settings']['steps']} steps per process ({BIG}+ tokens per step: 2), step 0 left "
        "out; each configuration a fresh process. Ratios are to the first row of the first table "
        "(1 × the shortest sequence); expected = the ratio of model FLOPs "
        "(`utilisation.step_flops`: every matmul of the forward and backward), which is the token "
        "ratio while the linear layers dominate plus attention's T² term; ⚠ = measured ÷ "
        f"expected outside {TOLERANCE[0]}–{TOLERANCE[1]}.",
        "",
        "**Sequence length** (batch 1):",
        "",
        *growth_table(res["seq_sweep"], "B × T"),
        "",
        f"**Batch size** ({res['batch_sweep'][0]['seq']} tokens per row):",
        "",
        *growth_table(res["batch_sweep"], "B × T"),
        "",
    ]
    if flagged:
        worst = max(flagged, key=lambda r: abs(r["measured_over_expected"] - 1))
        names = ", ".join(f"{r['batch']} × {r['seq']}" for r in flagged)
        lines += [
            f"Departures from the FLOP slope: {names}"
            f" (largest at {worst['batch']} × {worst['seq']}: "
            f"{worst['measured_over_expected']:.2f}× the expected time).",
            "",
        ]
    longest = res["seq_sweep"][-1]
    lines += [
        f"Memory: at {longest['batch']} × {longest['seq']} the peak RSS grew "
        f"{longest['rss_growth_mib']:+.0f} MiB over the first row, "
        f"{longest['rss_growth_mib'] / longest['t2_copy_mib']:.1f}× one f32 copy of every "
        "layer's T × T attention probabilities: eager attention keeps T² tensors for the "
        "backward, so memory grows with T², not with the tokens, at long sequences.",
        "",
    ]
    if res.get("long_rows"):
        lines += long_table(res["long_rows"], res.get("long_rows_allocator"))
    p = res["processes"]
    lines += [
        f"**Process count** (`tune sft`, batch {p[0]['batch']} × accumulation "
        f"{p[0]['accumulation']}, {p[0]['seq']} tokens: 2 processes run one forward each):",
        "",
        "| processes | s/step | peak RSS MiB (largest process) | whole run s |",
        "|---|---|---|---|",
        *(
            f"| {x['processes']} | {sp(x['step_s'])} | {x['max_rss_mib']:.0f} | "
            f"{x['process_s']:.1f} |"
            for x in p
        ),
        "",
        f"Speed-up 1 → 2 processes: **{res['process_speedup']:.2f}×** (expected ≤ 2: half the "
        "forwards and backwards each, on 2 cores, plus the ordered gather).",
        "",
        "**`--diag` vs rows** (each run right after its twin without `--diag`):",
        "",
        "| rows × tokens | s/step without | s/step with | overhead | process CPU s without → "
        "with | diag.jsonl bytes per step |",
        "|---|---|---|---|---|---|",
        *(
            f"| {d['rows']} × {d['seq']} | {sp(d['step_s']['without'])} | "
            f"{sp(d['step_s']['with'])} | **{100 * d['overhead']:+.1f}%** | "
            f"{d['process_cpu_s']['without']:.1f} → {d['process_cpu_s']['with']:.1f} "
            f"({d['cpu_overhead_s']:+.1f}) | {d['diag_bytes_per_step']:.0f} |"
            for d in res["diag"]
        ),
        "",
        "**Capture size vs rows** (the step-0 capture of each run above):",
        "",
        "| rows × tokens | tokens | payload + manifest, bytes | bytes per token "
        "| with `.state/` + `.final/`, bytes |",
        "|---|---|---|---|---|",
    ]
    seen = set()
    for r in res["batch_sweep"] + res["seq_sweep"]:
        key = (r["batch"], r["seq"])
        if key in seen:
            continue
        seen.add(key)
        c = r["capture_bytes"]
        lines.append(
            f"| {r['batch']} × {r['seq']} | {r['tokens']} | {c['payload_manifest']:,} | "
            f"{c['payload_manifest'] / r['tokens']:.1f} | {c['with_state_final']:,} |"
        )
    if res.get("quick"):
        lines += ["", "Note: a `--quick` run (tiny shapes)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3, help="steps per process (default 3)")
    ap.add_argument("--cpu-kernels", choices=["native", "portable"], default="native")
    ap.add_argument("--quick", action="store_true", help="tiny shapes, 2 steps; no files")
    ap.add_argument("--render", action="store_true", help="regenerate .md/docs from the JSON")
    ap.add_argument("--long-rows", action="store_true",
                    help="measure only the long-row table; merge it into the JSON")  # fmt: skip
    ap.add_argument(
        "--mmap-threshold",
        type=int,
        default=0,
        help="--long-rows: blockwise + checkpointing at MALLOC_MMAP_THRESHOLD_=N",
    )
    args = ap.parse_args()
    if args.render:
        write_outputs(json.loads((RESULTS / "scaling.json").read_text(encoding="utf-8")))
        return
    if args.long_rows:
        long_rows(args)
        return
    if args.quick:
        args.steps = 2
    if args.steps < 2:
        sys.exit("--steps must be at least 2 (step 0 is a warm-up)")
    started = time.perf_counter()
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="twinrun-bench-scaling-") as tmp:
        measured = measure(args, Path(tmp))
    load.append(os.getloadavg()[0])
    res = {
        "benchmark": "scaling",
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "quick": args.quick,
        "settings": {"steps": args.steps, "cpu_kernels": args.cpu_kernels, "threads": 1,
                     "lora_rank": RANK, "lora_alpha": ALPHA, "attention": "eager",
                     "big_tokens_two_steps": BIG, "tolerance": TOLERANCE},
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "load_1min_start_end": load,
                    "commit": git("rev-parse", "--short", "HEAD"),
                    "versions": package_versions("torch", "transformers")},
        **measured,
        "bench_s": round(time.perf_counter() - started, 1),
    }  # fmt: skip
    print(markdown(res))
    print(f"bench took {res['bench_s']} s", file=sys.stderr)
    if not args.quick:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "scaling.json").write_text(json.dumps(res, indent=2) + "\n", encoding="utf-8")
        write_outputs(res)


def long_rows(args: argparse.Namespace) -> None:
    """`--long-rows`: the long-row table alone, kept under `long_rows` in scaling.json (the
    other tables' figures are left as they were measured)."""
    if args.quick:
        args.steps = 2
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="twinrun-bench-long-") as tmp:
        rows = measure_long(args, Path(tmp))
    load.append(os.getloadavg()[0])
    long = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "settings": {"cpu_kernels": args.cpu_kernels, "threads": 1, "lora_rank": RANK,
                     "steps_note": f"{BIG}+ tokens per step: 2 steps, step 0 left out"},
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "load_1min_start_end": load,
                    "commit": git("rev-parse", "--short", "HEAD"),
                    "versions": package_versions("torch", "transformers")},
        "rows": rows,
    }  # fmt: skip
    print("\n".join(long_table(long)))
    if args.quick:
        return
    res = json.loads((RESULTS / "scaling.json").read_text(encoding="utf-8"))
    res["long_rows_allocator" if args.mmap_threshold else "long_rows"] = long
    (RESULTS / "scaling.json").write_text(json.dumps(res, indent=2) + "\n", encoding="utf-8")
    write_outputs(res)


def write_outputs(res: dict[str, Any]) -> None:
    """bench/results/scaling.md and the docs section, from the results."""
    body = markdown(res)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "scaling.md").write_text("# scaling\n\n" + body, encoding="utf-8")
    update_docs_section(
        "scaling",
        "Scaling — SmolLM2 step time and memory vs sequence, batch and processes",
        "How an SFT step's time and peak memory grow with the sequence length, the batch and the "
        "process count against the FLOP count's slope, and what `--diag` and a capture cost as "
        "the rows grow. Generated by `python -m bench scaling` (also in "
        "`bench/results/scaling.md`); do not edit between the markers.",
        body,
    )


if __name__ == "__main__":
    main()
