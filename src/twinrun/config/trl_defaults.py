"""`--defaults trl`: every run number the user leaves out, taken from TRL 1.16's defaults for the
trainer that matches the objective (its registry record's `trl_config`: `SFTConfig` for sft and
text, `DPOConfig` for dpo and ipo, `CPOConfig` with `loss_type="simpo"` for simpo,
`RewardConfig`, `GRPOConfig`) and from PEFT's `LoraConfig` for the adapter; the seed too.

Nothing here is silent: the numbers taken are named in the run (`RunConfig.taken`), printed once
as a table (`defaults_table`) and recorded in the sidecar with where each came from
(`defaults_record`). A number the user gives is never replaced. A TRL default twinrun has no
setting for is left out of the table; one twinrun cannot take (GRPO's `max_steps = -1` counts
epochs over a prompt dataset, and twinrun's environments are endless) stays required.

How the values map (TRL 1.16.0 and transformers' `TrainingArguments` as TRL overrides them):
    seed 42, per_device_train_batch_size 8, gradient_accumulation_steps 1, num_train_epochs 3,
    max_grad_norm 1.0, lr_scheduler_type linear, warmup_steps 0, bf16 True, max_length 1024
    (SFT, DPO, CPO, reward), learning_rate 2e-5 (SFT) | 1e-6 (DPO, CPO, GRPO) | 1e-4 (reward),
    DPO's and CPO's beta 0.1 (IPO's tau is DPOConfig's beta), CPO's simpo_gamma 0.5, SFT's
    assistant_only_loss False (every token of a messages row is trained), GRPO's
    num_generations 8, generation_batch_size 8 (one prompt a step), max_completion_length 512,
    temperature 1.0, epsilon 0.2, beta 0.0 (no KL term); LoraConfig r 8, lora_alpha 8,
    lora_dropout 0.0 (off), target_modules: PEFT's per-architecture default. TRL does not clip
    advantages: twinrun's advantage clip is set to a bound no normalised advantage of the step
    reaches (sqrt of its rows less one, rounded up). twinrun's AdamW numbers (weight decay 0,
    betas (0.9, 0.999), eps 1e-8) are TRL's already.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twinrun.config.run import SETTINGS, RunConfig, Settings, applies
from twinrun.config.setting import Source
from twinrun.objectives.registry import BY_NAME, objective

TRL_VERSION = "1.16.0"
PEFT_VERSION = "0.21.2"
CHOICES = ("trl",)

LEARNING_RATE = {
    "SFTConfig": 2e-5, "DPOConfig": 1e-6, "RewardConfig": 1e-4, "GRPOConfig": 1e-6,
    "CPOConfig": 1e-6,
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Taken:
    """One number taken from a default: its value (None: the setting stays off) and where it
    came from, in TRL's or PEFT's own names."""

    value: Any
    source: str


def _fixed(config: str) -> dict[str, Taken]:
    """The defaults that do not depend on another setting, for a run of TRL's `config`."""
    t = Taken
    out = {
        "seed": t(42, f"{config}.seed"),
        "batch_size": t(8, f"{config}.per_device_train_batch_size"),
        "epochs": t(3, f"{config}.num_train_epochs"),
        "accumulation": t(1, f"{config}.gradient_accumulation_steps"),
        "learning_rate": t(LEARNING_RATE[config], f"{config}.learning_rate"),
        "warmup_steps": t(0, f"{config}.warmup_steps"),
        "lr_schedule": t("linear", f"{config}.lr_scheduler_type"),
        "max_grad_norm": t(1.0, f"{config}.max_grad_norm"),
        "precision": t("bf16", f"{config}.bf16 = True"),
        "chat_template": t("on", f"{config}: conversational rows go through the chat template"),
        "lora_rank": t(8, "LoraConfig.r"),
        "lora_alpha": t(8.0, "LoraConfig.lora_alpha"),
        "lora_dropout": t(None, "LoraConfig.lora_dropout = 0.0"),
    }
    if config != "GRPOConfig":
        out["max_length"] = t(1024, f"{config}.max_length")
    if config == "SFTConfig":
        out["messages_loss"] = t("all", "SFTConfig.assistant_only_loss = False")
        out["window"] = t(1024, "SFTConfig.max_length")
        out["windows_per_step"] = t(8, "SFTConfig.per_device_train_batch_size")
    if config in ("DPOConfig", "CPOConfig"):
        out["beta"] = t(0.1, f"{config}.beta")
    if config == "CPOConfig":
        out["gamma"] = t(0.5, "CPOConfig.simpo_gamma")
    if config == "GRPOConfig":
        out |= {
            "group_size": t(8, "GRPOConfig.num_generations"),
            "prompts_per_step": t(1, "GRPOConfig.generation_batch_size / num_generations"),
            "max_new_tokens": t(512, "GRPOConfig.max_completion_length"),
            "temperature": t(1.0, "GRPOConfig.temperature"),
            "clip_eps": t(0.2, "GRPOConfig.epsilon"),
            "kl_beta": t(None, "GRPOConfig.beta = 0.0 (no KL term)"),
        }
    return out


def trl_defaults(cfg: Settings) -> dict[str, Taken]:
    """What `--defaults trl` gives a run of `cfg.objective`: every setting that applies to it and
    that TRL (or PEFT) has a default for, the ones that depend on other settings (GRPO's token
    cap and advantage clip, PEFT's LoRA targets, the thread count) computed from `cfg` (a
    `RunConfig` as given or filled, or a validated run)."""
    config = objective(cfg.objective).trl_config
    fixed = {n: v for n, v in _fixed(config).items() if applies(n, cfg.objective)}
    if cfg.value("warmup_ratio") is not None:  # the warm-up is given, as a fraction of the steps
        fixed.pop("warmup_steps")

    def filled(name: str) -> Any:  # as given, else the fixed default
        value = cfg.value(name)
        return fixed[name].value if value is None and name in fixed else value

    out = dict(fixed)
    if applies("token_cap", cfg.objective):
        out["token_cap"] = Taken(
            filled("max_new_tokens"), "GRPOConfig.max_completion_length (TRL has no separate cap)"
        )
    rows = (filled("prompts_per_step") or 0) * (filled("group_size") or 0)
    if applies("advantage_clip", cfg.objective) and rows:
        out["advantage_clip"] = Taken(
            float(math.ceil(math.sqrt(max(rows - 1, 1)))),
            "GRPOConfig: no advantage clip (a bound no normalised advantage of a "
            f"{rows}-row step reaches)",
        )
    model = model_config(cfg.value("model"))
    positions = model.get("max_position_embeddings")
    if "max_length" in out and isinstance(positions, int) and 1 <= positions < 1024:
        out["max_length"] = Taken(
            positions, f"{config}.max_length = 1024, past the model's positions: its positions"
        )
    targets = peft_targets(model.get("model_type"))
    if targets is not None:
        out["lora_targets"] = Taken(targets, "LoraConfig.target_modules: PEFT's default")
    if cfg.value("device") == "cpu" and cfg.value("cpu_kernels") == "native":
        out["threads"] = Taken(
            torch_threads(), "torch's default: OMP_NUM_THREADS, else this process's CPUs"
        )
    return out


def fill_defaults(cfg: RunConfig) -> RunConfig:
    """`cfg` with every number it leaves out taken from its `--defaults` (unchanged when it
    names none, or took them already: `cfg.taken`), the names of those taken in `cfg.taken`."""
    if cfg.taken or cfg.defaults not in CHOICES or cfg.objective not in BY_NAME:
        return cfg
    if not objective(cfg.objective).trl_config:
        return cfg
    taken = {n: v for n, v in trl_defaults(cfg).items() if getattr(cfg, n) is None}
    if not taken:
        return cfg
    values: dict[str, Any] = {n: _plain(v.value) for n, v in taken.items()}
    values["taken"] = tuple(taken)
    return dataclasses.replace(cfg, **values)


def defaults_record(cfg: Settings) -> dict[str, Any] | None:
    """The sidecar's `defaults` section: which defaults, and each number taken from them with
    its value and where it came from (None when the run took none)."""
    taken, defaults = cfg.value("taken"), cfg.value("defaults")
    if not taken or defaults is None:
        return None
    sources = trl_defaults(cfg)
    return {
        "from": defaults,
        "versions": {"trl": TRL_VERSION, "peft": PEFT_VERSION},
        "config": objective(cfg.objective).trl_config,
        "taken": {
            n: {"value": _plain(cfg.value(n)), "source": sources[n].source}
            for n in taken
            if n in sources
        },
    }


def defaults_table(cfg: Settings, source: Source = "flag") -> str:
    """The numbers a run took from its defaults, one per line, as printed before it starts;
    each named as the user would give it (`source`: a flag, or a TOML key)."""
    record = defaults_record(cfg)
    if record is None:
        return ""
    rows = [
        (SETTINGS[n].name(source), _shown(t["value"]), t["source"])
        for n, t in record["taken"].items()
    ]
    width = [max(len(r[i]) for r in rows) for i in range(2)]
    head = (
        f"{len(rows)} {'number' if len(rows) == 1 else 'numbers'} taken from TRL "
        f"{TRL_VERSION}'s {record['config']} and PEFT {PEFT_VERSION}'s LoraConfig defaults "
        "(recorded in twinrun.json):"
    )
    return "\n".join([head, *(f"  {a:<{width[0]}}  {b:<{width[1]}}  {c}" for a, b, c in rows)])


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _shown(value: Any) -> str:
    if value is None:
        return "off"
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def torch_threads() -> int:
    """The thread count torch would take, known without importing it: `OMP_NUM_THREADS` when it
    is a positive integer (torchrun sets it to 1 for each process), else the CPUs this process
    may run on."""
    given = os.environ.get("OMP_NUM_THREADS", "")
    if given.isdigit() and int(given) >= 1:
        return int(given)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def model_config(model: str | None) -> Mapping[str, Any]:
    """The model's config.json as read here ({} when it cannot be: the model's own checks
    refuse it later, with their own words)."""
    if model is None:
        return {}
    try:
        config = json.loads((Path(model) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, Mapping) else {}


def peft_targets(model_type: Any) -> list[str] | None:
    """PEFT's default LoRA targets for an architecture (its `model_type`), sorted; None when
    PEFT has no default for it (twinrun's own default then applies, and is recorded)."""
    if not isinstance(model_type, str):
        return None
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as BY_TYPE

    targets = BY_TYPE.get(model_type)
    return sorted(targets) if targets else None
