"""Benchmark: `--shard-base` (the frozen base sharded with FSDP2 under torchrun) against unsharded
runs: per-process memory, step time, and the bytes each process communicates per step.

Every run is `tune sft` started through this file's child launcher (`--child`): it pins the
portable environment, runs `twinrun.cli.main.run_cli(args)` in the process (on its own, or as
torchrun's target on N processes, gloo on loopback), leaves the process group, and writes one JSON
per rank: the RSS when the session is built (after the load, and after the sharding when
sharded), the peak RSS up to then (`ru_maxrss`: the load), the peak after it (the kernel's peak
counter reset there through /proc/self/clear_refs: the training), the RSS at the end after
`gc.collect()`, and, when SHARD_BENCH_COUNT=1, the collectives it called.

1. Memory: `base_bytes_here` of the sidecar (rank 0's bytes of base weights) and each process's
   RSS, unsharded on 1 process, sharded on 2 and 3. Every process loads the whole checkpoint
   before it shards it, so the peak during the load is not divided.
2. Step time: per-step `wall_s` from metrics.jsonl (step 0 left out): 1 process, 2 processes
   data-parallel, 2 and 3 processes sharded; each adapter compared byte for byte with the
   1-process one.
3. Bytes per step: `torch.distributed.all_gather_single` (what FSDP2 calls: `dist.all_gather_single`
   looked up on the module at call time, in `_fsdp_collectives.py`), `all_gather_into_tensor`,
   `all_gather`, `all_reduce`, `reduce_scatter_single`, `broadcast` and `all_gather_object` (by
   pickled size) wrapped in the child, on separate runs for the toy (its timed runs are
   unwrapped) and on the SmolLM2 runs themselves (one run each).

Models: the toy (`twinrun toy-model --seed 0`), the 64 shipped examples, batch 2, accumulation
4, LoRA rank 8; SmolLM2-135M-Instruct (the cached checkpoint of tests/real/smollm2.py; skipped
with a note when it cannot be had), the first 8 shipped examples, batch 1, accumulation 2,
`--max-length 64`.

    python bench/shard_base.py [--repeats 3] [--smol-repeats 1]

Writes bench/results/shard_base.{json,md} and its section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchkit import cpu_name, git, smollm2_dir, spread, update_docs_section

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
THIS = str(Path(__file__).resolve())
SHIPPED_SFT = ROOT / "src" / "twinrun" / "examples" / "sft.jsonl"
COUNT_ENV = "SHARD_BENCH_COUNT"
SRC = ROOT / "src"  # the twinrun the runs import (--src-from-head: HEAD's, exported)
GATHERS = ("all_gather_single", "all_gather_into_tensor", "all_gather")
# model -> batch, accumulation, rows of the shipped examples, extra flags
SETUPS: dict[str, dict[str, Any]] = {
    "toy": {"batch": 2, "accumulation": 4, "rows": 64, "extra": []},
    "smollm2": {"batch": 1, "accumulation": 2, "rows": 8, "extra": ["--max-length", "64"]},
}
# run name -> processes, sharded
RUNS = {"1": (1, False), "2": (2, False), "2-shard": (2, True), "3-shard": (3, True),
        "2-shard-mmap": (2, True)}  # fmt: skip
# a fixed glibc mmap threshold: freed large buffers go back to the system at once (the default
# threshold grows with the buffers freed, and later ones of that size stay in the heap)
RUN_ENV = {"2-shard-mmap": {"MALLOC_MMAP_THRESHOLD_": "1048576"}}
TOY_RUNS = ("1", "2", "2-shard", "3-shard")
SMOL_RUNS = ("1", "2-shard", "3-shard", "2-shard-mmap")
COUNTED = ("2-shard", "3-shard")


# ----------------------------------------------------------------------------- the child


def status_kib(field: str) -> int:
    with open("/proc/self/status", encoding="utf-8") as f:
        line = next(ln for ln in f if ln.startswith(field + ":"))
    return int(line.split()[1])


def maxrss_kib() -> int:
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def count_collectives(tally: dict[str, dict[str, int]]) -> None:
    """Wrap torch.distributed's collectives (module attributes, looked up at call time by FSDP2
    and twinrun) to add up, per function: calls, `sent` (this process's input bytes) and
    `received` (gathers: the output's bytes from the other processes; reductions and
    broadcasts: the tensor's bytes)."""
    import inspect
    import pickle

    import torch.distributed as dist

    def nbytes(t: Any) -> int:
        return int(t.numel() * t.element_size())

    def sizes(name: str, a: dict[str, Any]) -> tuple[int, int]:
        if name in ("all_gather_single", "all_gather_into_tensor"):
            sent = nbytes(a["input_tensor"])
            return sent, nbytes(a["output_tensor"]) - sent
        if name == "all_gather":
            sent = nbytes(a["tensor"])
            return sent, sum(nbytes(t) for t in a["tensor_list"]) - sent
        if name in ("reduce_scatter_single", "reduce_scatter_tensor"):
            return nbytes(a["input"]), nbytes(a["output"])
        return nbytes(a["tensor"]), nbytes(a["tensor"])  # all_reduce, broadcast

    def wrap(name: str) -> None:
        orig = getattr(dist, name)
        sig = inspect.signature(orig)

        def counted(*args: Any, **kwargs: Any) -> Any:
            bound = sig.bind(*args, **kwargs).arguments
            out = orig(*args, **kwargs)
            if name == "all_gather_object":
                sent = len(pickle.dumps(bound["obj"]))
                got = sum(len(pickle.dumps(o)) for o in bound["object_list"]) - sent
            else:
                sent, got = sizes(name, bound)
            row = tally.setdefault(name, {"calls": 0, "sent": 0, "received": 0})
            row["calls"] += 1
            row["sent"] += sent
            row["received"] += got
            return out

        setattr(dist, name, counted)

    for name in (*GATHERS, "all_reduce", "reduce_scatter_single", "reduce_scatter_tensor",
                 "broadcast", "all_gather_object"):  # fmt: skip
        if hasattr(dist, name):
            wrap(name)


def unit_bytes(model: Any, world: int) -> dict[str, int]:
    """Frozen bytes of the decoder layers and of the root unit (the rest), as they are and as
    FSDP2 gathers them (each weight's dim 0 padded to a multiple of the processes)."""
    import math

    def frozen(ps: Any) -> list[Any]:
        return [p for p in ps if not p.requires_grad]

    def size(p: Any, pad: bool) -> int:
        if p.dim() == 0:
            return int(p.element_size())
        rows = -(-p.shape[0] // world) * world if pad else p.shape[0]
        return int(rows * math.prod(p.shape[1:]) * p.element_size())

    layer_ids: set[int] = set()
    out = {"layers": 0, "layers_padded": 0, "root": 0, "root_padded": 0, "layers_n": 0}
    for layer in model.decoder_layers():
        out["layers_n"] += 1
        for p in frozen(layer.parameters()):
            layer_ids.add(id(p))
            out["layers"] += size(p, False)
            out["layers_padded"] += size(p, True)
    for p in frozen(model.parameters()):
        if id(p) not in layer_ids:
            out["root"] += size(p, False)
            out["root_padded"] += size(p, True)
    return out


def child(report_dir: str, args: list[str]) -> int:
    """One process of a run: `run_cli(args)` with its memory (and collectives) recorded."""
    from twinrun.core.portable import pin_environment

    pin_environment()  # before anything imports torch
    import gc

    report: dict[str, Any] = {"rank": int(os.environ.get("RANK", "0"))}
    tally: dict[str, dict[str, int]] = {}
    if os.environ.get(COUNT_ENV) == "1":
        count_collectives(tally)
    import twinrun.train.sharding as sharding
    from twinrun.train import session

    shard = sharding.shard_base  # session.py imports it at call time: the patch is seen

    def shard_recorded(model: Any, params: Any, device: str) -> dict[str, int]:
        gc.collect()
        report["rss_before_shard_kib"] = status_kib("VmRSS")
        world = int(os.environ.get("WORLD_SIZE", "1"))
        report["units"] = unit_bytes(model, world)
        return shard(model, params, device)

    sharding.shard_base = shard_recorded
    init = session.Session.__init__

    def init_recorded(self: Any, *a: Any, **k: Any) -> None:
        init(self, *a, **k)
        gc.collect()
        report["rss_session_kib"] = status_kib("VmRSS")
        report["peak_load_kib"] = maxrss_kib()
        with open("/proc/self/clear_refs", "w") as f:  # the peak counter from here on
            f.write("5")

    session.Session.__init__ = init_recorded  # type: ignore[method-assign]
    from twinrun.cli.main import run_cli

    code = run_cli(args)
    if code == 0:
        from twinrun.train.distributed import teardown

        teardown()
    report["peak_train_kib"] = maxrss_kib()  # since the reset in the Session hook
    gc.collect()
    report["rss_end_kib"] = status_kib("VmRSS")
    report["ru_maxrss_kib"] = max(report.get("peak_load_kib", 0), report["peak_train_kib"])
    report["collectives"] = tally
    report["code"] = code
    Path(report_dir, f"rank-{report['rank']}.json").write_text(json.dumps(report))
    return code


# ----------------------------------------------------------------------------- the parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env(count: bool) -> dict[str, str]:
    path = os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])
    extra = {"PYTHONPATH": path, "OMP_NUM_THREADS": "1", "TWINRUN_DIST_TIMEOUT_S": "300"}
    base = {k: v for k, v in os.environ.items() if k != COUNT_ENV}
    return base | extra | ({COUNT_ENV: "1"} if count else {})


def launcher(nproc: int) -> list[str]:
    if nproc == 1:
        return [sys.executable, THIS]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()), THIS]  # fmt: skip


def sft_args(model: Path, examples: Path, out: Path, setup: dict[str, Any]) -> list[str]:
    return [
        "tune", "sft", "--model", str(model), "--examples", str(examples), "--output", str(out),
        "--seed", "1", "--epochs", "1", "--batch-size", str(setup["batch"]),
        "--accumulation", str(setup["accumulation"]), "--learning-rate", "1e-3",
        "--warmup-steps", "0", "--lr-schedule", "cosine", "--lora-rank", "8",
        "--lora-alpha", "16", "--precision", "f32", "--chat-template", "on", "--quiet",
        "--threads", "1", *setup["extra"],
    ]  # fmt: skip


def run_once(
    model: Path, examples: Path, out: Path, setup: dict[str, Any], name: str, count: bool
) -> dict[str, Any]:
    nproc, sharded = RUNS[name]
    reports = out.parent / f"{out.name}.ranks"
    reports.mkdir(parents=True)
    args = sft_args(model, examples, out, setup) + (["--shard-base"] if sharded else [])
    cmd = [*launcher(nproc), "--child", str(reports), *args]
    t0 = time.perf_counter()
    job = subprocess.run(cmd, env=env(count) | RUN_ENV.get(name, {}), capture_output=True,
                         text=True)  # fmt: skip
    wall = time.perf_counter() - t0
    if job.returncode != 0:
        sys.exit(f"failed ({job.returncode}): {shlex.join(cmd)}\n{job.stderr[-4000:]}")
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    sidecar = json.loads((out / "twinrun.json").read_text())
    ranks = [json.loads((reports / f"rank-{r}.json").read_text()) for r in range(nproc)]
    return {
        "command": shlex.join(["python" if c == sys.executable else c for c in cmd]),
        "process_wall_s": wall,
        "steps": len(rows),
        "step_s": [r["wall_s"] for r in rows[1:]],
        "runtime": {k: v for k, v in sidecar["runtime"].items() if k not in VERSIONS},
        "ranks": ranks,
        "adapter": (out / "adapter_model.safetensors").read_bytes(),
    }


VERSIONS = ("python", "platform", "torch", "transformers", "peft", "safetensors", "numpy",
            "tokenizers", "twinrun")  # fmt: skip


def kib_spread(runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """MiB: the largest value over a run's processes, spread over the runs."""
    return spread([max(r[key] for r in run["ranks"]) / 1024 for run in runs], 1)


def per_step(run: dict[str, Any], world: int, forwards: int) -> dict[str, Any]:
    """Rank 0's collectives per step (whole run / steps), and the expected FSDP2 gathers."""
    steps = run["steps"]
    coll = run["ranks"][0]["collectives"]
    fsdp = coll.get("all_gather_single", {"calls": 0, "sent": 0, "received": 0})
    others = {k: v for k, v in coll.items() if k != "all_gather_single"}
    out: dict[str, Any] = {
        "world": world,
        "steps": steps,
        "forwards_per_process": forwards,
        "fsdp_gather_calls_per_step": fsdp["calls"] / steps,
        "fsdp_gather_received_per_step": fsdp["received"] / steps,
        "fsdp_gather_sent_per_step": fsdp["sent"] / steps,
        "other_received_per_step": sum(v["received"] for v in others.values()) / steps,
        "other_sent_per_step": sum(v["sent"] for v in others.values()) / steps,
        "by_function": coll,
        "fsdp_same_on_every_rank": all(
            r["collectives"].get("all_gather_single") == coll.get("all_gather_single")
            for r in run["ranks"]
        ),
    }
    units = run["ranks"][0].get("units")
    if units:
        base = run["runtime"]["base_bytes"]
        share = (world - 1) / world
        out["expected_simple"] = 2 * share * base * forwards
        # the root unit (embeddings, final norm, head) stays gathered from its forward through
        # its backward (FSDP2's default for the root: reshard_after_forward False)
        out["expected_root_kept"] = (
            share * (2 * units["layers_padded"] + units["root_padded"]) * forwards
        )
        out["expected_calls"] = (2 * units["layers_n"] + 1) * forwards
        out["units"] = units
    return out


def measure(model_dir: Path, work: Path, key: str, names: tuple[str, ...], repeats: int,
            timed: bool) -> dict[str, Any]:  # fmt: skip
    """`names` runs, alternately, `repeats` times (counting the collectives unless `timed`),
    then (when `timed`) one counting run of each of COUNTED."""
    setup = SETUPS[key]
    examples = work / f"{key}.jsonl"
    lines = SHIPPED_SFT.read_text(encoding="utf-8").splitlines(keepends=True)
    examples.write_text("".join(lines[: setup["rows"]]), encoding="utf-8")
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(repeats):
        for n in names:
            out = work / f"{key}-{n}-{r}"
            runs[n].append(run_once(model_dir, examples, out, setup, n, count=not timed))
    counted = (
        {
            n: run_once(model_dir, examples, work / f"{key}-{n}-count", setup, n, True)
            for n in COUNTED
        }  # fmt: skip
        if timed
        else {n: runs[n][0] for n in COUNTED if n in runs}
    )
    one = runs["1"][0]["adapter"]
    acc = setup["accumulation"]
    base = next(x["runtime"]["base_bytes"] for n, v in runs.items() if RUNS[n][1] for x in v)
    rows: dict[str, Any] = {}
    for n, rs in runs.items():
        world, sharded = RUNS[n]
        meds = [statistics.median(x["step_s"]) for x in rs]
        pooled = [t for x in rs for t in x["step_s"]]
        rows[n] = {
            "processes": world,
            "sharded": sharded,
            "step_s": spread(meds if repeats > 1 else pooled, 5),
            "step_s_of": "run medians" if repeats > 1 else "steps of the run",
            "process_wall_s": spread([x["process_wall_s"] for x in rs], 2),
            "same_adapter": all(x["adapter"] == one for x in rs),
            "base_bytes_here": rs[0]["runtime"].get("base_bytes_here", base),
            "peak_load_mib": kib_spread(rs, "peak_load_kib"),
            "rss_session_mib": kib_spread(rs, "rss_session_kib"),
            "peak_train_mib": kib_spread(rs, "peak_train_kib"),
            "rss_end_mib": kib_spread(rs, "rss_end_kib"),
            "ru_maxrss_mib": kib_spread(rs, "ru_maxrss_kib"),
            "rss_before_shard_mib": (kib_spread(rs, "rss_before_shard_kib") if sharded else None),
            "per_rank_ru_maxrss_mib": [
                [round(k["ru_maxrss_kib"] / 1024, 1) for k in x["ranks"]] for x in rs
            ],
            "commands": [x["command"] for x in rs],
            "runtime": rs[0]["runtime"],
        }
    t1 = statistics.median(rows["1"]["step_s"]["all"])
    for row in rows.values():
        row["speedup"] = t1 / statistics.median(row["step_s"]["all"])
    bytes_ = {
        n: per_step(run, RUNS[n][0], -(-acc // RUNS[n][0])) | {"command": run["command"]}
        for n, run in counted.items()
    }
    for n, run in counted.items():
        bytes_[n]["same_adapter"] = run["adapter"] == one
    return {
        "setup": setup | {"model": key, "checkpoint": model_dir.name},
        "base_bytes": base,
        "repeats": repeats,
        "wrapped_timing": not timed,
        "runs": rows,
        "bytes": bytes_,
    }


# ----------------------------------------------------------------------------- the report


def fmt(x: dict[str, Any], digits: int = 3) -> str:
    return f"{x['median']:.{digits}f} ({x['min']:.{digits}f}–{x['max']:.{digits}f})"


def label(n: str) -> str:
    world, sharded = RUNS[n]
    extra = "".join(f", `{k}={v}`" for k, v in RUN_ENV.get(n, {}).items())
    return f"{world}, {'`--shard-base`' if sharded else 'unsharded'}{extra}"


def mb(n: float) -> str:
    return f"{n / 1e6:.3f} MB"


def render_model(title: str, m: dict[str, Any]) -> list[str]:
    s, runs, base = m["setup"], m["runs"], m["base_bytes"]
    rep = (
        f"medians (min–max) over {m['repeats']} repeats of each run's median step"
        if m["repeats"] > 1
        else "one run each: median (min–max) over its steps"
    )
    lines = [
        f"### {title}",
        "",
        f"Whole base: {base} bytes ({mb(base)}) of frozen weights; "
        f"the first {s['rows']} shipped examples, batch {s['batch']}, accumulation "
        f"{s['accumulation']}, LoRA rank 8 (the default targets), f32, threads 1 per process"
        + (f", `{' '.join(s['extra'])}`" if s["extra"] else "")
        + f"; {len(runs['1']['step_s']['all'])} value(s) per cell ({rep}).",
        "",
        "Memory per process (MiB; the largest over a run's processes; base bytes: rank 0, "
        "from the sidecar's `base_bytes_here`):",
        "",
        "| processes | base bytes held | of the whole | peak RSS to the session built "
        "(load + sharding) | RSS then, after gc | peak RSS in training | "
        "RSS before sharding, after gc |",
        "|---|---|---|---|---|---|---|",
    ]
    for n, r in runs.items():
        before = fmt(r["rss_before_shard_mib"], 1) if r["rss_before_shard_mib"] else "–"
        lines.append(
            f"| {label(n)} | {r['base_bytes_here']} ({mb(r['base_bytes_here'])}) | "
            f"{r['base_bytes_here'] / base:.3f} | {fmt(r['peak_load_mib'], 1)} | "
            f"{fmt(r['rss_session_mib'], 1)} | {fmt(r['peak_train_mib'], 1)} | {before} |"
        )
    lines += [
        "",
        "Step time (per-step `wall_s`, step 0 left out) and the adapter:",
        "",
        "| processes | step wall s | speed-up vs 1 | whole process wall s | "
        "adapter_model.safetensors |",
        "|---|---|---|---|---|",
    ]
    for n, r in runs.items():
        same = "–" if n == "1" else ("identical to 1 process" if r["same_adapter"] else "DIFFERENT")
        lines.append(
            f"| {label(n)} | {fmt(r['step_s'])} | {r['speedup']:.2f} | "
            f"{fmt(r['process_wall_s'], 1)} | {same} |"
        )
    lines += [
        "",
        "Bytes per step per process (rank 0, the whole run's counts / steps; "
        "F = forwards per process per step, ceil(accumulation / W)):",
        "",
        "| processes | F | FSDP2 all-gathers (calls) | received by FSDP2 all-gathers | "
        "expected 2(W−1)/W·base·F | expected, root unit kept gathered (padded) | "
        "twinrun's own collectives: sent / received | FSDP2 bytes the same on every rank |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n, b in m["bytes"].items():
        calls = f"{b['fsdp_gather_calls_per_step']:g}"
        if "expected_calls" in b:
            calls += f" (expected {b['expected_calls']})"
        simple = f"{b['expected_simple']:.0f}" if "expected_simple" in b else "–"
        kept = f"{b['expected_root_kept']:.0f}" if "expected_root_kept" in b else "–"
        lines.append(
            f"| {label(n)} | {b['forwards_per_process']} | {calls} | "
            f"{b['fsdp_gather_received_per_step']:.0f} | {simple} | {kept} | "
            f"{b['other_sent_per_step']:.0f} / {b['other_received_per_step']:.0f} | "
            f"{b['fsdp_same_on_every_rank']} |"
        )
    return lines


def src_note(r: dict[str, Any]) -> str:
    edits = r["src_uncommitted_edits"]
    if r["src"].startswith("HEAD"):
        note = "src/ as committed, exported with `git archive`"
        return note + ("; the working tree's src/ had uncommitted edits" if edits else "")
    return "the working tree" + (", with uncommitted edits in src/" if edits else "")


def render(r: dict[str, Any]) -> str:
    lines = [
        f"Measured {r['when']} by `{r['command']}` on {r['cpus']} CPUs ({r['cpu']}), torch "
        f"{r['torch']}; load average {r['load'][0]:.2f} at start, {r['load'][1]:.2f} at end "
        "(the machine is shared: wall times wait for a core, and 2 or 3 processes share its "
        f"cores). twinrun at git {r['git']} ({src_note(r)})"
        + f"; the script took {r['script_wall_s']:.0f} s.",
        "",
        "Every run is `tune sft` through the script's child launcher (`run_cli` in the process, "
        "alone or as torchrun's target, gloo on loopback). RSS: `ru_maxrss` when the session is "
        "built (after the load, and the sharding) is the peak up to then; the peak counter is "
        "then reset (/proc/self/clear_refs) and read again at the end: the training's peak. "
        "Every process loads the whole checkpoint before sharding it, so the peak up to the "
        "sharding is not divided by the processes (a known limit of `--shard-base`). An "
        "unsharded RSS after the load can be below the weights' bytes: pages of the weights "
        "count once they are first read. The `MALLOC_MMAP_THRESHOLD_` row is the same sharded "
        "run with glibc's mmap threshold fixed at 1 MiB (by default it grows to the size of "
        "the largest buffer freed, so FSDP2's gathered buffers, freed after each unit, stay in "
        "the heap and count in the RSS). Bytes: "
        "`torch.distributed.all_gather_single` (what FSDP2 calls, looked up on the module at "
        "call time) and the other collectives wrapped in the child; gathers count what arrives "
        "from the other processes, reductions the tensor's bytes, `all_gather_object` the "
        "pickled size. They include the set-up's collectives (the agreement, the sharding), "
        "divided by the steps like the rest. The toy's bytes come from separate runs (its timed "
        "runs are unwrapped); SmolLM2's from its timed runs themselves.",
        "",
    ]
    lines += render_model("Toy model", r["toy"])
    lines.append("")
    if r["smollm2"] is None:
        lines.append(f"SmolLM2-135M-Instruct: not measured ({r['smollm2_note']}).")
    else:
        lines += render_model("SmolLM2-135M-Instruct", r["smollm2"])
    return "\n".join(lines)


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        sys.exit(child(sys.argv[2], sys.argv[3:]))
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3, help="toy repeats")
    ap.add_argument("--smol-repeats", type=int, default=1, help="SmolLM2 repeats")
    ap.add_argument(
        "--src-from-head",
        action="store_true",
        help="measure src/ as committed at HEAD (git archive), not the working tree's",
    )
    a = ap.parse_args()
    import torch

    global SRC

    t0 = time.perf_counter()
    load0 = os.getloadavg()[0]
    smol_note = ""
    dirty = bool(git("status", "--porcelain", "--", "src"))
    commit = git("rev-parse", "--short", "HEAD")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if a.src_from_head:
            archive = subprocess.run(["git", "archive", commit, "src"], cwd=ROOT, check=True,
                                     capture_output=True).stdout  # fmt: skip
            subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
            SRC = work / "src"
        toy = work / "toy-model"
        subprocess.run([sys.executable, "-m", "twinrun", "toy-model", str(toy), "--seed", "0"],
                       env=env(False), check=True, capture_output=True)  # fmt: skip
        toy_r = measure(toy, work, "toy", TOY_RUNS, a.repeats, timed=True)
        try:
            smol: Path | None = smollm2_dir()
        except Exception as exc:  # no cache and no way to build it: say so, measure the toy
            smol, smol_note = None, f"{type(exc).__name__}: {exc}"
        smol_r = (
            measure(smol, work, "smollm2", SMOL_RUNS, a.smol_repeats, timed=False)
            if smol is not None
            else None
        )
    argv = ["python", "bench/shard_base.py"]
    if a.repeats != 3:
        argv += ["--repeats", str(a.repeats)]
    if a.smol_repeats != 1:
        argv += ["--smol-repeats", str(a.smol_repeats)]
    if a.src_from_head:
        argv.append("--src-from-head")
    result = {
        "when": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpus": os.cpu_count(), "cpu": cpu_name(), "torch": torch.__version__,
        "load": [load0, os.getloadavg()[0]], "git": commit,
        "command": shlex.join(argv), "script_wall_s": time.perf_counter() - t0,
        "src": "HEAD (git archive)" if a.src_from_head else "working tree",
        "src_uncommitted_edits": dirty,
        "toy": toy_r, "smollm2": smol_r, "smollm2_note": smol_note,
    }  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "shard_base.json").write_text(json.dumps(result, indent=2) + "\n")
    body = render(result)
    (RESULTS / "shard_base.md").write_text("# Sharded base (--shard-base)\n\n" + body + "\n")
    update_docs_section(
        "shard_base",
        "Sharded base (--shard-base): memory, step time, bytes",
        "Per-process memory, step time and bytes communicated per step of `--shard-base` (the "
        "frozen base sharded with FSDP2 under torchrun) against unsharded runs, on the toy "
        "model and SmolLM2-135M-Instruct. Generated by `python bench/shard_base.py` (also in "
        "`bench/results/shard_base.md`); do not edit between the markers.",
        body,
    )
    print(body)


if __name__ == "__main__":
    main()
