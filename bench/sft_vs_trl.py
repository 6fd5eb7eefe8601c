"""Toy SFT, whole process: twinrun against TRL's SFTTrainer on the same checkpoint and examples.

    python -m bench sft_vs_trl [--repeats N] [--splits M]

Both processes train LoRA (rank 8, alpha 16, q/k/v/o) on the 64 shipped examples for one epoch
at batch 4, lr 5e-3, warmup 2 then cosine, one torch thread, and write their adapter; the time is
the whole process (interpreter start, imports, model load, training, saving), alternating twinrun
and TRL, N repeats each. TRL runs in the benchmark's own environment `bench/.venv-trl` (made by
`bench/grpo_vs_trl.py`'s `trl_python`: this interpreter's packages plus `trl`), never a
dependency of twinrun. Goal: twinrun / TRL ≤ 0.7. Then M more processes per side under
bench/phase_split.py say where the time goes: the interpreter's start and exit, imports, model load,
tokenisation, training, saving, the rest. Results go to bench/results/sft_vs_trl.{json,md} and
a section of docs/benchmarks.md.
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
from pathlib import Path
from typing import Any

import benchkit
from benchkit import cpu_name, git, package_versions, update_docs_section, write_toy
from grpo_vs_trl import TRL_VERSION, trl_python

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "src" / "twinrun" / "examples" / "sft.jsonl"
GOAL = 0.7
SETTINGS = {"seed": 1, "batch_size": 4, "learning_rate": 5e-3, "lora_rank": 8, "lora_alpha": 16}


def twinrun_argv(model: Path, out: Path) -> list[str]:
    s = SETTINGS
    return [
        sys.executable, "-m", "twinrun", "tune", "sft", "--model", str(model),
        "--examples", str(EXAMPLES), "--output", str(out), "--seed", str(s["seed"]),
        "--epochs", "1", "--batch-size", str(s["batch_size"]), "--accumulation", "1",
        "--learning-rate", str(s["learning_rate"]), "--warmup-steps", "2",
        "--lr-schedule", "cosine", "--lora-rank", str(s["lora_rank"]),
        "--lora-alpha", str(s["lora_alpha"]), "--precision", "f32", "--chat-template", "on",
        "--threads", "1", "--quiet", "--overwrite",
    ]  # fmt: skip


SPLIT = ROOT / "bench" / "phase_split.py"
BUCKETS = [
    "interpreter start + exit", "imports", "model load", "tokenisation", "training", "saving",
    "other",
]  # fmt: skip
# the functions each phase is made of (bench/phase_split.py); model and tokenizer loading are
# transformers' own on both sides
LOADS = {
    "model load": ["transformers.modeling_utils:PreTrainedModel.from_pretrained"],
    "tokenisation": [
        "transformers.tokenization_utils_base:PreTrainedTokenizerBase.from_pretrained"
    ],
}
PHASES = {
    "twinrun": {
        **LOADS,
        "tokenisation": [*LOADS["tokenisation"], "twinrun.data.examples:encode_sft_rows"],
        "training": ["twinrun.train.driver:drive"],
        "saving": ["twinrun.train.setup.session:finish_session"],
    },
    "trl": {
        **LOADS,
        "tokenisation": [
            *LOADS["tokenisation"], "trl.trainer.sft_trainer:SFTTrainer._prepare_dataset"
        ],
        "training": ["transformers.trainer:Trainer.train"],
        "saving": ["transformers.trainer:Trainer.save_model"],
    },
}  # fmt: skip


def split(argv: list[str], side: str, work: Path) -> dict[str, float]:
    """One process of `argv` (python + its arguments) under bench/phase_split.py: seconds per
    bucket, the interpreter's start and exit being the process's wall less what the script saw."""
    spec, out = work / f"spec-{side}.json", work / f"split-{side}.json"
    spec.write_text(json.dumps(PHASES[side]))
    wall = timed([argv[0], str(SPLIT), str(out), str(spec), *argv[1:]])
    got = json.loads(out.read_text())
    buckets = {k: float(v) for k, v in got["buckets"].items()}
    buckets["interpreter start + exit"] = wall - float(got["wall_s"])
    return {b: buckets.get(b, 0.0) for b in BUCKETS}


def timed(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - start


def measure(py: Path, model: Path, work: Path, repeats: int, splits: int) -> dict[str, Any]:
    settings = work / "trl.json"
    settings.write_text(json.dumps(
        {**SETTINGS, "model": str(model), "examples": str(EXAMPLES), "output": str(work / "trl")}
    ))  # fmt: skip
    argv = {
        "twinrun": twinrun_argv(model, work / "twinrun"),
        "trl": [str(py), str(ROOT / "bench" / "trl_sft_child.py"), str(settings)],
    }
    ours, theirs = [], []
    for _ in range(repeats):
        ours.append(timed(argv["twinrun"]))
        theirs.append(timed(argv["trl"]))
    ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
    parts: dict[str, list[dict[str, float]]] = {"twinrun": [], "trl": []}
    for _ in range(splits):  # separate processes: the wrapping costs a little
        for side in parts:
            parts[side].append(split(argv[side], side, work))
    return {
        "twinrun_s": ours, "trl_s": theirs, "ratio_per_pair": ratios,
        "ratio": statistics.median(ours) / statistics.median(theirs), "split": parts,
    }  # fmt: skip


def spread(xs: list[float], d: int = 2) -> str:
    return f"{statistics.median(xs):.{d}f} ({min(xs):.{d}f}–{max(xs):.{d}f})"


def split_table(parts: dict[str, list[dict[str, float]]], n: int) -> list[str]:
    med = {side: {b: statistics.median(r[b] for r in rows) for b in BUCKETS}
           for side, rows in parts.items()}  # fmt: skip
    total = {side: sum(m.values()) for side, m in med.items()}
    lines = [
        f"Where the time goes ({n} more processes per side, each under `bench/phase_split.py`, "
        "which times every import and a few named functions, exclusively: an import inside "
        "model loading counts as an import; median seconds per bucket). Model and tokenizer "
        "loading are transformers' own `from_pretrained` on both sides; tokenisation includes "
        "encoding the examples (twinrun `encode_sft_rows`, TRL `SFTTrainer._prepare_dataset`); "
        "training is twinrun's step loop and TRL's `Trainer.train`; saving is the adapter and "
        "the record (twinrun `finish_session`, TRL `save_model`); other is the rest (argument "
        "parsing, checks, the LoRA wrap, TRL's trainer set-up).",
        "",
        "| bucket | twinrun s | TRL s | twinrun − TRL s |",
        "|---|---|---|---|",
    ]
    for b in BUCKETS:
        t, r = med["twinrun"][b], med["trl"][b]
        lines.append(f"| {b} | {t:.2f} | {r:.2f} | {t - r:+.2f} |")
    t, r = total["twinrun"], total["trl"]
    lines.append(f"| **sum of medians** | **{t:.2f}** | **{r:.2f}** | **{t - r:+.2f}** |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--splits", type=int, default=3, help="processes per side for the split")
    a = ap.parse_args()
    py = trl_python()
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        result = measure(py, write_toy(work / "toy"), work, a.repeats, a.splits)
    meta = {
        "when": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m bench sft_vs_trl", "cpu": cpu_name(), "cpu_count": os.cpu_count(),
        **package_versions("torch", "transformers", "peft"), "trl": TRL_VERSION,
        "git_commit": git("rev-parse", "--short", "HEAD"), "load_avg_start": load0,
        "load_avg_end": os.getloadavg()[0], "repeats": a.repeats, "splits": a.splits,
        "settings": SETTINGS, "phases": PHASES,
    }  # fmt: skip
    met = benchkit.verdict(result["ratio"] <= GOAL)
    md = "\n".join([
        f"Measured {meta['when']} by `{meta['command']}` on {meta['cpu_count']} CPUs "
        f"({meta['cpu']}), torch {meta['torch']}, transformers {meta['transformers']}, peft "
        f"{meta['peft']}, TRL {TRL_VERSION} (in `bench/.venv-trl` only), commit "
        f"{meta['git_commit']}; load average {load0:.2f} at start, {meta['load_avg_end']:.2f} "
        f"at end (a shared machine). Toy model, 64 shipped examples, one epoch at batch 4 (16 "
        f"optimizer steps), LoRA rank 8 on q/k/v/o, one thread; whole process, {a.repeats} "
        "alternating repeats, median (min–max).", "",
        "| process | wall s |", "|---|---|",
        f"| `twinrun tune sft` | {spread(result['twinrun_s'])} |",
        f"| TRL `SFTTrainer` | {spread(result['trl_s'])} |",
        f"| **twinrun / TRL** | **{result['ratio']:.2f}×** (per pair "
        f"{spread(result['ratio_per_pair'])}) |", "",
        f"Goal twinrun / TRL ≤ {GOAL}: {met}.", "",
        *split_table(result["split"], a.splits),
    ])  # fmt: skip
    print(md)
    benchkit.write_results(
        "sft_vs_trl", {"meta": meta, **result}, "# Toy SFT process: twinrun vs TRL\n\n" + md + "\n"
    )
    update_docs_section(
        "sft_vs_trl",
        "sft_vs_trl — toy SFT, whole process, twinrun vs TRL's SFTTrainer",
        "`python -m bench sft_vs_trl` (the TRL side runs in `bench/.venv-trl` only).",
        md,
    )


if __name__ == "__main__":
    main()
