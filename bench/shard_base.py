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
4, LoRA rank 8; SmolLM2-135M-Instruct (the cached checkpoint of testkit/smollm2.py; skipped
with a note when it cannot be had), the first 8 shipped examples, batch 1, accumulation 2,
`--max-length 64`; and a base-dominated Llama built from transformers' `LlamaConfig` (LARGE:
1.2 GB of f32 weights, the toy's vocabulary, so its embeddings and head are small: what a
process count can divide is nearly all of it), with SmolLM2's set-up.

    python -m bench shard_base [--repeats 3] [--smol-repeats 1]

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

import benchkit
from benchkit import cpu_name, git, smollm2_dir, spread, update_docs_section

ROOT = Path(__file__).resolve().parent.parent
RESULTS = benchkit.RESULTS
THIS = str(Path(__file__).resolve())
SHIPPED_SFT = ROOT / "src" / "twinrun" / "examples" / "sft.jsonl"
COUNT_ENV = "SHARD_BENCH_COUNT"
SRC = ROOT / "src"  # the twinrun the runs import (--src-from-head: HEAD's, exported)
GATHERS = ("all_gather_single", "all_gather_into_tensor", "all_gather")
# model -> batch, accumulation, rows of the shipped examples, extra flags
SETUPS: dict[str, dict[str, Any]] = {
    "toy": {"batch": 2, "accumulation": 4, "rows": 64, "extra": []},
    "smollm2": {"batch": 1, "accumulation": 2, "rows": 8, "extra": ["--max-length", "64"]},
    "large": {"batch": 1, "accumulation": 2, "rows": 8, "extra": ["--max-length", "64"]},
}
# the base-dominated Llama: 24 layers, hidden 1024 (heads of 64), MLP 2816, the toy's vocabulary
LARGE = {"layers": 24, "hidden": 1024, "inter": 2816}
# run name -> processes, sharded
RUNS = {"1": (1, False), "2": (2, False), "2-shard": (2, True), "3-shard": (3, True)}
RUN_ENV: dict[str, dict[str, str]] = {}  # per run, extra environment (none now)
TOY_RUNS = ("1", "2", "2-shard", "3-shard")
SMOL_RUNS = ("1", "2-shard", "3-shard")
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
    import twinrun.train.parallel.sharding as sharding
    from twinrun.train.setup import session

    shard = sharding.shard_base  # session.py imports it at call time: the patch is seen

    def shard_recorded(model: Any, params: Any, device: str) -> dict[str, int]:
        gc.collect()
        report["rss_before_shard_kib"] = status_kib("VmRSS")
        world = int(os.environ.get("WORLD_SIZE", "1"))
        report["units"] = unit_bytes(model, world)
        return shard(model, params, device)

    sharding.shard_base = shard_recorded
    import twinrun.model.build as build

    load = build.load_causal_lm  # build_model looks it up at call time

    def load_recorded(*a: Any, **k: Any) -> Any:
        gc.collect()
        report["rss_before_load_kib"] = status_kib("VmRSS")
        return load(*a, **k)

    build.load_causal_lm = load_recorded
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
        from twinrun.train.parallel.distributed import teardown

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
            "rss_before_load_mib": kib_spread(rs, "rss_before_load_kib"),
            "units": rs[0]["ranks"][0].get("units"),
            "per_rank_ru_maxrss_mib": [
                [round(k["ru_maxrss_kib"] / 1024, 1) for k in x["ranks"]] for x in rs
            ],
            "commands": [x["command"] for x in rs],
            "runtime": rs[0]["runtime"],
        }
    t1 = statistics.median(rows["1"]["step_s"]["all"])
    for row in rows.values():
        row["speedup"] = t1 / statistics.median(row["step_s"]["all"])
    bound_rows(rows, base)
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


def bound_rows(rows: dict[str, Any], base: int) -> None:
    """Each run's peak RSS per process, loading included (the larger of the load's and the
    training's peaks), against the unsharded one's and against the bound

        peak(W) <= before(W) + base/W + rest(1) + 2 * root + 3 * layer

    before(W): the RSS before the base is built (imports, tokenizer, data); rest(1) = peak(1) -
    before(1) - base: what the 1-process run holds beside the weights (activations, the
    optimizer, the adapter), which no process count divides; root: the root unit (embeddings,
    final norm, head), all-gathered from its forward through its backward; layer: one decoder
    layer's unit; each unit is gathered into one buffer and copied out of it into its weights
    (2x while it is gathered), and in the backward FSDP2 gathers the next layer while one is
    computed (its default backward prefetch): one layer held, the next held and in its buffer
    (3 layers). Sizes in MiB, FSDP2's padded rows."""
    mib = 2**20

    def peak(r: dict[str, Any]) -> float:
        return max(r["peak_load_mib"]["median"], r["peak_train_mib"]["median"])

    one = rows["1"]
    rest = max(peak(one) - one["rss_before_load_mib"]["median"] - base / mib, 0.0)
    for r in rows.values():
        r["peak_mib"] = peak(r)
        r["peak_of_unsharded"] = peak(r) / peak(one)
        units = r.get("units")
        if not r["sharded"] or not units:
            r["bound_mib"] = None
            continue
        world = r["processes"]
        layer = units["layers_padded"] / max(units["layers_n"], 1)
        overhead = (2 * units["root_padded"] + 3 * layer) / mib
        r["bound_mib"] = r["rss_before_load_mib"]["median"] + base / world / mib + rest + overhead
        r["bound_terms_mib"] = {"rest_of_1": rest, "gathered_units": overhead}
        r["within_bound"] = r["peak_mib"] <= r["bound_mib"]


# ------------------------------------------------------------ a base that does not fit a process


def llama_checkpoint(
    work: Path, name: str, layers: int, hidden: int, inter: int
) -> tuple[Path, int]:
    """A Llama checkpoint from transformers' own classes with the toy's tokenizer and vocabulary
    (so nearly all its bytes are decoder layers), f32, seed 0; returns it and its weights' bytes."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    toy = work / "toy-model"
    model = work / name
    toy_config = json.loads((toy / "config.json").read_text())
    config = LlamaConfig(
        vocab_size=toy_config["vocab_size"], hidden_size=hidden, intermediate_size=inter,
        num_hidden_layers=layers, num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64, max_position_embeddings=256,
        bos_token_id=toy_config.get("bos_token_id"), eos_token_id=toy_config.get("eos_token_id"),
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    hf = LlamaForCausalLM(config).to(torch.float32)
    hf.save_pretrained(model)
    weights = sum(p.numel() * 4 for p in hf.parameters())
    del hf
    for f in toy.iterdir():
        if f.name not in ("config.json", "model.safetensors") and f.is_file():
            (model / f.name).write_bytes(f.read_bytes())
    return model, weights


def cap_demo(work: Path) -> dict[str, Any]:
    """A Llama checkpoint from transformers' own classes (16 layers, hidden 768: 453 MB of f32
    weights) and a per-process cap, RLIMIT_DATA, of what a process maps once it has imported
    twinrun plus the weights and 32 MiB (thread stacks 1 MiB: RLIMIT_STACK): 1 process under
    the cap is refused up front, 2 sharded processes under it train, and write the adapter of
    the uncapped 1-process run."""
    import resource

    model, weights = llama_checkpoint(work, "big-model", layers=16, hidden=768, inter=2048)

    def stacks() -> None:  # 1 MiB thread stacks: glibc reserves RLIMIT_STACK each, counted whole
        resource.setrlimit(resource.RLIMIT_STACK, (2**20, 2**20))

    examples = work / "short.jsonl"
    rows = [{"prompt": f"{a}+{b}=", "completion": str(a + b)} for a, b in ((1, 2), (3, 4), (5, 6))]
    examples.write_text("".join(json.dumps(r) + "\n" for r in rows))
    probe = subprocess.run(
        [sys.executable, "-c", "import torch, transformers, twinrun.cli.main, "
         "twinrun.train.setup.session\nprint(next(l.split()[1] for l in open('/proc/self/status') "
         "if l.startswith('VmData')))"],
        env=env(False), capture_output=True, text=True, check=True, preexec_fn=stacks,
    )  # fmt: skip
    limit = int(probe.stdout) * 1024 + weights + 32 * 2**20
    setup: dict[str, Any] = {"batch": 1, "accumulation": 2, "extra": []}

    def go(name: str, nproc: int, sharded: bool, capped: bool) -> dict[str, Any]:
        out = work / f"cap-{name}"
        reports = work / f"cap-{name}.ranks"
        reports.mkdir()
        args = sft_args(model, examples, out, setup) + (["--shard-base"] if sharded else [])
        args[args.index("--chat-template") + 1] = "off"  # short rows: small activations
        cmd = [*launcher(nproc), "--child", str(reports), *args]

        def cap() -> None:
            stacks()
            resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))

        t0 = time.perf_counter()
        job = subprocess.run(cmd, env=env(False), capture_output=True, text=True,
                             preexec_fn=cap if capped else stacks)  # fmt: skip
        wall = time.perf_counter() - t0
        errors = [ln for ln in job.stderr.splitlines() if ln.startswith("twinrun: error")]
        adapter = out / "adapter_model.safetensors"
        ranks = [json.loads(f.read_text()) for f in sorted(reports.glob("rank-*.json"))]
        return {
            "processes": nproc, "sharded": sharded, "capped": capped, "code": job.returncode,
            "wall_s": wall, "error": errors[0] if errors else None,
            "adapter": adapter.read_bytes() if adapter.exists() else None,
            "peak_mib": [round(r["ru_maxrss_kib"] / 1024, 1) for r in ranks],
        }  # fmt: skip

    runs = {"1 uncapped": go("one", 1, False, False), "1 capped": go("one-capped", 1, False, True),
            "2 sharded capped": go("two-capped", 2, True, True)}  # fmt: skip
    one = runs["1 uncapped"]["adapter"]
    for r in runs.values():
        r["same_adapter"] = r["adapter"] is not None and r["adapter"] == one
        del r["adapter"]
    return {"weights_bytes": weights, "rlimit_data_bytes": limit, "probe_vmdata_bytes":
            int(probe.stdout) * 1024, "runs": runs}  # fmt: skip


def render_cap(c: dict[str, Any]) -> list[str]:
    lines = [
        "### A base larger than a process's cap",
        "",
        f"A Llama checkpoint built from transformers' `LlamaConfig` (16 layers, hidden 768): "
        f"{c['weights_bytes'] / 1e9:.3f} GB of f32 weights. Cap: RLIMIT_DATA = "
        f"{c['rlimit_data_bytes'] / 2**20:.0f} MiB per process (what a process maps once it "
        f"imported twinrun, {c['probe_vmdata_bytes'] / 2**20:.0f} MiB, plus the weights and "
        "32 MiB; thread stacks 1 MiB, RLIMIT_STACK, since glibc reserves one whole for each "
        "thread and RLIMIT_DATA counts it), set on the launcher and inherited by torchrun's "
        "processes. 3 short rows, "
        "batch 1, accumulation 2, `--chat-template off`.",
        "",
        "| run | exit | seconds | peak RSS per process (MiB) | adapter | one line |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in c["runs"].items():
        same = "–" if name == "1 uncapped" else (
            "identical to 1 process uncapped" if r["same_adapter"] else "none" if r["code"] else
            "DIFFERENT")  # fmt: skip
        line = f"`{r['error']}`" if r["error"] else "–"
        peaks = ", ".join(map(str, r["peak_mib"])) or "–"
        lines.append(f"| {name} | {r['code']} | {r['wall_s']:.1f} | {peaks} | {same} | {line} |")
    return lines


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
        "| processes | base bytes held | of the whole | RSS before the base is built | "
        "peak RSS to the session built (load + sharding) | peak RSS in training | "
        "peak RSS, loading included | of the unsharded peak | bound (see below) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n, r in runs.items():
        bound = (
            f"{r['bound_mib']:.1f} ({'within' if r['within_bound'] else 'ABOVE'})"
            if r.get("bound_mib")
            else "–"
        )
        lines.append(
            f"| {label(n)} | {r['base_bytes_here']} ({mb(r['base_bytes_here'])}) | "
            f"{r['base_bytes_here'] / base:.3f} | {fmt(r['rss_before_load_mib'], 1)} | "
            f"{fmt(r['peak_load_mib'], 1)} | {fmt(r['peak_train_mib'], 1)} | "
            f"{r['peak_mib']:.1f} | {r['peak_of_unsharded']:.2f} | {bound} |"
        )
    lines += [
        "",
        "Bound on a sharded process's peak RSS: before(W) + base/W + rest(1) + 2·root + 3·layer "
        "(MiB): before(W) the RSS before the base is built; rest(1) what the 1-process run "
        "holds beside the weights (activations, optimizer, adapter: no process count divides "
        "it); root the root unit (embeddings, final norm, head), gathered from its forward "
        "through its backward; layer one decoder layer's unit; a unit is gathered into one "
        "buffer and copied out of it (2x while gathered), and in the backward FSDP2 gathers "
        "the next layer while one is computed (its default backward prefetch: 3 layers).",
    ]
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
        "A sharded process builds the base on the meta device and reads only its own rows "
        "of each weight, so the peak while loading is divided too; and `--shard-base` fixes "
        "glibc's mmap threshold at 1 MiB (recorded in the sidecar's runtime as "
        "`malloc_mmap_threshold`: by default it grows to the largest buffer freed, and FSDP2's "
        "gathered buffers, freed after each unit, stayed in the heap). An unsharded RSS after "
        "the load can be below the weights' bytes: pages of the weights count once they are "
        "first read. Bytes: "
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
    if r.get("large"):
        lines.append("")
        lines += render_model(large_title(r), r["large"])
    if r.get("cap"):
        lines.append("")
        lines += render_cap(r["cap"])
    return "\n".join(lines)


def large_title(r: dict[str, Any]) -> str:
    shape = r["large_shape"]
    return (
        f"A base-dominated Llama ({shape['layers']} layers, hidden {shape['hidden']}, MLP "
        f"{shape['inter']}, the toy's vocabulary: nearly every byte in the decoder layers)"
    )


def figure_rows(m: dict[str, Any]) -> list[str]:
    """One model's runs as docs/distributed.md shows them."""
    lines = [
        "| processes | base bytes held (rank 0) | peak RSS per process, loading included (MiB) "
        "| of the unsharded peak | above the RSS before the base is built (MiB) | of the "
        "unsharded | bound (MiB) | FSDP2 bytes received per step | step wall s | adapter |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    one = m["runs"]["1"]
    one_above = one["peak_mib"] - one["rss_before_load_mib"]["median"]
    for n, row in m["runs"].items():
        got = m["bytes"].get(n, {}).get("fsdp_gather_received_per_step")
        bound = (
            f"{row['bound_mib']:.0f} ({'within' if row['within_bound'] else 'ABOVE'})"
            if row.get("bound_mib")
            else "–"
        )
        above = row["peak_mib"] - row["rss_before_load_mib"]["median"]
        same = "–" if n == "1" else ("the 1-process bytes" if row["same_adapter"] else "DIFFERENT")
        lines.append(
            f"| {label(n)} | {mb(row['base_bytes_here'])} | {row['peak_mib']:.0f} | "
            f"{row['peak_of_unsharded']:.2f} | {above:.0f} | {above / one_above:.2f} | {bound} | "
            f"{mb(got) if got is not None else '–'} | {row['step_s']['median']:.2f} | {same} |"
        )
    return lines


def render_figures(r: dict[str, Any]) -> str:
    """The figures docs/distributed.md quotes: SmolLM2's runs (else the toy's), the
    base-dominated Llama's and the cap."""
    key = "smollm2" if r["smollm2"] is not None else "toy"
    title = "SmolLM2-135M-Instruct" if key == "smollm2" else "the toy model"
    lines = [
        f"{title}, measured {r['when']} on {r['cpus']} CPUs, load average {r['load'][0]:.2f} at "
        f"start and {r['load'][1]:.2f} at end (shared machine: wall times wait for a core):",
        "",
        *figure_rows(r[key]),
    ]
    if r.get("large"):
        base = r["large"]["base_bytes"]
        lines += ["", f"{large_title(r)}, {mb(base)} of f32 weights, the same run:", ""]
        lines += figure_rows(r["large"])
    if r.get("cap"):
        lines.append("")
        lines += render_cap(r["cap"])[2:]
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
    ap.add_argument(
        "--render-only",
        action="store_true",
        help="recompute the bounds and rewrite the report from bench/results/shard_base.json "
        "(nothing is measured again)",
    )
    a = ap.parse_args()
    if a.render_only:
        result = json.loads((RESULTS / "shard_base.json").read_text())
        for key in ("toy", "smollm2", "large"):
            if result.get(key):
                bound_rows(result[key]["runs"], result[key]["base_bytes"])
        write_results(result)
        return
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
        large, _ = llama_checkpoint(work, "large-model", **LARGE)
        large_r = measure(large, work, "large", SMOL_RUNS, 1, timed=False)
        cap_r = cap_demo(work)
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
        "toy": toy_r, "smollm2": smol_r, "smollm2_note": smol_note, "large": large_r,
        "large_shape": LARGE, "cap": cap_r,
    }  # fmt: skip
    write_results(result)


def write_results(result: dict[str, Any]) -> None:
    """The results file, the report and the two docs sections."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "shard_base.json").write_text(json.dumps(result, indent=2) + "\n")
    body = render(result)
    (RESULTS / "shard_base.md").write_text("# Sharded base (--shard-base)\n\n" + body + "\n")
    update_docs_section(
        "shard_base",
        "Sharded base (--shard-base): memory, step time, bytes",
        "Per-process memory, step time and bytes communicated per step of `--shard-base` (the "
        "frozen base sharded with FSDP2 under torchrun) against unsharded runs, on the toy "
        "model and SmolLM2-135M-Instruct. Generated by `python -m bench shard_base` (also in "
        "`bench/results/shard_base.md`); do not edit between the markers.",
        body,
    )
    update_docs_section(
        "shard_base_figures", "", "", render_figures(result), docs=ROOT / "docs" / "distributed.md"
    )
    print(body)


if __name__ == "__main__":
    main()
