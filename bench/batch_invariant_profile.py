"""Where batch-invariant mode's time goes: torch.profiler self-CPU time per op, ordinary vs packed.

One SFT train step (forward, loss, backward) per batch of 8 shipped rows, 8 batches, threads 1,
f32, chat template off, LoRA r8 on q/k/v/o, on the toy checkpoint given; the first batch of each
mode warms up. Prints JSON: per mode, the median CPU seconds of the 8 steps unprofiled (5 runs),
then one profiled run's total self-CPU ms and its top ops.

    python bench/batch_invariant_profile.py MODEL_DIR

Run by bench/batch_invariant.py (under its snapshot of src/); not a benchmark on its own.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from twinrun.data.batching import pad_rows
from twinrun.data.examples import encode_sft_rows, load_rows, shipped_examples
from twinrun.model.build import load_causal_lm
from twinrun.model.lora import apply_lora
from twinrun.model.tokens import load_tokenizer
from twinrun.objectives.sft import completion_nll

TOP = 8


def steps(model, batches) -> None:  # type: ignore[no-untyped-def]
    for ids, attn, mask in batches:
        sums, _ = completion_nll(model(ids, attn), ids, mask)
        sums.sum().backward()


def main() -> None:
    torch.set_num_threads(1)
    model_dir = sys.argv[1]
    tok = load_tokenizer(model_dir)
    rows = encode_sft_rows(tok, load_rows(shipped_examples()), False, 4096)
    model = load_causal_lm(model_dir, precision="f32")
    apply_lora(model, 8, 16.0, seed=1, targets=("q_proj", "k_proj", "v_proj", "o_proj"))
    batches = [pad_rows(rows[i : i + 8], tok.pad_id) for i in range(0, len(rows), 8)]
    out = {}
    for mode in ("ordinary", "invariant"):
        model.batch_invariant = mode == "invariant"
        steps(model, batches[:1])
        cpu = []
        for _ in range(5):
            t0 = time.process_time()
            steps(model, batches)
            cpu.append(time.process_time() - t0)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            steps(model, batches)
        ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
        total = sum(e.self_cpu_time_total for e in ops) / 1000
        out[mode] = {
            "cpu_s_median": statistics.median(cpu),
            "total_ms": total,
            "top": [
                {"op": e.key, "calls": e.count, "self_ms": e.self_cpu_time_total / 1000}
                for e in ops[:TOP]
            ],
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
