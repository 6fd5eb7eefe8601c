"""Shared set-up for the capture/replay tests: tiny GRPO (and SFT/DPO/reward) TOML configs on the
toy model, a source capture, and replay configs copied from it as docs/capture.md describes."""

from __future__ import annotations

import copy
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from twinrun.cli.main import run_cli
from twinrun.data.examples import shipped_examples

PLUGIN = '''
class Shaped:
    """Reward from the sampled bytes (so advantages are not all zero); takes any arguments."""

    def __init__(self, **args):
        self.args = args

    def prompt(self, row, rng):
        return row["prompt"]

    def reward(self, row, completion):
        return float(len(completion.encode("utf-8")) % 5)


def make(**args):
    return Shaped(**args)
'''


def plugin(folder: Path, name: str = "twinrun_capture_test_env") -> str:
    (folder / f"{name}.py").write_text(PLUGIN)
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    return f"{name}:make"


def arith(folder: Path) -> Path:
    p = folder / "arith.jsonl"
    rows = [{"prompt": f"What is {a} + {b}?", "answer": str(a + b)} for a in range(1, 5)
            for b in range(1, 3)]  # fmt: skip
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def write_toml(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(tomli_w.dumps(doc))
    return path


def grpo_source(model: Path, examples: Path, env: str, init: Path | None, out: Path) -> dict:
    doc: dict[str, Any] = {
        "training": {"trainer": "grpo", "seed": 7, "max_steps": 1, "save_every": 0,
                     "learning_rate": 0.05, "warmup_steps": 0,
                     "lr_schedule": "cosine", "batch_size": 4,
                     "precision": "f32"},
        "model": {"path": str(model), "chat_template": "on", "lora_rank": 4, "lora_alpha": 8},
        "data": {"examples": str(examples)},
        "grpo": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 4,
                 "temperature": 1.0, "clip_eps": 0.2, "advantage_clip": 5.0, "token_cap": 3},
        "environment": {"name": env},
        "backend": {"devices": "cpu",
                    "options": {"strict_deterministic": True, "gradient_checkpointing": False,
                                "threads": 1}},
        "inference": {"engine": "pytorch"},
        "logging": {"dir": str(out)},
        "optimizer_batch": {"capture": True},
    }  # fmt: skip
    if init is not None:
        doc["resume"] = {"from": str(init)}
    return doc


def epoch_source(trainer: str, model: Path, init: Path, out: Path, examples: Path) -> dict:
    """A one-step sft/dpo/reward source: 4 examples, batch 2, accumulation 2."""
    doc: dict[str, Any] = {
        "training": {"trainer": trainer, "seed": 5, "max_steps": 1, "save_every": 0,
                     "learning_rate": 0.01, "warmup_steps": 0,
                     "lr_schedule": "cosine", "batch_size": 2,
                     "accumulation": 2, "epochs": 1, "precision": "f32"},
        "model": {"path": str(model), "chat_template": "on", "lora_rank": 4, "lora_alpha": 8},
        "data": {"examples": str(examples)},
        "backend": {"devices": "cpu", "options": {"threads": 1}},
        "resume": {"from": str(init)},
        "logging": {"dir": str(out)},
        "optimizer_batch": {"capture": True},
    }  # fmt: skip
    if trainer == "dpo":
        doc["dpo"] = {"beta": 0.1}
    return doc


def shipped(name: str, folder: Path, n: int = 4) -> Path:
    lines = shipped_examples(name).read_text().splitlines()[:n]
    p = folder / name
    p.write_text("\n".join(lines) + "\n")
    return p


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@dataclass
class Capture:
    source: dict[str, Any]  # the source config
    out: Path
    step: int

    @property
    def manifest(self) -> Path:
        return self.out / f"optimizer_batch_step_{self.step:06d}.manifest.json"

    @property
    def row(self) -> dict[str, Any]:
        return next(r for r in metrics(self.out) if r["step"] == self.step)

    def replay_config(self, out: Path, **sections: dict[str, Any]) -> dict[str, Any]:
        """The source config with the runner, output and pins changed (docs/capture.md)."""
        import hashlib

        doc = copy.deepcopy(self.source)
        doc["training"]["trainer"] = "optimizer_replay"
        doc["training"]["max_steps"] = 1
        doc["training"].pop("save_every", None)
        doc["logging"]["dir"] = str(out)
        doc["optimizer_batch"] = {
            "replay_path": str(self.manifest),
            "expected_logical_sha256": self.row["optimizer/logical_batch_sha256"],
            "expected_manifest_sha256": hashlib.sha256(self.manifest.read_bytes()).hexdigest(),
        }
        for name, values in sections.items():
            node = doc
            for part in name.split("."):
                node = node.setdefault(part, {})
            node.update(values)
        return doc


def init_adapter(folder: Path, model: Path, seed: int = 7) -> Path:
    assert run_cli(["init-adapter", str(folder), "--model", str(model), "--seed", str(seed),
                    "--lora-rank", "4", "--lora-alpha", "8"]) == 0  # fmt: skip
    return folder


def run_config(path: Path, doc: dict[str, Any], *extra: str) -> int:
    write_toml(path, doc)
    return run_cli(["run", str(path), "--quiet", *extra])
