"""Long rows at speed: one SmolLM2-135M SFT step of one 2,048-token row under `--attention
blockwise --gradient-checkpointing` against the same step under eager attention, in fresh
processes taking turns (which goes first alternates by round).

The step's time is the one the run records (`wall_s` of its metrics row: the step alone, no
loading). The FLOP rate is the step's useful floating-point work — the forward and the backward
of every product of the model (the frozen base's backward is its input gradient alone; causal
attention counted at its lower triangle; the output head's 49,152 columns included), not the
recomputed forward of gradient checkpointing nor eager's masked upper triangle — divided by the
step's time, set against this machine's float32 GEMM rate measured here with `torch.mm` at the
MLP's shape on the same threads.

Goal (issue 52): the blockwise step within 1.5x of eager's at the same length. Writes
bench/results/long_rows_speed.json and .md and the `long_rows_speed` section of
docs/benchmarks.md. `--quick`: the toy model at 256 tokens, one round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchkit  # noqa: E402
from benchkit import (  # noqa: E402
    alternating,
    meta,
    smollm2_dir,
    spread,
    update_docs_section,
    verdict,
    write_results,
    write_toy,
)
from utilisation import child_env, exact_rows, run_child  # noqa: E402

NAME = "long_rows_speed"
GOAL = 1.5  # blockwise + checkpointing step / eager step
ATTENTIONS = ("eager", "blockwise")
MMAP_THRESHOLD = 1 << 20  # what a blockwise run sets itself


def step_flops(config: dict[str, Any], seq: int) -> float:
    """The useful float work of one training step of one `seq`-token row (see the module
    docstring): forward 2*MACs; backward of the frozen products 2*MACs (input gradient only),
    of attention's two products 4*MACs (the gradients of both operands)."""
    h, layers = config["hidden_size"], config["num_hidden_layers"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    d = config.get("head_dim") or h // heads
    inter, vocab = config["intermediate_size"], config["vocab_size"]
    linear = seq * (h * heads * d * 2 + h * kv * d * 2 + 3 * h * inter)  # q, o, k, v, MLP
    attention = 2 * heads * d * seq * (seq + 1) / 2  # QK^T and PV over the causal triangle
    head = seq * h * vocab
    return 2 * (layers * (linear + attention) + head) + 2 * (
        layers * (linear + 2 * attention) + head
    )


def gemm_rate(threads: int, m: int, k: int, n: int) -> float:
    """float32 `torch.mm` FLOP/s at [m, k] x [k, n] on `threads` threads (median of 7)."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(m, k), torch.randn(k, n)
    for _ in range(2):
        torch.mm(a, b)
    times = []
    for _ in range(7):
        start = time.perf_counter()
        torch.mm(a, b)
        times.append(time.perf_counter() - start)
    return 2 * m * k * n / statistics.median(times)


def toy_row(model: Path, path: Path, seq: int) -> Path:
    """One SFT row of at most `seq` tokens for the toy model (its tokens are bytes)."""
    from twinrun.data.examples import encode_prompt_completion
    from twinrun.model.tokens import load_tokenizer

    tok = load_tokenizer(str(model))
    n = seq
    while n > 1:
        msgs = [{"role": "user", "content": "a" * n}]
        if len(encode_prompt_completion(tok, msgs, "b b", False).input_ids) <= seq:
            break
        n -= 1
    path.write_text(json.dumps({"prompt": "a" * n, "completion": "b b"}) + "\n", encoding="utf-8")
    return path


def tune_args(model: Path, data: Path, out: Path, seq: int, attention: str, threads: int,
              kernels: str) -> list[str]:  # fmt: skip
    args = ["tune", "sft", "--model", str(model), "--examples", str(data), "--output", str(out),
            "--seed", "1", "--epochs", "1", "--batch-size", "1", "--accumulation", "1",
            "--learning-rate", "1e-4", "--warmup-steps", "0", "--lr-schedule", "constant",
            "--lora-rank", "8", "--lora-alpha", "16", "--precision", "f32",
            "--chat-template", "off", "--max-length", str(seq + 16), "--threads", str(threads),
            "--cpu-kernels", kernels, "--attention", attention, "--quiet"]  # fmt: skip
    return args + (["--gradient-checkpointing"] if attention == "blockwise" else [])


def measure(model: Path, data: Path, work: Path, seq: int, attention: str, threads: int,
            kernels: str, i: int) -> dict[str, Any]:  # fmt: skip
    out = work / f"{attention}-{i}"
    cmd = [sys.executable, "-m", "twinrun",
           *tune_args(model, data, out, seq, attention, threads, kernels)]  # fmt: skip
    env = child_env(threads)
    if attention == "blockwise":
        env["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)
    wall, _, rss = run_child(cmd, env)
    (row,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    step = float(row["wall_s"])
    print(f"  {attention}: step {step:.1f} s, process {wall:.0f} s, {rss / 2**20:.0f} MiB",
          file=sys.stderr, flush=True)  # fmt: skip
    return {"attention": attention, "round": i, "step_s": step, "process_s": wall,
            "peak_rss_mib": rss / 2**20}  # fmt: skip


def render(res: dict[str, Any]) -> str:
    m, s = res["meta"], res["summary"]
    intro = (
        f"Measured {m['when']} by `python -m bench {NAME}` on {m['cpu_count']} CPUs "
        f"({m['cpu']}), torch {m.get('torch')}, commit {m['git_commit']}; load average "
        f"{m['load_avg_start']:.2f} at start, {m['load_avg_end']:.2f} at end. "
        f"{res['model_name']}, one SFT step of one {res['seq']:,}-token row, f32, "
        f"`--cpu-kernels {res['kernels']}`, {res['threads']} thread(s), {res['rounds']} round(s) "
        "of fresh processes taking turns; the step's time is the one the run records. "
        f"Goal: blockwise + checkpointing within {GOAL}x of eager: **{res['verdict']}**."
    )
    lines = ["| attention | step (median) | spread | peak RSS | FLOP rate | of GEMM rate |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for a in ATTENTIONS:
        x, label = s[a], f"{a} + checkpointing" if a == "blockwise" else a
        lines.append(
            f"| {label} | {x['step_s']['median']:.1f} s "
            f"| {x['step_s']['min']:.1f}–{x['step_s']['max']:.1f} s | {x['peak_rss_mib']:.0f} MiB "
            f"| {x['gflops']:.1f} GFLOP/s | {x['of_gemm']:.0%} |"
        )
    tail = (
        f"\nBlockwise / eager step: **{s['ratio']:.2f}x**. The step's useful work: "
        f"{res['step_tflop']:.2f} TFLOP; this machine's float32 GEMM rate at the MLP's shape "
        f"({res['gemm_shape']}) on {res['threads']} thread(s): {res['gemm_gflops']:.1f} GFLOP/s."
    )
    return "\n".join([intro, "", *lines, tail]) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the toy model at 256 tokens, 1 round")
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--kernels", choices=("native", "portable"), default="native")
    args = ap.parse_args()
    seq, rounds = (256, 1) if args.quick else (args.length, args.rounds)
    load_start = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory(prefix="twinrun-long-speed-") as tmp:
        work = Path(tmp)
        model = write_toy(work / "toy") if args.quick else smollm2_dir()
        config = json.loads((model / "config.json").read_text(encoding="utf-8"))
        data = (
            toy_row(model, work / "sft.jsonl", seq)
            if args.quick
            else exact_rows(model, work / "sft.jsonl", 1, seq)
        )
        for i in range(rounds):
            for attention in alternating(ATTENTIONS, i):
                rows.append(measure(model, data, work, seq, attention, args.threads,
                                    args.kernels, i))  # fmt: skip
    flops = step_flops(config, seq)
    shape = (seq, config["hidden_size"], config["intermediate_size"])
    rate = gemm_rate(args.threads, *shape)
    summary: dict[str, Any] = {}
    for a in ATTENTIONS:
        steps = [r["step_s"] for r in rows if r["attention"] == a]
        median = statistics.median(steps)
        summary[a] = {
            "step_s": spread(steps, 2),
            "peak_rss_mib": max(r["peak_rss_mib"] for r in rows if r["attention"] == a),
            "gflops": flops / median / 1e9, "of_gemm": flops / median / rate,
        }  # fmt: skip
    summary["ratio"] = (
        summary["blockwise"]["step_s"]["median"] / summary["eager"]["step_s"]["median"]
    )
    res = {
        "meta": meta(load_start, "torch", "transformers"), "model_name": "the toy model"
        if args.quick else "SmolLM2-135M-Instruct", "seq": seq, "rounds": rounds,
        "threads": args.threads, "kernels": args.kernels, "goal": GOAL,
        "verdict": verdict(summary["ratio"] <= GOAL), "step_tflop": flops / 1e12,
        "gemm_shape": "x".join(map(str, shape)), "gemm_gflops": rate / 1e9,
        "summary": summary, "rows": rows,
    }  # fmt: skip
    md = render(res)
    print(md)
    write_results(NAME, res, f"# {NAME}\n\n{md}")
    update_docs_section(NAME, "Long rows at speed — blockwise vs eager step", "", md,
                        benchkit.DOCS)  # fmt: skip


if __name__ == "__main__":
    main()
