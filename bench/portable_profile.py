"""Where a portable SmolLM2 step's time goes, op by op, against a native step.

`python -m bench portable_profile [--steps N] [--threads T ...]` times a forward and backward of
SmolLM2-135M-Instruct with a rank-8 PEFT LoRA adapter (batch 2 x 128 tokens, eager attention,
f32) in three fresh processes per thread count — native kernels, native kernels with ATen pinned
to AVX2 (what the portable mode pins), and the portable mode — and, inside the portable one, the
exclusive time of each part of the exact products (slicing the left operand, the right operand's
digits (made once for frozen weights), the integer GEMMs, the combination, the loud-row split),
the portable functions (`exp`, `log`, ...) and everything else. Medians over the steps (the
first left out), with min-max. Writes bench/results/portable_profile.{json,md} and its section
of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import benchkit
from benchkit import smollm2_dir, update_docs_section

ROOT = Path(__file__).resolve().parent.parent
MODES = ("native", "native-avx2", "portable")


def child(mode: str, model: str, steps: int, threads: int) -> dict[str, Any]:
    """One process: `steps` timed steps in `mode`, with the parts of the portable products."""
    from twinrun.core import portable

    if mode != "native":
        portable.pin_environment()  # ATen's capability is read once, at torch's first kernel
    import torch

    torch.set_num_threads(threads)
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from twinrun.core import digit_kernels as dk
    from twinrun.core import exact_matmul as em
    from twinrun.core import portable_math, portable_ops

    spent: dict[str, float] = collections.defaultdict(float)
    stack: list[list[float]] = []

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            stack.append([time.perf_counter(), 0.0])
            try:
                return fn(*args, **kwargs)
            finally:
                start, inner = stack.pop()
                took = time.perf_counter() - start
                spent[name] += took - inner
                if stack:
                    stack[-1][1] += took

        return wrapper

    em.exact_product = timed("products: other", em.exact_product)
    portable_ops.exact_matmul = timed("products: other", portable_ops.exact_matmul)
    portable_ops.exact_product64 = timed("products: other", portable_ops.exact_product64)
    dk.slice_lines = timed("products: slicing", dk.slice_lines)
    em.column_digits = timed("products: right digits", em.column_digits)
    em._int_product = timed("products: integer GEMMs", em._int_product)
    dk.combine = timed("products: combination", dk.combine)
    em.outlier_rows = timed("products: loud rows", em.outlier_rows)
    for name in list(portable_math.FUNCTIONS):
        portable_math.FUNCTIONS[name] = timed("portable functions", portable_math.FUNCTIONS[name])
    portable_ops._softmax_backward = timed("softmax backward", portable_ops._softmax_backward)
    portable.establish_kernels("native" if mode.startswith("native") else "portable")
    model_ = AutoModelForCausalLM.from_pretrained(
        model, dtype=torch.float32, attn_implementation="eager"
    )
    targets = ["q_proj", "k_proj", "v_proj", "o_proj"]
    peft = get_peft_model(model_, LoraConfig(r=8, lora_alpha=16, target_modules=targets))
    ids = torch.randint(0, model_.config.vocab_size, (2, 128), generator=torch.Generator())
    walls, parts = [], []
    for _ in range(steps + 1):
        spent.clear()
        start = time.perf_counter()
        peft(input_ids=ids, labels=ids).loss.backward()
        walls.append(time.perf_counter() - start)
        parts.append(dict(spent))
    return {
        "mode": mode, "threads": threads, "capability": torch.backends.cpu.get_cpu_capability(),
        "wall_s": walls[1:], "parts_s": parts[1:],
        "frozen_digit_bytes": em.frozen_bytes(), "engine": portable.exact_engine(),
    }  # fmt: skip


def run_child(mode: str, model: Path, steps: int, threads: int) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY",)}
    code = (
        "import json, sys; sys.path.insert(0, 'bench'); from portable_profile import child; "
        f"print(json.dumps(child({mode!r}, {str(model)!r}, {steps}, {threads})))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, check=False)  # fmt: skip
    if proc.returncode != 0:
        sys.exit(f"{mode} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(runs: dict[str, dict[str, Any]]) -> list[str]:
    med = statistics.median
    native = med(runs["native"]["wall_s"])
    lines = [
        "| part | ms per step (median, min–max) | share of the portable step |",
        "|---|---|---|",
    ]
    portable = runs["portable"]
    total = med(portable["wall_s"])
    names = sorted({n for p in portable["parts_s"] for n in p})
    rest = [
        w - sum(p.values()) for w, p in zip(portable["wall_s"], portable["parts_s"], strict=True)
    ]
    rows = [(n, [p.get(n, 0.0) for p in portable["parts_s"]]) for n in names]
    rows.append(("everything else (ATen at AVX2, autograd, Python)", rest))
    for name, xs in rows:
        lines.append(f"| {name} | {1e3 * med(xs):.0f} ({1e3 * min(xs):.0f}–{1e3 * max(xs):.0f}) "
                     f"| {100 * med(xs) / total:.0f}% |")  # fmt: skip
    avx2 = med(runs["native-avx2"]["wall_s"])
    lines += ["", f"Steps: native {1e3 * native:.0f} ms ({runs['native']['capability']}), native "
              f"with ATen at AVX2 {1e3 * avx2:.0f} ms (**{avx2 / native:.2f}×**), portable "
              f"{1e3 * total:.0f} ms (**{total / native:.2f}×** native). Frozen weights' digit "
              f"planes held: {portable['frozen_digit_bytes'] / 2**20:.0f} MiB; engine "
              f"{portable['engine']}."]  # fmt: skip
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    a = ap.parse_args()
    model = smollm2_dir()
    load0 = os.getloadavg()[0]
    result: dict[str, Any] = {}
    for threads in a.threads:
        result[str(threads)] = {m: run_child(m, model, a.steps, threads) for m in MODES}
    meta = benchkit.meta(load0, "torch", "transformers", "peft")
    md = [
        f"Measured {meta['when']} by `python -m bench portable_profile` on {meta['cpu_count']} "
        f"CPUs ({meta['cpu']}), torch {meta['torch']}, commit {meta['git_commit']}; load average "
        f"{load0:.2f} at start, {meta['load_avg_end']:.2f} at end. SmolLM2-135M, LoRA rank 8 on "
        f"q/k/v/o, batch 2 x 128 tokens, forward and backward; {a.steps} steps after a first.",
    ]  # fmt: skip
    for threads, runs in result.items():
        md += ["", f"**{threads} thread(s)**", "", *table(runs)]
    text = "\n".join(md)
    print(text)
    benchkit.write_results(
        "portable_profile",
        {"meta": meta, **result},
        "# Where a portable step goes\n\n" + text + "\n",
    )
    intro = ("Where a portable SmolLM2 step's time goes, part by part, against a native step "
             "(`python -m bench portable_profile`).")  # fmt: skip
    update_docs_section("portable_profile", "Where a portable step goes", intro, text)


if __name__ == "__main__":
    main()
