"""Benchmark: data-parallel SFT on 1 vs 2 processes, and the ordered gradient gather against a
plain all-reduce of the same gradients.

1. Step time: `tune sft` on the toy model (`twinrun toy-model --seed 0`), the 64 shipped
   examples, batch 2, accumulation 4, LoRA rank 8 on q/k/v/o, threads 1 per process, 1 process
   (`python -m twinrun`) and 2 processes (`torchrun --nproc-per-node 2 -m twinrun`, gloo on
   loopback), alternately. Per-step wall seconds from metrics.jsonl (step 0 left out); the
   adapters of both are compared byte for byte.
2. Bytes per step: what each process sends in the ordered gather (its forwards' gradient bytes
   plus one presence byte per parameter) against a ring all-reduce (2 (W-1)/W of the gradient).
3. Ordered gather vs all-reduce: 2 processes, each with F forwards of the run's LoRA gradient
   size (random, seeded); seconds per step of `gather_gradients` + the sum in forward order,
   against the local sum + `all_reduce`, and whether each matches 1 process's sum bitwise.

    python -m bench distributed [--repeats 3]

Writes bench/results/distributed.{json,md} and its section of docs/benchmarks.md.
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
from benchkit import cpu_name, git, spread, update_docs_section

ROOT = Path(__file__).resolve().parent.parent
RESULTS = benchkit.RESULTS
FORWARDS = 4  # accumulation of the SFT runs: forwards per step


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env() -> dict[str, str]:
    path = os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])
    return os.environ | {"PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


def torchrun(nproc: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
            "--master-addr", "127.0.0.1", "--master-port", str(free_port())]  # fmt: skip


def sft_args(model: Path, examples: Path, out: Path) -> list[str]:
    return [
        "tune", "sft", "--model", str(model), "--examples", str(examples), "--output", str(out),
        "--seed", "1", "--epochs", "1", "--batch-size", "2", "--accumulation", str(FORWARDS),
        "--learning-rate", "1e-3", "--warmup-steps", "0", "--lr-schedule", "cosine",
        "--lora-rank", "8",
        "--lora-alpha", "16", "--precision", "f32", "--chat-template", "on", "--quiet",
        "--threads", "1",
    ]  # fmt: skip


def step_times(out: Path) -> list[float]:
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["wall_s"] for r in rows[1:]]


def measure_steps(work: Path, repeats: int) -> dict[str, Any]:
    model, examples = work / "model", work / "sft.jsonl"
    py = [sys.executable, "-m", "twinrun"]
    subprocess.run([*py, "toy-model", str(model), "--seed", "0"], env=env(), check=True)
    from twinrun.data.examples import shipped_examples

    examples.write_bytes(shipped_examples("sft.jsonl").read_bytes())
    times: dict[str, list[float]] = {"1": [], "2": []}
    adapters: dict[str, set[bytes]] = {"1": set(), "2": set()}
    for r in range(repeats):
        for n in ("1", "2"):
            out = work / f"run-{n}-{r}"
            launcher = py if n == "1" else [*torchrun(2), "-m", "twinrun"]
            subprocess.run([*launcher, *sft_args(model, examples, out)], env=env(), check=True,
                           capture_output=True)  # fmt: skip
            times[n].append(statistics.median(step_times(out)))
            adapters[n].add((out / "adapter_model.safetensors").read_bytes())
    from safetensors.torch import load_file

    lora = load_file(str(work / "run-1-0" / "adapter_model.safetensors"))
    return {
        "step_s": {n: spread(v, 5) for n, v in times.items()},
        "speedup": statistics.median(times["1"]) / statistics.median(times["2"]),
        "same_adapter": len(adapters["1"] | adapters["2"]) == 1,
        "lora_params": len(lora),
        "lora_numel": sum(t.numel() for t in lora.values()),
        "lora_bytes": sum(t.numel() * t.element_size() for t in lora.values()),
    }


def bytes_per_step(grad_bytes: int, params: int, world: int, forwards: int) -> dict[str, Any]:
    """Bytes one process sends per step (its largest share of forwards, padded rows included)."""
    most = -(-forwards // world)
    return {
        "world": world,
        "forwards": forwards,
        "ordered_gather_sent": most * (grad_bytes + params),
        "ordered_gather_received": (world - 1) * most * (grad_bytes + params),
        "ring_all_reduce_sent": round(2 * (world - 1) / world * grad_bytes),
    }


def worker(numel: int, params: int, forwards: int, iters: int, out: str) -> None:
    """Under torchrun: time the ordered gather against the all-reduce on the same gradients."""
    import torch
    import torch.distributed as dist

    from twinrun.train.parallel.gather import gather_gradients
    from twinrun.train.step.loop import sum_in_forward_order

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    sizes = [numel // params] * params
    sizes[-1] += numel - sum(sizes)
    named = [(f"p{i}", torch.nn.Parameter(torch.zeros(n))) for i, n in enumerate(sizes)]
    gen = torch.Generator().manual_seed(0)
    every = [[torch.randn(n, generator=gen) * 1e-3 for n in sizes] for _ in range(forwards)]
    mine = [every[i] for i in range(rank, forwards, world)]
    reference = sum_in_forward_order(named, every)  # what 1 process computes
    ordered_s, reduce_s = [], []
    ordered_same = reduce_same = True
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        got, _ = gather_gradients(named, mine)
        total = sum_in_forward_order(named, got)
        ordered_s.append(time.perf_counter() - t0)
        ordered_same &= all(torch.equal(a, b) for a, b in zip(total, reference, strict=True))
        dist.barrier()
        t0 = time.perf_counter()
        local = sum_in_forward_order(named, mine)
        flat = torch.cat(local)
        dist.all_reduce(flat)
        reduce_s.append(time.perf_counter() - t0)
        reduce_same &= torch.equal(flat, torch.cat(reference))
    if rank == 0:
        Path(out).write_text(json.dumps({
            "ordered_gather_s": spread(ordered_s, 6), "all_reduce_s": spread(reduce_s, 6),
            "ordered_matches_one_process": bool(ordered_same),
            "all_reduce_matches_one_process": bool(reduce_same),
        }))  # fmt: skip
    dist.destroy_process_group()


def measure_gather(work: Path, numel: int, params: int, iters: int) -> dict[str, Any]:
    out = work / "gather.json"
    cmd = [*torchrun(2), str(Path(__file__).resolve()), "--worker", str(numel), str(params),
           str(FORWARDS), str(iters), str(out)]  # fmt: skip
    subprocess.run(cmd, env=env(), check=True, capture_output=True)
    return json.loads(out.read_text())


def render(r: dict[str, Any]) -> str:
    s, b, g = r["steps"], r["bytes"], r["gather"]

    def fmt(x: dict[str, Any], unit: float = 1.0) -> str:
        return f"{x['median'] * unit:.3f} ({x['min'] * unit:.3f}–{x['max'] * unit:.3f})"

    return "\n".join(
        [
            f"Measured {r['when']} by `python -m bench distributed` on {r['cpus']} CPUs "
            f"({r['cpu']}), torch {r['torch']}; load average {r['load'][0]:.2f} at start, "
            f"{r['load'][1]:.2f} at end (the machine is shared: wall times wait for a core). "
            f"twinrun at git {r['git']}. Medians (min–max) over {r['repeats']} repeats.",
            "",
            "### SFT step time, 1 vs 2 processes (threads 1 each, gloo on loopback)",
            "",
            f"Toy model, 64 shipped examples, batch 2, accumulation {FORWARDS}, LoRA rank 8 "
            "(q/k/v/o): each process runs 2 of the 4 forwards of a step.",
            "",
            "| processes | step wall s | speed-up | adapter bytes |",
            "|---|---|---|---|",
            f"| 1 | {fmt(s['step_s']['1'])} | 1.00 | |",
            f"| 2 | {fmt(s['step_s']['2'])} | {s['speedup']:.2f} | "
            f"{'identical to 1 process' if s['same_adapter'] else 'DIFFERENT'} |",
            "",
            "### Bytes communicated per step (per process)",
            "",
            f"LoRA gradient: {s['lora_params']} tensors, {s['lora_numel']} floats = "
            f"{s['lora_bytes']} bytes. The ordered gather sends each of its forwards' gradients "
            "(the largest share, padded) plus a presence byte per tensor; a ring all-reduce sends "
            "2(W-1)/W of one gradient whatever the number of forwards.",
            "",
            "| processes | forwards/step | ordered gather sent | received | ring all-reduce sent |",
            "|---|---|---|---|---|",
            *[
                f"| {x['world']} | {x['forwards']} | {x['ordered_gather_sent']} | "
                f"{x['ordered_gather_received']} | {x['ring_all_reduce_sent']} |"
                for x in b
            ],
            "",
            "### Ordered gather vs plain all-reduce (2 processes, same gradients)",
            "",
            f"{FORWARDS} forwards a step of the run's LoRA gradient size; milliseconds per step.",
            "",
            "| method | ms per step | sum bitwise equal to 1 process |",
            "|---|---|---|",
            f"| ordered gather + sum in forward order | {fmt(g['ordered_gather_s'], 1e3)} | "
            f"{g['ordered_matches_one_process']} |",
            f"| local sum + all_reduce | {fmt(g['all_reduce_s'], 1e3)} | "
            f"{g['all_reduce_matches_one_process']} |",
        ]
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--worker", nargs=5)
    a = ap.parse_args()
    if a.worker:
        numel, params, forwards, iters, out = a.worker
        worker(int(numel), int(params), int(forwards), int(iters), out)
        return
    import torch

    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        steps = measure_steps(work, a.repeats)
        grad_bytes, params = steps["lora_bytes"], steps["lora_params"]
        sizes = [bytes_per_step(grad_bytes, params, w, FORWARDS) for w in (2, 3, 4)]
        gather = measure_gather(work, steps["lora_numel"], params, a.iters)
    result = {
        "when": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpus": os.cpu_count(), "cpu": cpu_name(), "torch": torch.__version__,
        "load": [load0, os.getloadavg()[0]], "git": git("rev-parse", "--short", "HEAD"),
        "repeats": a.repeats, "command": shlex.join(["python", "bench/distributed.py"]),
        "steps": steps, "bytes": sizes, "gather": gather,
    }  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "distributed.json").write_text(json.dumps(result, indent=2) + "\n")
    body = render(result)
    (RESULTS / "distributed.md").write_text("# Data-parallel runs\n\n" + body + "\n")
    update_docs_section(
        "distributed",
        "Data-parallel runs: step time, bytes, the ordered gather",
        "SFT on 1 vs 2 processes under torchrun, the bytes each process sends per step, and "
        "the ordered gradient gather against a plain all-reduce. Generated by `python "
        "bench/distributed.py` (also in `bench/results/distributed.md`); do not edit between "
        "the markers.",
        body,
    )
    print(body)


if __name__ == "__main__":
    main()
