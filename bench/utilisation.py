"""Benchmark: how close a SmolLM2 SFT step comes to what this machine's matrix multiplies can do.

One SFT step on SmolLM2-135M-Instruct (f32, LoRA rank 8 on twinrun's default targets q/k/v/o,
batch B rows of exactly T tokens, one forward per step, `--threads N`):

1. Model FLOPs of the step, counted from the shapes by `step_matmuls` (every matrix multiply of
   the forward and backward, none of the elementwise work; its docstring says what is counted).
2. The step's time: (a) twinrun — `python -m twinrun tune sft` on a generated examples file of
   B x steps rows of exactly T tokens (chat template off), in its default portable kernels and
   with `--cpu-kernels native`; (b) the plain transformers + PEFT loop of bench/plain_sft.py
   (eager attention, twinrun's LoRA init, the same rows and batches), native kernels. Per-step
   `wall_s` from each process's metrics.jsonl, step 0 left out, median over the steps.
3. This machine's f32 GEMM rate at the step's own shapes: every distinct matmul of step 1 timed
   with `torch.mm` / `torch.bmm` (operands laid out as the step holds them, output preallocated)
   in a fresh process with the same thread count, once with the native environment and once with
   twinrun's portable one (`ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=COMPATIBLE`), each shape repeated
   for >= 3 calls and >= 0.3 s, its fastest call kept (the machine's rate; on a shared machine
   the median is the neighbours' as much as ours); the step's ideal time is the sum over its
   matmuls of count x that time, the GEMM rate its FLOPs / that.
   Utilisation = achieved FLOP/s / GEMM FLOP/s = ideal time / step time.
4. What the gap is made of: one twinrun step (default kernels, step 1 of a 2-step run) under
   `torch.profiler`, in process (the loop's `run_step` wrapped for that step only); self CPU
   time per op summed by category (matmul, softmax/norm/elementwise, copies and layout, other),
   the time outside any torch op (Python, autograd bookkeeping) = the step's wall time - the sum,
   and the matmul ops' own time against the same matmuls timed in isolation in that process
   right after the run (split into the native rate and the portable branch's extra by the
   ratio of the two GEMM processes of 3).

Goal: twinrun's utilisation >= the plain loop's (twinrun / plain >= 1.0).

    python -m bench utilisation [--threads 1[,2]] [--batch 4] [--seq 128] [--steps 4] [--quick]

Writes bench/results/utilisation.json and .md and the `utilisation` section of
docs/benchmarks.md (`--quick`: batch 2 x 32 tokens, 3 steps, prints only).
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
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchkit  # noqa: E402
from benchkit import (  # noqa: E402
    ROOT,
    cpu_name,
    git,
    package_versions,
    smollm2_dir,
    spread,
    update_docs_section,
)

sys.path.insert(0, str(ROOT / "src"))

SEED, RANK, ALPHA, LR = 0, 8, 16.0, 1e-3
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")  # twinrun.model.targets.DEFAULT_TARGETS
KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "MKL_CBWR")  # what twinrun's portable mode pins
PROFILED_STEP = 1


# -- the FLOP count ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Matmul:
    """`count` matrix multiplies [m x k] @ [k x n] (a batch of `batch` when > 1) of one step.
    `a_t` / `b_t`: that operand is the transpose of a contiguous tensor, as the step holds it."""

    part: str  # linear forward | linear input grad | lora forward | lora backward | ...
    name: str  # the module or product, e.g. "q_proj", "lora_A.q_proj", "scores"
    count: int
    batch: int
    m: int
    k: int
    n: int
    a_t: bool = False
    b_t: bool = False

    @property
    def flops(self) -> int:
        return 2 * self.count * self.batch * self.m * self.k * self.n

    @property
    def shape(self) -> tuple[int, int, int, int, bool, bool]:
        return (self.batch, self.m, self.k, self.n, self.a_t, self.b_t)


def step_matmuls(
    config: dict[str, Any],
    batch: int,
    seq: int,
    rank: int = RANK,
    targets: Sequence[str] = TARGETS,
) -> list[Matmul]:
    """Every matrix multiply of one LoRA SFT step (forward + backward) of a Llama-shaped model,
    batch x seq tokens (N), from its config. Per decoder layer (L of them):

    - frozen linears q/k/v/o/gate/up/down, [in -> out]: forward x @ W^T, 2 N in out each;
      backward only the input gradient g @ W, 2 N in out again (frozen: no weight gradient).
      Layer 0's q/k/v have none: their input (the normed embeddings) needs no gradient;
    - LoRA on each target, A [in -> r], B [r -> out]: forward 2 N (in r + r out); backward both
      weight gradients (2 N r out, 2 N in r) and both input gradients (2 N out r, 2 N r in; again
      none through layer 0's q/k/v A);
    - attention (eager: the full T x T, batch x heads of them; grouped K/V repeated to every
      head): scores Q K^T and P V, 2 x 2 B heads T^2 head_dim forward, twice that backward
      (dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q);

    and once: the lm_head (tied, frozen) 2 N hidden vocab forward + its input gradient as much.
    Norms, rotary, softmax, SiLU, the loss and AdamW are elementwise: not counted."""
    h, inter = config["hidden_size"], config["intermediate_size"]
    layers = config["num_hidden_layers"]
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads") or heads
    d = config.get("head_dim") or h // heads
    vocab, n_tok = config["vocab_size"], batch * seq
    shapes = {
        "q_proj": (h, heads * d), "k_proj": (h, kv * d), "v_proj": (h, kv * d),
        "o_proj": (heads * d, h), "gate_proj": (h, inter), "up_proj": (h, inter),
        "down_proj": (inter, h),
    }  # fmt: skip
    no_input_grad_in_layer0 = {"q_proj", "k_proj", "v_proj"}
    out: list[Matmul] = []
    for name, (fin, fout) in shapes.items():
        below = layers - (1 if name in no_input_grad_in_layer0 else 0)
        out.append(Matmul("linear forward", name, layers, 1, n_tok, fin, fout, b_t=True))
        out.append(Matmul("linear input grad", name, below, 1, n_tok, fout, fin))
        if name not in targets:
            continue
        out += [
            Matmul("lora forward", f"lora_A.{name}", layers, 1, n_tok, fin, rank, b_t=True),
            Matmul("lora forward", f"lora_B.{name}", layers, 1, n_tok, rank, fout, b_t=True),
            Matmul("lora backward", f"dB.{name}", layers, 1, fout, n_tok, rank, a_t=True),
            Matmul("lora backward", f"dx_B.{name}", layers, 1, n_tok, fout, rank),
            Matmul("lora backward", f"dA.{name}", layers, 1, rank, n_tok, fin, a_t=True),
            Matmul("lora backward", f"dx_A.{name}", below, 1, n_tok, rank, fin),
        ]
    bh = batch * heads
    out += [
        Matmul("attention forward", "scores QK^T", layers, bh, seq, d, seq, b_t=True),
        Matmul("attention forward", "values PV", layers, bh, seq, seq, d),
        Matmul("attention backward", "dP = dO V^T", layers, bh, seq, d, seq, b_t=True),
        Matmul("attention backward", "dV = P^T dO", layers, bh, seq, seq, d, a_t=True),
        Matmul("attention backward", "dQ = dS K", layers, bh, seq, seq, d),
        Matmul("attention backward", "dK = dS^T Q", layers, bh, seq, seq, d, a_t=True),
        Matmul("lm_head forward", "lm_head", 1, 1, n_tok, h, vocab, b_t=True),
        Matmul("lm_head input grad", "lm_head", 1, 1, n_tok, vocab, h),
    ]
    return out


def flops_by_part(matmuls: Sequence[Matmul]) -> dict[str, int]:
    parts: dict[str, int] = {}
    for mm in matmuls:
        parts[mm.part] = parts.get(mm.part, 0) + mm.flops
    return parts


def step_flops(config: dict[str, Any], batch: int, seq: int) -> int:
    """The model FLOPs of one LoRA SFT step (`step_matmuls`, summed)."""
    return sum(mm.flops for mm in step_matmuls(config, batch, seq))


def attention_share(config: dict[str, Any], batch: int, seq: int) -> float:
    """The T^2 part's (attention scores and values) share of the step's FLOPs."""
    parts = flops_by_part(step_matmuls(config, batch, seq))
    return (parts["attention forward"] + parts["attention backward"]) / sum(parts.values())


def model_config(model: Path) -> dict[str, Any]:
    return json.loads((model / "config.json").read_text(encoding="utf-8"))


# -- rows of exactly T tokens --------------------------------------------------------------------


def exact_rows(model: Path, path: Path, rows: int, seq: int) -> Path:
    """`rows` SFT examples that twinrun encodes (chat template off) to exactly `seq` tokens each:
    a prompt of repeated words (one token each) and a five-word completion (the loss tokens)."""
    from twinrun.data.examples import encode_prompt_completion
    from twinrun.model.tokens import load_tokenizer

    tok = load_tokenizer(str(model))
    words, completion = ("apple", "river", "stone", "cloud"), " ".join(["pear"] * 5)

    def encoded(prompt: str) -> int:
        msgs = [{"role": "user", "content": prompt}]
        return len(encode_prompt_completion(tok, msgs, completion, False).input_ids)

    lines = []
    for i in range(rows):
        word = words[i % len(words)]
        n = seq - (encoded(word) - 1)
        prompt = " ".join([word] * max(n, 1))
        if encoded(prompt) != seq:
            sys.exit(f"cannot make a row of exactly {seq} tokens from {word!r}")
        lines.append(json.dumps({"prompt": prompt, "completion": completion}))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# -- processes -----------------------------------------------------------------------------------


def child_env(threads: int, portable_env: bool = False) -> dict[str, str]:
    """The environment of a child: src on the path, OMP threads, no kernel pins unless asked."""
    env = {k: v for k, v in os.environ.items() if k not in KERNEL_ENV}
    env |= {"PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": str(threads)}
    if portable_env:
        from twinrun.core.portable import PINNED_ENV

        env |= PINNED_ENV
    return env


def run_child(cmd: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """(wall s, CPU s of the process and its children, peak RSS bytes of the largest of them) of
    one child process (`os.wait4`); exits with the tail of its stderr on failure."""
    with tempfile.TemporaryFile(mode="w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{err.read()[-4000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024


def step_walls(run: Path) -> list[float]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
    return [r["wall_s"] for r in rows if r["step"] > 0]  # step 0 is the warm-up


def twinrun_args(
    model: Path, data: Path, out: Path, batch: int, seq: int, steps: int, threads: int
) -> list[str]:
    return ["tune", "sft", "--model", str(model), "--examples", str(data), "--output", str(out),
            "--seed", str(SEED), "--epochs", "1", "--batch-size", str(batch),
            "--accumulation", "1", "--learning-rate", str(LR), "--warmup-steps", "0",
            "--lr-schedule", "cosine", "--lora-rank", str(RANK), "--lora-alpha", str(ALPHA),
            "--precision", "f32", "--chat-template", "off", "--max-length", str(seq),
            "--stop-after", str(steps), "--threads", str(threads), "--quiet"]  # fmt: skip


def plain_cmd(model: Path, data: Path, out: Path, batch: int, threads: int) -> list[str]:
    return [sys.executable, str(ROOT / "bench" / "plain_sft.py"), "--model", str(model),
            "--examples", str(data), "--output", str(out), "--seed", str(SEED), "--epochs", "1",
            "--batch-size", str(batch), "--learning-rate", str(LR), "--warmup-steps", "0",
            "--lora-rank", str(RANK), "--lora-alpha", str(ALPHA), "--chat-template", "off",
            "--threads", str(threads), "--attention", "eager", "--twinrun-init"]  # fmt: skip


# -- child: the GEMM rate ------------------------------------------------------------------------


def time_shapes(spec: dict[str, Any]) -> dict[str, float]:
    """{shape key: seconds per call} for every distinct matmul shape of the step (torch.mm /
    torch.bmm, output preallocated): one warm-up call, then calls until `min_reps` and `min_s`
    are reached; the fastest call (the machine's rate, the least disturbed by a shared core)."""
    import torch

    gen = torch.Generator().manual_seed(0)
    out: dict[str, float] = {}
    for mm in step_matmuls(spec["config"], spec["batch"], spec["seq"]):
        key = json.dumps(mm.shape)
        if key in out:
            continue
        lead = (mm.batch,) if mm.batch > 1 else ()
        a = torch.randn(*lead, *((mm.k, mm.m) if mm.a_t else (mm.m, mm.k)), generator=gen)
        b = torch.randn(*lead, *((mm.n, mm.k) if mm.b_t else (mm.k, mm.n)), generator=gen)
        a, b = (a.transpose(-1, -2) if mm.a_t else a), (b.transpose(-1, -2) if mm.b_t else b)
        op = torch.bmm if mm.batch > 1 else torch.mm
        res = op(a, b)  # warm-up, and the output buffer
        times: list[float] = []
        began = time.perf_counter()
        while len(times) < spec["min_reps"] or time.perf_counter() - began < spec["min_s"]:
            t0 = time.perf_counter()
            op(a, b, out=res)
            times.append(time.perf_counter() - t0)
        out[key] = min(times)
    return out


def ideal_by_part(spec: dict[str, Any], per_call: dict[str, float]) -> dict[str, float]:
    """Seconds per part of the step at `per_call`'s rates: count x time per call, summed."""
    by_part: dict[str, float] = {}
    for mm in step_matmuls(spec["config"], spec["batch"], spec["seq"]):
        by_part[mm.part] = by_part.get(mm.part, 0.0) + mm.count * per_call[json.dumps(mm.shape)]
    return by_part


def gemm_child(spec: dict[str, Any]) -> None:
    """Print `time_shapes(spec)` as JSON, at the spec's thread count."""
    import torch

    torch.set_num_threads(spec["threads"])
    if spec["portable"]:
        torch.backends.mkldnn.enabled = False  # as twinrun's portable mode
    print(json.dumps(time_shapes(spec)))


def gemm_rate(
    config: dict[str, Any], batch: int, seq: int, threads: int, portable: bool, quick: bool
) -> dict[str, Any]:
    spec = {"config": config, "batch": batch, "seq": seq, "threads": threads,
            "portable": portable, "min_reps": 3, "min_s": 0.05 if quick else 0.3}  # fmt: skip
    proc = subprocess.run(
        [sys.executable, __file__, "--gemm-child", json.dumps(spec)],
        env=child_env(threads, portable), cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    if proc.returncode != 0:
        sys.exit(f"GEMM child failed:\n{proc.stderr[-4000:]}")
    per_call = json.loads(proc.stdout.strip().splitlines()[-1])
    by_part = ideal_by_part(spec, per_call)
    ideal = sum(by_part.values())
    flops = step_flops(config, batch, seq)
    return {"ideal_s": ideal, "gflops": flops / ideal / 1e9, "ideal_s_by_part": by_part,
            "per_call_s": per_call}  # fmt: skip


# -- child: one profiled twinrun step ------------------------------------------------------------

MATMUL = "matmul (mm, addmm, bmm, matmul, linear)"
COPIES = "copies and layout (copy_, to, clone, cat, embedding, fill, allocation)"
ELEMENTWISE = "softmax, norm and elementwise (incl. loss, AdamW)"
VIEWS = "views and other ops"
CATEGORY_OPS = {
    MATMUL: "mm addmm bmm baddbmm matmul linear addmv mv dot".split(),
    COPIES: """copy_ to _to_copy clone contiguous cat stack embedding embedding_dense_backward index
        index_select gather scatter fill_ zero_ zeros empty empty_like new_zeros resize_
        empty_strided zeros_like ones_like new_empty new_empty_strided""".split(),
    VIEWS: """view reshape transpose permute expand unsqueeze squeeze slice select split
        as_strided t detach alias flatten unflatten narrow chunk unbind _unsafe_view lift_fresh
        result_type is_nonzero item _local_scalar_dense size numel set_ _reshape_alias
        broadcast_tensors expand_as view_as""".split(),
}
OP_CATEGORY = {f"aten::{op}": cat for cat, ops in CATEGORY_OPS.items() for op in ops}


def category(op: str) -> str:
    """An op's category: the tables above; any other aten op is elementwise maths (softmax,
    norms, SiLU, rotary, the loss, AdamW's updates); a non-aten record (an autograd node's own
    time) counts with the views."""
    if op in OP_CATEGORY:
        return OP_CATEGORY[op]
    return ELEMENTWISE if op.startswith("aten::") else VIEWS


def profile_child(spec: dict[str, Any], argv: list[str]) -> None:
    """Run `twinrun ARGV` in this process; profile step PROFILED_STEP only; then time the step's
    matmuls in isolation here (`time_shapes`: the same process, kernels and moment); write a JSON
    of the self CPU time per op, the step's wall and CPU time and those matmul times."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from twinrun.train.step import loop as loop_module

    original = loop_module.Loop.run_step
    found: dict[str, Any] = {}

    def run_step(self: Any, step: int, recipe: Any, batch: Any) -> dict[str, Any]:
        if step != PROFILED_STEP:
            return original(self, step, recipe, batch)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t0, c0 = time.perf_counter(), time.process_time()
            row = original(self, step, recipe, batch)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        ops: dict[str, float] = {}
        calls: dict[str, int] = {}
        for ev in prof.key_averages():
            ops[ev.key] = ops.get(ev.key, 0.0) + ev.self_cpu_time_total / 1e6
            calls[ev.key] = calls.get(ev.key, 0) + ev.count
        found.update(wall_s=wall, cpu_s=cpu, loop_wall_s=row["wall_s"], self_s=ops, calls=calls,
                     threads=torch.get_num_threads())  # fmt: skip
        return row

    loop_module.Loop.run_step = run_step  # type: ignore[method-assign]  # this child only
    from twinrun.cli.main import main

    sys.argv = ["twinrun", *argv]
    try:
        main()
    except SystemExit as done:
        if done.code not in (0, None):
            raise
    found["isolated_s"] = sum(ideal_by_part(spec, time_shapes(spec)).values())
    Path(spec["out"]).write_text(json.dumps(found), encoding="utf-8")


def profile_step(
    model: Path, data: Path, work: Path, cfg: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    out, run = work / "profile.json", work / "profiled"
    batch, seq, threads = args.batch, args.seq, args.threads[0]
    spec = {"out": str(out), "config": cfg, "batch": batch, "seq": seq, "min_reps": 1,
            "min_s": 0.05 if args.quick else 0.1}  # fmt: skip
    targs = twinrun_args(model, data, run, batch, seq, PROFILED_STEP + 1, threads)
    cmd = [sys.executable, __file__, "--profile-child", json.dumps(spec), "--", *targs]
    run_child(cmd, child_env(threads, portable_env=True))
    raw = json.loads(out.read_text(encoding="utf-8"))
    cats: dict[str, float] = {}
    for op, s in raw["self_s"].items():
        cats[category(op)] = cats.get(category(op), 0.0) + s
    top = sorted(raw["self_s"].items(), key=lambda kv: -kv[1])[:12]
    return {"wall_s": raw["wall_s"], "cpu_s": raw["cpu_s"], "loop_wall_s": raw["loop_wall_s"],
            "isolated_matmuls_s": raw["isolated_s"],
            "categories_s": cats, "ops_total_s": sum(cats.values()), "top_ops_s": dict(top),
            "top_ops_calls": {k: raw["calls"][k] for k, _ in top}}  # fmt: skip


# -- the measurement -----------------------------------------------------------------------------

LOOPS = {
    "twinrun": "twinrun (portable kernels, the default)",
    "twinrun_native": "twinrun `--cpu-kernels native`",
    "plain": "plain transformers + PEFT loop (native)",
}


def measure_threads(
    model: Path, data: Path, work: Path, cfg: dict[str, Any], args: argparse.Namespace, n: int
) -> dict[str, Any]:
    b, t, steps = args.batch, args.seq, args.steps
    walls: dict[str, list[float]] = {k: [] for k in LOOPS}
    gemm: dict[str, dict[str, Any]] = {}

    def twinrun(name: str, extra: list[str], rep: int) -> None:
        out = work / f"{name}-t{n}-{rep}"
        args_ = twinrun_args(model, data, out, b, t, steps, n)
        run_child([sys.executable, "-m", "twinrun", *args_, *extra], child_env(n))
        walls[name] += step_walls(out)

    def plain(rep: int) -> None:
        out = work / f"plain-t{n}-{rep}"
        run_child(plain_cmd(model, data, out, b, n), child_env(n))
        walls["plain"] += step_walls(out)[: steps - 1]

    gemm["native"] = gemm_rate(cfg, b, t, n, False, args.quick)
    for rep in range(args.repeats):
        native = ["--cpu-kernels", "native"]
        order: list[tuple[str, list[str] | None]] = [
            ("twinrun", []), ("plain", None), ("twinrun_native", native)
        ]  # fmt: skip
        for name, extra in benchkit.alternating(order, rep):
            if extra is None:
                plain(rep)
            else:
                twinrun(name, extra, rep)
            med = statistics.median(walls[name])
            print(f"  threads {n} repeat {rep + 1}: {name} {med:.3f} s/step", file=sys.stderr)
    gemm["portable"] = gemm_rate(cfg, b, t, n, True, args.quick)
    flops = step_flops(cfg, b, t)
    res: dict[str, Any] = {"threads": n, "gemm": gemm, "loops": {}}
    for name, ws in walls.items():
        med = statistics.median(ws)
        res["loops"][name] = {
            "step_s": spread(ws, 4),
            "gflops": flops / med / 1e9,
            "utilisation_native_gemm": gemm["native"]["ideal_s"] / med,
            "utilisation_portable_gemm": gemm["portable"]["ideal_s"] / med,
        }
    plain_med = statistics.median(walls["plain"])
    for name in walls:
        res["loops"][name]["vs_plain"] = plain_med / statistics.median(walls[name])
    return res


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    model = smollm2_dir()
    cfg = model_config(model)
    data = exact_rows(model, work / "rows.jsonl", args.batch * args.steps, args.seq)
    matmuls = step_matmuls(cfg, args.batch, args.seq)
    res: dict[str, Any] = {
        "flops": sum(mm.flops for mm in matmuls),
        "flops_by_part": flops_by_part(matmuls),
        "matmuls": [asdict(mm) | {"flops": mm.flops} for mm in matmuls],
        "per_threads": [],
    }
    for part, f in res["flops_by_part"].items():
        print(f"  {part:<20} {f / 1e9:9.2f} GFLOP", file=sys.stderr)
    print(f"  {'total':<20} {res['flops'] / 1e9:9.2f} GFLOP", file=sys.stderr, flush=True)
    for n in args.threads:
        res["per_threads"].append(measure_threads(model, data, work, cfg, args, n))
    res["profile"] = profile_step(model, data, work, cfg, args)
    print(f"  profiled step: {res['profile']['wall_s']:.3f} s", file=sys.stderr, flush=True)
    return res


# -- the report ----------------------------------------------------------------------------------


def sp(s: dict[str, Any], fmt: str = "{:.3f}") -> str:
    return f"{fmt.format(s['median'])} ({fmt.format(s['min'])}–{fmt.format(s['max'])})"


def gap_rows(res: dict[str, Any]) -> list[str]:
    """The profiled step's wall time, part by part (all measured): its matmuls as they run in
    isolation in the same process right after the step, split into the native GEMM's time and
    the portable branch's extra by the two GEMM processes' ratio; the matmul ops' time in the
    step beyond that; the other op categories; the time outside any op."""
    prof, first = res["profile"], res["per_threads"][0]
    wall, cats = prof["wall_s"], prof["categories_s"]
    native_over_portable = first["gemm"]["native"]["ideal_s"] / first["gemm"]["portable"]["ideal_s"]
    isolated = prof["isolated_matmuls_s"]
    rows = [
        ("its matmuls in isolation at the native GEMM rate (the ideal)",
         isolated * native_over_portable),
        ("+ the portable kernels' GEMM (MKL COMPATIBLE branch) over native, in isolation",
         isolated * (1 - native_over_portable)),
        ("matmul ops in the step beyond the same matmuls in isolation",
         cats.get(MATMUL, 0.0) - isolated),
        *((c, s) for c, s in sorted(cats.items(), key=lambda kv: -kv[1]) if c != MATMUL),
        ("outside any torch op (Python, autograd engine, hooks)", wall - prof["ops_total_s"]),
    ]  # fmt: skip
    return [
        "| part of the profiled twinrun step | ms | share of the step |",
        "|---|---|---|",
        *(f"| {name} | {1e3 * s:.0f} | {100 * s / wall:.1f}% |" for name, s in rows),
        f"| **the profiled step (wall)** | **{1e3 * wall:.0f}** | 100% |",
    ]


def markdown(res: dict[str, Any]) -> str:
    m, a = res["machine"], res["settings"]
    la0, la1 = m["load_1min_start_end"]
    lines = [
        f"Measured {res['date']} by `python -m bench utilisation` on {m['cores']} CPUs "
        f"({m['cpu']}), torch {m['versions']['torch']}, transformers "
        f"{m['versions']['transformers']}, peft {m['versions']['peft']}, commit {m['commit']}; "
        f"load average {la0:.2f} at start, {la1:.2f} at end (a shared machine). SmolLM2-135M, "
        f"f32, LoRA rank {RANK} on q/k/v/o, one SFT step = {a['batch']} rows × {a['seq']} "
        f"tokens, eager attention; {a['steps']} steps per process, step 0 left out, "
        f"{a['repeats']} process(es) per loop; median (min–max) over the timed steps.",
        "",
        f"Model FLOPs per step (`step_matmuls`): **{res['flops'] / 1e9:.1f} GFLOP**.",
        "",
        "| part | GFLOP | share |",
        "|---|---|---|",
        *(
            f"| {p} | {f / 1e9:.2f} | {100 * f / res['flops']:.1f}% |"
            for p, f in res["flops_by_part"].items()
        ),
        "",
    ]
    for t in res["per_threads"]:
        g = t["gemm"]
        lines += [
            f"**{t['threads']} thread(s).** f32 GEMM at the step's own shapes (fastest call per "
            "shape): native "
            f"**{g['native']['gflops']:.1f} GFLOP/s** (ideal step {g['native']['ideal_s']:.3f} s), "
            f"portable environment {g['portable']['gflops']:.1f} GFLOP/s "
            f"({g['portable']['ideal_s']:.3f} s).",
            "",
            "| loop | s/step | achieved GFLOP/s | utilisation (vs native GEMM) "
            "| vs portable GEMM | utilisation ÷ plain loop's |",
            "|---|---|---|---|---|---|",
        ]
        for name, label in LOOPS.items():
            x = t["loops"][name]
            lines.append(
                f"| {label} | {sp(x['step_s'])} | {x['gflops']:.1f} | "
                f"**{100 * x['utilisation_native_gemm']:.0f}%** | "
                f"{100 * x['utilisation_portable_gemm']:.0f}% | **{x['vs_plain']:.2f}×** |"
            )
        lines.append("")
    first = res["per_threads"][0]["loops"]
    goal = first["twinrun"]["vs_plain"]
    native = first["twinrun_native"]["vs_plain"]
    lines += [
        f"Goal: twinrun's utilisation ≥ the plain loop's — **{benchkit.verdict(goal >= 1)}"
        f"** with the default portable kernels ({goal:.2f}×), "
        f"{benchkit.verdict(native >= 1)} with `--cpu-kernels native` ({native:.2f}×) "
        f"({res['per_threads'][0]['threads']} thread(s)).",
        "",
        f"What the remaining gap is made of: one twinrun step (default kernels, "
        f"{res['per_threads'][0]['threads']} thread(s), step {PROFILED_STEP}) under "
        f"`torch.profiler`, self CPU time by op category; the profiled step took "
        f"{res['profile']['wall_s']:.3f} s (the loop's own `wall_s` "
        f"{res['profile']['loop_wall_s']:.3f} s), of which the process had "
        f"{res['profile']['cpu_s']:.3f} s of CPU time (the rest it waited for a core: every row "
        "below includes its share of that wait). Its matmuls were then timed in isolation in the "
        "same process (the fastest call per shape), and split by the ratio of the native and "
        "portable GEMM processes' ideal times.",
        "",
        *gap_rows(res),
        "",
        "Largest ops by self CPU time in that step:",
        "",
        "| op | calls | ms |",
        "|---|---|---|",
        *(
            f"| `{op}` | {res['profile']['top_ops_calls'][op]} | {1e3 * s:.0f} |"
            for op, s in res["profile"]["top_ops_s"].items()
        ),
    ]
    if res.get("quick"):
        lines += ["", "Note: a `--quick` run (a tiny step)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1", help="comma-separated, e.g. 1,2 (default 1)")
    ap.add_argument("--batch", type=int, default=4, help="rows per step (default 4)")
    ap.add_argument("--seq", type=int, default=128, help="tokens per row (default 128)")
    ap.add_argument("--steps", type=int, default=4, help="steps per process (default 4)")
    ap.add_argument("--repeats", type=int, default=1, help="processes per loop (default 1)")
    ap.add_argument("--quick", action="store_true", help="2 rows x 32 tokens, 3 steps; no files")
    ap.add_argument("--gemm-child", help=argparse.SUPPRESS)
    ap.add_argument("--profile-child", help=argparse.SUPPRESS)
    args, rest = ap.parse_known_args()
    if args.gemm_child:
        return gemm_child(json.loads(args.gemm_child))
    if args.profile_child:
        spec = json.loads(args.profile_child)
        return profile_child(spec, rest[1:] if rest[:1] == ["--"] else rest)
    if rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    args.threads = [int(x) for x in str(args.threads).split(",")]
    if args.quick:
        args.batch, args.seq, args.steps = 2, 32, 3
    if args.steps < 2:
        sys.exit("--steps must be at least 2 (step 0 is a warm-up)")
    started = time.perf_counter()
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="twinrun-bench-util-") as tmp:
        res = measure(args, Path(tmp))
    load.append(os.getloadavg()[0])
    res = {
        "benchmark": "utilisation",
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "quick": args.quick,
        "settings": {"batch": args.batch, "seq": args.seq, "steps": args.steps,
                     "repeats": args.repeats, "threads": args.threads, "lora_rank": RANK,
                     "lora_alpha": ALPHA, "targets": list(TARGETS), "attention": "eager"},
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "load_1min_start_end": load,
                    "commit": git("rev-parse", "--short", "HEAD"),
                    "versions": package_versions("torch", "transformers", "peft")},
        **res,
        "bench_s": round(time.perf_counter() - started, 1),
    }  # fmt: skip
    body = markdown(res)
    print(body)
    print(f"bench took {res['bench_s']} s", file=sys.stderr)
    if args.quick:
        return
    benchkit.write_results("utilisation", res, "# utilisation\n\n" + body)
    update_docs_section(
        "utilisation",
        "Utilisation — a SmolLM2 SFT step against this machine's GEMM rate",
        "How much of the machine's f32 matrix-multiply rate an SFT step achieves, twinrun beside "
        "a plain transformers + PEFT loop, and what the rest of the step is made of. Generated by "
        "`python -m bench utilisation` (also in `bench/results/utilisation.md`); do not edit "
        "between the markers.",
        body,
    )


if __name__ == "__main__":
    main()
