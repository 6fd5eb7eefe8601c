"""Short runs on the toy model, shared by the tests and the benchmarks: argument lists for
`run_cli` (every objective, `tune sft`, `tune text`), small example files and a text corpus, a
shaped GRPO plugin."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from twinrun.data.examples import shipped_examples

OBJECTIVES = ("sft", "dpo", "reward", "grpo")

SHAPED_ENV = '''
class Shaped:
    """Reward that varies with the sampled bytes, so advantages are not all zero."""

    def prompt(self, row, rng):
        return row["prompt"]

    def reward(self, row, completion):
        return float(len(completion.encode("utf-8")) % 3)


def make(**args):
    return Shaped()
'''
SHAPED_MODULE = "twinrun_pinned_shaped_env"

STATEFUL_ENV = '''
class Counting:
    """Keeps state between calls: each reward counts the rewards this instance gave before."""

    def __init__(self):
        self.calls = 0

    def prompt(self, row, rng):
        return row["prompt"]

    def reward(self, row, completion):
        self.calls += 1
        return float(self.calls % 3) + len(completion) % 2


def make(**args):
    return Counting()
'''
STATEFUL_MODULE = "twinrun_stateful_env"


def write_examples(folder: Path) -> dict[str, Path]:
    """sft: 8 shipped rows; dpo/reward: 4 shipped pairs; grpo: 4 arithmetic prompts. Also puts
    the shaped GRPO environment on sys.path."""
    folder.mkdir(parents=True, exist_ok=True)
    sft = folder / "sft8.jsonl"
    sft.write_text("\n".join(shipped_examples("sft.jsonl").read_text().splitlines()[:8]) + "\n")
    pairs = folder / "pairs4.jsonl"
    pairs.write_text("\n".join(shipped_examples("pairs.jsonl").read_text().splitlines()[:4]) + "\n")
    arith = folder / "arith4.jsonl"
    rows = [{"prompt": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in
            ((1, 2), (3, 4), (2, 2), (4, 1))]  # fmt: skip
    arith.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / f"{SHAPED_MODULE}.py").write_text(SHAPED_ENV)
    (folder / f"{STATEFUL_MODULE}.py").write_text(STATEFUL_ENV)
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    return {"sft": sft, "dpo": pairs, "reward": pairs, "grpo": arith}


def run_args(objective: str, model: Path, examples: Path, out: Path, *extra: str) -> list[str]:
    """A 2-step (sft, dpo, reward: 1 epoch) or 3-step (grpo) run with two forwards a step."""
    common = [
        "--model", str(model), "--examples", str(examples), "--output", str(out), "--seed", "1",
        "--learning-rate", "2e-2", "--warmup-steps", "1",
        "--lr-schedule", "cosine", "--lora-rank", "4",
        "--lora-alpha", "8", "--precision", "f32", "--chat-template", "on", "--quiet",
        "--threads", "1",
    ]  # fmt: skip
    if objective == "sft":
        shape = ["--epochs", "1", "--batch-size", "2", "--accumulation", "2"]
    elif objective in ("dpo", "reward"):
        shape = ["--epochs", "1", "--batch-size", "1", "--accumulation", "2"]
        shape += ["--beta", "0.1"] if objective == "dpo" else []
    else:
        shape = [
            "--steps", "3", "--prompts-per-step", "2", "--group-size", "3", "--batch-size", "4",
            "--max-new-tokens", "4", "--temperature", "1.0", "--clip-eps", "0.2",
            "--advantage-clip", "5", "--token-cap", "3", "--env", f"{SHAPED_MODULE}:make",
            "--replay", "per", "--replay-capacity", "16", "--replay-alpha", "0.6",
            "--replay-beta", "0.4", "--replay-fraction", "0.5",
        ]  # fmt: skip
    return ["tune", objective, *common, *shape, *extra]


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def sft_args(model: Path, examples: Path, out: Path, seed: int, *extra: str) -> list[str]:
    return [
        "tune", "sft", "--model", str(model), "--examples", str(examples), "--output", str(out),
        "--seed", str(seed), "--epochs", "1", "--batch-size", "4", "--accumulation", "1",
        "--learning-rate", "1e-2", "--warmup-steps", "1",
        "--lr-schedule", "cosine", "--lora-rank", "4",
        "--lora-alpha", "8", "--precision", "f32", "--chat-template", "on", "--quiet",
        "--threads", "1", *extra,
    ]  # fmt: skip


WORDS = "the quick brown fox jumps over a lazy dog while seven small birds sing".split()


def write_corpus(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    a, b = folder / "a.txt", folder / "b.txt"
    a.write_text(" ".join(WORDS[(i * 7) % len(WORDS)] for i in range(60)), encoding="utf-8")
    b.write_text("Ünïcode line.\n" + " ".join(WORDS[::-1] * 3), encoding="utf-8")
    return [a, b]


def text_args(model: Path, corpus: list[Path], out: Path, *extra: str, seed: int = 3) -> list[str]:
    files = [x for p in corpus for x in ("--corpus", str(p))]
    return [
        "tune", "text", "--model", str(model), *files, "--output", str(out),
        "--seed", str(seed), "--window", "24", "--windows-per-step", "3", "--steps", "4",
        "--batch-size", "2", "--learning-rate", "1e-2", "--warmup-steps", "1",
        "--lr-schedule", "cosine", "--lora-rank", "4", "--lora-alpha", "8", "--precision", "f32",
        "--threads", "1", "--quiet", *extra,
    ]  # fmt: skip
