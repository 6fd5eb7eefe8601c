"""The golden suite: a fixed set of short runs on the toy model (seed 0), each reduced to bytes
and numbers that must not move on one platform.

Items, in the order they are checked (the first that moved is the one reported):

- `<objective>.adapter_sha256` for sft, dpo, ipo, simpo, reward (and `reward.head_sha256`), grpo and
  text: runs of 2 to 4 optimizer steps on shipped examples (a fixed text for `text`);
  `grpo.diag_sha256`, the GRPO run's diag.jsonl — its sampled tokens, logprobs and rewards.
  GRPO's reward varies with the sampled bytes (`twinrun.golden.shaped_env`), so its advantages
  are not all zero, and prioritized replay feeds rollouts of an earlier policy back, so its
  ratio goes through `exp` of a log-ratio that is not 0. The text run trains windows of 320
  tokens (inner dimensions past 512) on two threads;
- `evaluate.loss`, `evaluate.tokens`, `evaluate.per_example` of the sft adapter on its examples;
- `generate.tokens`: the text adapter's 24 greedy tokens for one plain prompt (the sft adapter
  learns to end its answers at once, which would leave little to compare);
- `extract.hidden`: 512 floats, the sft adapter's mean-pooled layer-2 hidden states of 8
  examples (8 x 64).

Every run is in-process at f32, on one thread but the text run's two. `run_suite` is computed
once per process and device: the suite is deterministic, and a second `golden check` need not
train again.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from twinrun.config.run import RunConfig
from twinrun.objectives.registry import OBJECTIVES

GREEDY_TOKENS = 24
PROMPT = "Reproducible training is"
TEXT = (
    "Reproducible training is a habit. Same seed, same data, same bytes: the adapter a run "
    "writes today is the adapter it writes tomorrow, and the one a colleague writes elsewhere. "
) * 3
SHAPED_ENV = "twinrun.golden.shaped_env:make"
_CACHE: dict[str, dict[str, Any]] = {}


def common(model: Path, out: Path, objective: str, **more: Any) -> RunConfig:
    return RunConfig(
        objective=objective, model=str(model), output=str(out), seed=0, batch_size=2,
        learning_rate=1e-2, warmup_steps=0, lr_schedule="cosine", lora_rank=4, lora_alpha=8.0,
        precision="f32", quiet=True, cpu_kernels="portable", **({"threads": 1} | more),
    )  # fmt: skip


def write_inputs(root: Path) -> dict[str, Path]:
    from twinrun.data.examples import shipped_examples

    files = {}
    for name, n in (("sft.jsonl", 8), ("pairs.jsonl", 4), ("arith.jsonl", 4)):
        lines = shipped_examples(name).read_text(encoding="utf-8").splitlines()[:n]
        files[name] = root / name
        files[name].write_text("\n".join(lines) + "\n", encoding="utf-8")
    files["text"] = root / "corpus.txt"
    files["text"].write_text(TEXT, encoding="utf-8")
    return files


def run_suite(device: str = "cpu") -> dict[str, Any]:
    """The suite's items (see the module docstring), computed in a temporary directory."""
    if device not in _CACHE:
        with tempfile.TemporaryDirectory(prefix="twinrun-golden-") as tmp:
            _CACHE[device] = _run(Path(tmp), device)
    return dict(_CACHE[device])


def run_settings(data: dict[str, Path], device: str) -> dict[str, dict[str, Any]]:
    """Each objective's run in the suite: the settings beyond `common`'s, by objective name."""
    epochs = {"epochs": 1, "accumulation": 1, "chat_template": "on", "device": device}
    return {
        "sft": {"examples": str(data["sft.jsonl"]), **epochs},
        "dpo": {"examples": str(data["pairs.jsonl"]), "beta": 0.1, **epochs},
        "ipo": {"examples": str(data["pairs.jsonl"]), "beta": 0.1, **epochs},
        "simpo": {"examples": str(data["pairs.jsonl"]), "beta": 2.0, "gamma": 0.5, **epochs},
        "reward": {"examples": str(data["pairs.jsonl"]), **epochs},
        "grpo": {
            "examples": str(data["arith.jsonl"]), "steps": 4, "prompts_per_step": 2,
            "group_size": 3, "max_new_tokens": 6, "temperature": 1.0, "clip_eps": 0.2,
            "advantage_clip": 5.0, "token_cap": 6, "env": SHAPED_ENV, "chat_template": "on",
            "replay": "per", "replay_capacity": 16, "replay_alpha": 0.6, "replay_beta": 0.4,
            "replay_fraction": 0.5, "device": device, "diag": True,
        },
        "text": {  # windows of 320 tokens: inner dimensions past 512 (LoRA A's gradient)
            "corpus": [str(data["text"])], "window": 320, "windows_per_step": 2, "steps": 3,
            "device": device, "threads": 2,
        },
    }  # fmt: skip


def _run(root: Path, device: str) -> dict[str, Any]:
    from twinrun.core.digest import sha256_file
    from twinrun.model.toy import write_toy_checkpoint
    from twinrun.train.recipes import train

    model = root / "toy"
    write_toy_checkpoint(model, seed=0)
    data = write_inputs(root)
    settings = run_settings(data, device)
    items: dict[str, Any] = {}
    for o in OBJECTIVES:
        out = root / o.name
        record = train(common(model, out, o.name, **settings[o.name]))
        items[f"{o.name}.adapter_sha256"] = record["adapter"]["sha256"]
        if o.head:
            items[f"{o.name}.head_sha256"] = sha256_file(out / "reward_head.safetensors")
        if o.samples:  # the sampled rollouts (the toy earns no reward: the adapter stays)
            items[f"{o.name}.diag_sha256"] = sha256_file(out / "diag.jsonl")
    items |= inference_items(root, model, root / "sft", data["sft.jsonl"], device)
    items["generate.tokens"] = greedy_tokens(model, root / "text", device)
    return items


def greedy_tokens(model: Path, adapter: Path, device: str) -> list[int]:
    from twinrun.infer.generate import GenerateConfig, run_generate

    greedy = run_generate(
        GenerateConfig(
            model=str(model),
            adapter=str(adapter),
            prompt=PROMPT,
            chat_template="off",
            precision="f32",
            device=device,
            threads=1,
            cpu_kernels="portable",
            max_new_tokens=GREEDY_TOKENS,
            temperature=0.0,
            seed=0,
        )  # fmt: skip
    )
    return [int(t) for t in greedy["tokens"]]


def inference_items(
    root: Path, model: Path, adapter: Path, examples: Path, device: str
) -> dict[str, Any]:
    """evaluate and extraction with the sft adapter."""
    from twinrun.core.safetensors_io import read_safetensors
    from twinrun.infer.evaluate import EvalConfig, run_evaluate
    from twinrun.infer.extract import ExtractConfig, run_extract

    shared: dict[str, Any] = {"model": str(model), "adapter": str(adapter), "chat_template": "on",
              "precision": "f32", "device": device, "threads": 1,
              "cpu_kernels": "portable"}  # fmt: skip
    report = run_evaluate(
        EvalConfig(
            **shared,
            examples=str(examples),
            batch_size=4,
            output=str(root / "eval.json"),
            quiet=True,
        )  # fmt: skip
    )
    hidden = root / "hidden.safetensors"
    run_extract(
        ExtractConfig(
            **shared,
            examples=str(examples),
            layer=2,
            pool="mean",
            batch_size=4,
            output=str(hidden),
            quiet=True,
        )  # fmt: skip
    )
    floats = [
        float(x)
        for x in read_safetensors(hidden, "hidden states", "rerun the suite")
        .tensors["hidden"]
        .reshape(-1)
        .tolist()
    ]
    return {
        "evaluate.loss": report["loss"],
        "evaluate.tokens": report["tokens"],
        "evaluate.per_example": [e["loss"] for e in report["per_example"]],
        "extract.hidden": floats,
    }
