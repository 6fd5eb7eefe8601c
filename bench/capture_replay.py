"""Benchmark: optimizer-batch capture and replay (docs/capture.md).

1. `explain` throughput. Large synthetic captures (`--sizes`: payload and adapter MiB; ragged
   GRPO rows of 512 tokens; the toy model) are checked by
   `twinrun.replay.explain.explain_config` in-process — all seven checks: fresh output, manifest
   pin, payload SHA256, decode and validate, logical digest, initial adapter SHA256, optimizer
   contract (which hashes the model directory). Baseline: plain `hashlib.sha256` over the same
   files (manifest, payload, adapter, model files), 1 MiB reads, one after the other. Both run
   with the files in the page cache, alternating which goes first. Goal: explain throughput
   >= 0.8x hashlib's (ratio of medians, bytes / second).
2. Replay vs the source step, GRPO on the toy model (`python -m twinrun run` in fresh
   processes): a one-step v1 capture from an init-adapter state (4 prompts x 8 completions,
   32 new tokens, arithmetic environment, threads 1) against its replay. Compared: the source
   step's `local_train_wall_s` (rollout + update + optimizer) and the replay's (update +
   optimizer), and whole-process wall. Goal: replay step >= 5x faster than the source step.
3. Repeated replays: min / median / max of the replay step and process times over `--repeats`
   fresh replays, and whether every source and replay ends with the same adapter SHA256.

    python -m bench capture_replay [--repeats 5] [--explain-repeats 15] [--sizes 128:256,8:256]
                                   [--quick] [--render] [--explain-only]

Writes bench/results/capture_replay.{json,md} and the section between `<!-- capture:begin -->`
and `<!-- capture:end -->` in docs/benchmarks.md (`--quick` writes nothing unless `--write`).
`--explain-only` re-measures part 1 and keeps the saved figures of parts 2 and 3 (the page says
when each was measured). `src/` is used as it is on disk.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import benchkit
import numpy as np
from benchkit import update_docs_section

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
RESULTS = benchkit.RESULTS
DOCS = ROOT / "docs" / "benchmarks.md"
EXPLAIN_GOAL, SPEEDUP_GOAL = 0.8, 5.0


def stats(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def fmt(s: dict[str, float], digits: int = 3) -> str:
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"


def twinrun(*args: str) -> float:
    env = os.environ | {"PYTHONPATH": str(ROOT / "src")}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "twinrun", *args], capture_output=True,
                          text=True, env=env)  # fmt: skip
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"twinrun {' '.join(args)} failed:\n{proc.stderr}")
    return wall


def write_toml(path: Path, doc: dict[str, Any]) -> Path:
    import tomli_w

    path.write_text(tomli_w.dumps(doc))
    return path


def replay_doc(source: dict[str, Any], manifest: Path, logical: str, out: Path) -> dict:
    doc = json.loads(json.dumps(source))
    doc["training"]["trainer"] = "optimizer_replay"
    doc["logging"]["dir"] = str(out)
    doc["optimizer_batch"] = {
        "replay_path": str(manifest),
        "expected_logical_sha256": logical,
        "expected_manifest_sha256": hashlib.sha256(manifest.read_bytes()).hexdigest(),
    }
    return doc


# -- 1. explain throughput -----------------------------------------------------------------


def big_capture(root: Path, model: Path, payload_mb: int, adapter_mb: int) -> tuple[Path, int]:
    """A valid capture whose payload and adapter are large; returns (replay config, bytes)."""
    from safetensors.torch import save_file

    from twinrun.capture import manifest as mf
    from twinrun.capture.digests import effective_rows_sha256, logical_sha256
    from twinrun.capture.payload import BatchArrays, encode
    from twinrun.config.contract import optimizer_contract
    from twinrun.config.toml import load_toml
    from twinrun.core.digest import sha256_bytes, sha256_dir, sha256_json
    from twinrun.core.rng import capture_torch_rng

    rng = np.random.default_rng(0)
    length = 512
    rows = max(1, payload_mb * 2**20 // (length * 17) // 2) * 2  # 8 + 1 + 8 bytes per token
    total = rows * length
    prompt = np.full(rows, 64, dtype=np.int64)
    mask = np.ones(total, dtype=np.uint8)
    mask.reshape(rows, length)[:, :64] = 0
    arrays = BatchArrays(
        objective="grpo", step=0, offsets=np.arange(rows + 1, dtype=np.int64) * length,
        tokens=rng.integers(0, 256, total, dtype=np.int64), loss_mask=mask,
        forward_sizes=np.full(rows // 2, 2, dtype=np.int64), denominator=int(mask.sum()),
        extras={"floats.old_logprobs": ("token", -rng.random(total) * mask),
                "floats.advantages": ("row", rng.standard_normal(rows)),
                "floats.weights": ("row", np.ones(rows)),
                "ints.prompt_lengths": ("row", prompt)},
    )  # fmt: skip
    payload = encode(arrays, capture_torch_rng(), 7)
    init = root / "init"
    init.mkdir()
    import torch

    n = adapter_mb * 2**20 // 4 // 64
    save_file({f"w{i}": torch.from_numpy(rng.standard_normal((n, 4), dtype=np.float32))
               for i in range(16)}, str(init / "adapter_model.safetensors"))  # fmt: skip
    (init / "trainer_state.json").write_text(json.dumps({"step": -1}))
    targets = ["k_proj", "o_proj", "q_proj", "v_proj"]
    (init / "adapter_config.json").write_text(
        json.dumps({"r": 4, "lora_alpha": 8, "target_modules": targets})
    )
    src = root / "src"
    src.mkdir()
    (src / mf.payload_name(0)).write_bytes(payload)
    doc = {
        "training": {"trainer": "optimizer_replay", "seed": 7, "learning_rate": 0.05,
                     "warmup_steps": 0,
                     "lr_schedule": "cosine", "batch_size": 2, "precision": "f32"},
        "model": {"path": str(model), "chat_template": "on", "lora_rank": 4, "lora_alpha": 8},
        "grpo": {"clip_eps": 0.2, "temperature": 1.0, "token_cap": 448},
        "backend": {"devices": "cpu", "options": {"threads": 1}},
        "resume": {"from": str(init)},
        "logging": {"dir": str(root / "replay")},
        "optimizer_batch": {"replay_path": str(src / mf.manifest_name(0)),
                            "expected_logical_sha256": "0" * 64,
                            "expected_manifest_sha256": "0" * 64},
    }  # fmt: skip
    cfg = write_toml(root / "replay.toml", doc)
    contract = optimizer_contract(load_toml(cfg).cfg, "grpo", sha256_dir(model), targets)
    manifest = {
        "format": mf.FORMAT, "objective": "grpo", "step": 0,
        "schedule": {"total_steps": 1, "lr": 0.05},
        "payload": {"file": mf.payload_name(0), "sha256": sha256_bytes(payload)},
        "logical_batch_sha256": logical_sha256(arrays),
        "effective_rows_sha256": effective_rows_sha256(arrays, 0),
        "rows": rows, "tokens": total, "forwards": rows // 2,
        "initial_state": {"resume_step": -1} | {
            key: {"sha256": sha256_bytes((init / mf.STATE_FILES[key]).read_bytes())}
            for key in ("adapter", "adapter_config", "trainer_state")},
        "config": {"sha256": sha256_json({})},
        "optimizer_contract": {"sha256": sha256_json(contract), "values": contract},
    }  # fmt: skip
    (src / mf.manifest_name(0)).write_bytes(mf.dumps(manifest))
    doc["optimizer_batch"] = {
        "replay_path": str(src / mf.manifest_name(0)),
        "expected_logical_sha256": manifest["logical_batch_sha256"],
        "expected_manifest_sha256": sha256_bytes(mf.dumps(manifest)),
    }
    write_toml(cfg, doc)
    files = [
        src / mf.manifest_name(0),
        src / mf.payload_name(0),
        init / "adapter_model.safetensors",
    ]
    files += sorted(p for p in model.rglob("*") if p.is_file())
    return cfg, sum(p.stat().st_size for p in files)


def plain_hash(cfg: Path) -> None:
    from twinrun.config.toml import load_toml

    run = load_toml(cfg)
    src = Path(run.extras.replay_path).parent  # type: ignore[arg-type]
    for p in sorted(src.iterdir()):
        hashlib_file(p)
    hashlib_file(Path(run.cfg.init_adapter) / "adapter_model.safetensors")  # type: ignore[arg-type]
    for p in sorted(Path(run.cfg.model).rglob("*")):  # type: ignore[arg-type]
        if p.is_file():
            hashlib_file(p)


def hashlib_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def bench_explain(root: Path, model: Path, sizes: str, repeats: int) -> dict[str, Any]:
    from twinrun.replay.explain import explain_config

    payload_mb, adapter_mb = (int(x) for x in sizes.split(":"))
    cfg, size = big_capture(root, model, payload_mb, adapter_mb)
    report = explain_config(cfg)
    assert report["ok"], report
    plain_hash(cfg)  # warm the page cache
    times: dict[str, list[float]] = {"explain": [], "hashlib": []}
    cpu: dict[str, list[float]] = {"explain": [], "hashlib": []}  # CPU s, all threads
    for i in range(repeats):
        order = benchkit.alternating(("explain", "hashlib"), i)
        for what in order:
            t0, c0 = time.perf_counter(), time.process_time()
            explain_config(cfg) if what == "explain" else plain_hash(cfg)
            times[what].append(time.perf_counter() - t0)
            cpu[what].append(time.process_time() - c0)
    e, h = stats(times["explain"]), stats(times["hashlib"])
    payload = root / "src" / "optimizer_batch_step_000000.safetensors"
    parts = explain_parts(payload, root / "init" / "adapter_model.safetensors", model, repeats)
    return {
        "bytes": size, "payload_bytes": payload.stat().st_size,
        "adapter_bytes": (root / "init" / "adapter_model.safetensors").stat().st_size,
        "rows": report["capture"]["rows"], "tokens": report["capture"]["tokens"],
        "explain_s": e, "hashlib_s": h,
        "explain_cpu_s": stats(cpu["explain"]), "hashlib_cpu_s": stats(cpu["hashlib"]),
        "explain_gb_s": size / e["median"] / 1e9, "hashlib_gb_s": size / h["median"] / 1e9,
        "ratio": h["median"] / e["median"],
        "cpu_ratio": statistics.median(cpu["hashlib"]) / statistics.median(cpu["explain"]),
        "load_avg": os.getloadavg()[0], "parts_cpu_s": parts,
    }  # fmt: skip


def explain_parts(payload: Path, adapter: Path, model: Path, repeats: int) -> dict[str, float]:
    """CPU seconds of each part of explain's work, each run alone on this thread (median), and of
    plain hashing's two big files: where the time goes, whatever the machine's load."""
    from twinrun.capture.digests import logical_sha256
    from twinrun.capture.hashing import read_whole
    from twinrun.capture.payload import decode
    from twinrun.core.digest import sha256_dir, sha256_file

    data = read_whole(payload, "payload")
    arrays = decode(data, "p").arrays
    jobs = {
        "read payload": lambda: read_whole(payload, "payload"),
        "payload sha256": lambda: hashlib.sha256(data).hexdigest(),
        "decode and validate": lambda: decode(data, "p"),
        "logical digest": lambda: logical_sha256(arrays),
        "adapter sha256": lambda: sha256_file(adapter),
        "model sha256": lambda: sha256_dir(model),
        "hashlib: payload": lambda: hashlib_file(payload),
        "hashlib: adapter": lambda: hashlib_file(adapter),
    }
    out = {}
    for name, job in jobs.items():
        cpu = []
        for _ in range(repeats):
            c0 = time.thread_time()
            job()
            cpu.append(time.thread_time() - c0)
        out[name] = statistics.median(cpu)
    return out


def bounds(parts: dict[str, float]) -> dict[str, float]:
    """The best explain/hashlib ratios its parts allow: on one core (every part one after the
    other), and on two free cores, where explain's three threads run (adapter + model; read, then
    the payload's file digest; decode + logical digest after the read) and the longest thread or
    half the total work, whichever is more, sets the time."""
    mine = {k: v for k, v in parts.items() if not k.startswith("hashlib")}
    base = parts["hashlib: payload"] + parts["hashlib: adapter"]
    read = mine["read payload"]
    longest = max(
        mine["adapter sha256"] + mine["model sha256"],
        read + mine["payload sha256"],
        read + mine["decode and validate"] + mine["logical digest"],
        sum(mine.values()) / 2,
    )
    return {"one_core": base / sum(mine.values()), "two_cores": base / longest}


# -- 2./3. GRPO source step vs replay --------------------------------------------------------


def bench_replay(root: Path, model: Path, repeats: int) -> dict[str, Any]:
    from twinrun.data.examples import shipped_examples

    twinrun("init-adapter", str(root / "init"), "--model", str(model), "--seed", "7",
            "--lora-rank", "8", "--lora-alpha", "16")  # fmt: skip
    source = {
        "training": {"trainer": "grpo", "seed": 7, "max_steps": 1, "save_every": 0,
                     "learning_rate": 0.01, "warmup_steps": 0,
                     "lr_schedule": "cosine", "batch_size": 8,
                     "precision": "f32"},
        "model": {"path": str(model), "chat_template": "on", "lora_rank": 8, "lora_alpha": 16},
        "data": {"examples": str(shipped_examples("arith.jsonl"))},
        "grpo": {"prompts_per_step": 4, "group_size": 8, "max_new_tokens": 32,
                 "temperature": 1.0, "clip_eps": 0.2, "advantage_clip": 5.0, "token_cap": 32},
        "environment": {"name": "arithmetic"},
        "backend": {"devices": "cpu", "options": {"strict_deterministic": True, "threads": 1}},
        "resume": {"from": str(root / "init")},
        "logging": {"dir": str(root / "source-0")},
        "optimizer_batch": {"capture": True},
    }  # fmt: skip
    cfg = write_toml(root / "source.toml", source)
    src_rows, src_wall = [], []
    for i in range(repeats):
        src_wall.append(twinrun("run", str(cfg), "--quiet", "--output", str(root / f"source-{i}")))
        src_rows.append(json.loads((root / f"source-{i}" / "metrics.jsonl").read_text()))
    first = root / "source-0"
    manifest = first / "optimizer_batch_step_000000.manifest.json"
    logical = src_rows[0]["optimizer/logical_batch_sha256"]
    rcfg = write_toml(
        root / "replay.toml", replay_doc(source, manifest, logical, root / "replay-0")
    )
    rep_rows, rep_wall = [], []
    for i in range(repeats):
        rep_wall.append(twinrun("run", str(rcfg), "--quiet", "--output", str(root / f"replay-{i}")))
        rep_rows.append(json.loads((root / f"replay-{i}" / "metrics.jsonl").read_text()))
    key = "optimizer_batch/final_adapter_sha256"
    finals = {r[key] for r in src_rows + rep_rows}
    s_step = stats([r["local_train_wall_s"] for r in src_rows])
    r_step = stats([r["local_train_wall_s"] for r in rep_rows])
    spread = (r_step["max"] - r_step["min"]) / r_step["median"]
    return {
        "rows": src_rows[0]["rows"], "tokens": src_rows[0]["tokens"],
        "source_step_s": s_step,
        "source_rollout_s": stats([r["rollout_s"] for r in src_rows]),
        "source_update_s": stats([r["update_s"] for r in src_rows]),
        "replay_step_s": r_step,
        **{f"replay_{k}": stats([r[k] for r in rep_rows])
           for k in ("forward_s", "backward_s", "optimizer_s")},
        "replay_peak_memory_bytes": stats([float(r["peak_memory_bytes"]) for r in rep_rows]),
        "source_process_s": stats(src_wall), "replay_process_s": stats(rep_wall),
        "step_speedup": s_step["median"] / r_step["median"],
        "process_speedup": statistics.median(src_wall) / statistics.median(rep_wall),
        "replay_step_spread": spread,
        "bitwise_same_adapter": len(finals) == 1, "final_adapter_sha256": sorted(finals),
    }  # fmt: skip


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    return {"cpu_count": os.cpu_count(), "cpu": cpu, "python": platform.python_version(),
            "torch": metadata.version("torch"), "git_commit": commit,
            "load_avg": os.getloadavg()[0]}  # fmt: skip


COLUMNS = ("payload", "adapter", "all", "explain s", "hashlib s", "explain GB/s", "hashlib GB/s",
           "ratio", "CPU ratio", "ceiling, 1 core", "ceiling, 2 cores", "load")  # fmt: skip
EXPLAIN_HEADER = f"| {' | '.join(COLUMNS)} |\n" + "|---" * len(COLUMNS) + "|"


def explain_measured(res: dict[str, Any]) -> str:
    """The line saying when explain was re-measured on its own (`--explain-only`), if it was."""
    e = res.get("explain_measured")
    if not e:
        return ""
    m = e["machine"]
    return (
        f"\nRe-measured on its own {e['when']} (`--explain-only`) at commit {m['git_commit']} "
        f"plus the working tree, load average {m['load_avg']:.2f} at start; "
        f"{e['explain_repeats']} repeats.\n"
    )


def parts_table(res: dict[str, Any]) -> str:
    mb = 2**20
    sizes = [
        f"{e['payload_bytes'] / mb:.0f}:{e['adapter_bytes'] / mb:.0f} MiB" for e in res["explain"]
    ]
    names = list(res["explain"][0]["parts_cpu_s"])
    rows = [
        f"| part (CPU s, alone on one thread) | {' | '.join(sizes)} |",
        "|---" * (len(sizes) + 1) + "|",
    ]
    for name in names:
        rows.append(
            f"| {name} | "
            + " | ".join(f"{e['parts_cpu_s'][name]:.3f}" for e in res["explain"])
            + " |"
        )
    rows.append(
        "| explain, measured (CPU s, all threads) | "
        + " | ".join(f"{e['explain_cpu_s']['median']:.3f}" for e in res["explain"])
        + " |"
    )
    rows.append(
        "| hashlib, measured (CPU s) | "
        + " | ".join(f"{e['hashlib_cpu_s']['median']:.3f}" for e in res["explain"])
        + " |"
    )
    return "\n".join(rows)  # fmt: skip


def render(res: dict[str, Any]) -> str:
    r, m = res["replay"], res["machine"]
    mb = 2**20
    for e in res["explain"]:
        e["bounds"] = bounds(e["parts_cpu_s"])
    explain_rows = "\n".join(
        f"| {e['payload_bytes'] / mb:.0f} MiB ({e['tokens']:,} tokens) | "
        f"{e['adapter_bytes'] / mb:.0f} MiB | {e['bytes'] / mb:.0f} MiB | {fmt(e['explain_s'])} | "
        f"{fmt(e['hashlib_s'])} | {e['explain_gb_s']:.2f} | {e['hashlib_gb_s']:.2f} | "
        f"**{e['ratio']:.2f}x** | {e['cpu_ratio']:.2f}x | {e['bounds']['one_core']:.2f}x | "
        f"{e['bounds']['two_cores']:.2f}x | {e['load_avg']:.2f} |"
        for e in res["explain"]
    )
    verdicts = [
        f"{e['payload_bytes'] / mb:.0f} MiB payload: {e['ratio']:.2f}x, "
        + (benchkit.verdict(e["ratio"] >= EXPLAIN_GOAL))
        for e in res["explain"]
    ]
    explain_verdict = "; ".join(verdicts) + "."
    missed = [e for e in res["explain"] if e["ratio"] < EXPLAIN_GOAL]
    in_the_way = (
        "What stands in the way where it is not met: explain does "
        f"{missed[0]['explain_cpu_s']['median'] / missed[0]['hashlib_cpu_s']['median']:.2f}x "
        "hashlib's CPU work (the logical digest is a second SHA256 over the batch, plus the "
        "read into a private buffer and the decode), so it reaches 0.8x only when its threads "
        "get more than one core; the ratio then follows how much of the second core the "
        "machine's other work leaves it (the load average in the table)."
        if missed
        else ""
    )
    met2 = benchkit.verdict(r["step_speedup"] >= SPEEDUP_GOAL)
    return f"""Measured {res["when"]} by `python -m bench capture_replay` on {m["cpu_count"]} CPUs \
({m["cpu"]}), torch {m["torch"]}, Python {m["python"]}, at commit {m["git_commit"]} plus the \
working tree; load average {m["load_avg"]:.2f} at start. Each figure: median (min–max) over \
{res["repeats"]} repeats (explain: {res.get("explain_repeats", res["repeats"])}).

### explain vs plain hashlib SHA256 of the same bytes
{explain_measured(res)}
Synthetic GRPO captures (rows of 512 tokens), each with an adapter weight file, a manifest and the
toy model. explain runs all seven checks in-process; beyond hashing every file it decodes and
validates the payload and recomputes the logical digest — a second SHA256 pass over the whole
batch, big-endian and in another order than the file, which plain hashing does not do. It
spreads the work over three threads (hashlib releases the GIL): the adapter and model from the
start; after the payload is read once into a private buffer, its file SHA256 on one thread while
another decodes it and computes the logical digest. Plain hashing is one thread.

{EXPLAIN_HEADER}
{explain_rows}

Goal: explain throughput >= {EXPLAIN_GOAL}x hashlib's — {explain_verdict} "CPU ratio" is
hashlib's CPU seconds over explain's (all threads): the ratio explain would reach on one core.
The ceilings come from the parts below: on one core, every part one after the other; on two free
cores, the longest of explain's threads or half of all its work, whichever is more. "load" is
the 1-minute load average after the measurements (the machine is shared). {in_the_way}

{parts_table(res)}

### GRPO step: source vs replay (fresh processes)

One v1 capture step on the toy model: {r["rows"]} rows (4 prompts x 8 completions, 32 new \
tokens), {r["tokens"]} loss tokens, LoRA rank 8, threads 1.

| | source | replay |
|---|---|---|
| step (`local_train_wall_s`), s | {fmt(r["source_step_s"])} | {fmt(r["replay_step_s"])} |
| of which rollout (sampling + rewards), s | {fmt(r["source_rollout_s"])} | skipped |
| of which update, s | {fmt(r["source_update_s"])} | forward {fmt(r["replay_forward_s"])}, \
backward {fmt(r["replay_backward_s"])}, optimizer {fmt(r["replay_optimizer_s"], 4)} |
| whole process, s | {fmt(r["source_process_s"])} | {fmt(r["replay_process_s"])} |

Replay step {r["step_speedup"]:.1f}x faster than the source step (goal >= {SPEEDUP_GOAL}x: \
{met2}); whole process {r["process_speedup"]:.2f}x (start-up, model load and writing dominate \
both). Repeated replays: step spread (max − min) / median = {r["replay_step_spread"]:.1%}; peak \
RSS {r["replay_peak_memory_bytes"]["median"] / mb:.0f} MiB. Every source run and every replay \
ended with the same adapter SHA256: **{"yes" if r["bitwise_same_adapter"] else "NO"}** \
(`{r["final_adapter_sha256"][0][:16]}…`).
"""


def update_docs(body: str) -> None:
    """Replace only this benchmark's section of docs/benchmarks.md; append it if missing."""
    update_docs_section(
        "capture",
        "Capture and replay",
        (
            "`twinrun explain` against plain hashing, a GRPO replay against its source step, "
            "and the spread of repeated replays. Generated by `python "
            "bench/capture_replay.py` (also in `bench/results/capture_replay.md`); do not "
            "edit between the markers."
        ),
        body,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--sizes", default="128:256,8:256", help="payload:adapter MiB pairs for the explain bench"
    )
    ap.add_argument("--explain-repeats", type=int, default=15, help="repeats of explain vs hashlib")
    ap.add_argument("--quick", action="store_true", help="2 repeats, 16:32 MiB; writes nothing")
    ap.add_argument("--write", action="store_true", help="with --quick: write anyway")
    ap.add_argument("--render", action="store_true", help="re-render the saved JSON only")
    ap.add_argument(
        "--explain-only", action="store_true", help="re-measure explain; keep the saved replay part"
    )
    args = ap.parse_args()
    if args.render:
        res = json.loads((RESULTS / "capture_replay.json").read_text())
        write_outputs(res, render(res))
        return
    if args.quick:
        args.repeats, args.explain_repeats, args.sizes = 2, 2, "16:32"
    from twinrun.model.toy import write_toy_checkpoint

    now = {
        "when": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "repeats": args.repeats,
        "explain_repeats": args.explain_repeats,
        "machine": machine(),
    }
    res: dict[str, Any] = dict(now)
    if args.explain_only:  # the replay part (and its date) as saved; explain's own date
        res = json.loads((RESULTS / "capture_replay.json").read_text())
        res["explain_measured"], res["explain_repeats"] = now, args.explain_repeats
    with tempfile.TemporaryDirectory(prefix="twinrun-bench-capture-") as tmp:
        root = Path(tmp)
        model = root / "toy"
        write_toy_checkpoint(model, seed=0)
        res["explain"] = []
        for i, sizes in enumerate(args.sizes.split(",")):
            where = root / f"explain{i}"
            where.mkdir()
            res["explain"].append(bench_explain(where, model, sizes, args.explain_repeats))
        if not args.explain_only:
            (root / "replay").mkdir()
            res["replay"] = bench_replay(root / "replay", model, args.repeats)
            res.pop("explain_measured", None)
    body = render(res)
    print(body)
    if args.quick and not args.write:
        return
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "capture_replay.json").write_text(json.dumps(res, indent=2) + "\n")
    write_outputs(res, body)


def write_outputs(res: dict[str, Any], body: str) -> None:
    (RESULTS / "capture_replay.md").write_text("# Capture and replay\n\n" + body)
    update_docs(body)
    print(f"wrote {RESULTS}/capture_replay.{{json,md}} and {DOCS}", file=sys.stderr)


if __name__ == "__main__":
    main()
