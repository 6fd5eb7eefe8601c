"""TRL's and Hugging Face `TrainingArguments`' flag names, and twinrun's for the same setting.

A user coming from TRL types `--learning_rate`, `--lr` or `--num_train_epochs`; the closest
spelling among twinrun's flags is often a different setting (`--lr` is nearest `--help`,
`--reward_funcs` nearest `--threads`). An unknown flag found here is answered with twinrun's
name for it for the objective at hand (`--max_steps` is `--stop-after` for a run of epochs and
`--steps` for GRPO); one that has no twinrun equivalent gets no guess at all rather than a wrong
one. TRL's parser takes `--max-steps` for `--max_steps`, so both spellings are looked up.

A flag twinrun has, but for another objective (`--beta` given to `tune sft`), is answered with the
objectives that take it.
"""

from __future__ import annotations

from twinrun.config.run import SETTINGS
from twinrun.objectives.registry import names

EPOCH_RUNS = names(counts="epochs")  # the objectives whose length is --epochs
STEP_RUNS = names(counts="steps")  # the objectives whose length is --steps

# TRL / HF name -> what twinrun calls it (a flag, or a few words where it is not one flag);
# None: twinrun has no such setting (no suggestion is better than the nearest spelling)
TRL_NAMES: dict[str, str | None] = {
    "--lr": "--learning-rate",
    "--learning_rate": "--learning-rate",
    "--num_train_epochs": "--epochs",
    "--per_device_train_batch_size": "--batch-size",
    "--train_batch_size": "--batch-size",
    "--gradient_accumulation_steps": "--accumulation",
    "--warmup_steps": "--warmup-steps",
    "--warmup_ratio": "--warmup-ratio",
    "--assistant_only_loss": "--messages-loss assistant (all: every token, TRL's default)",
    "--lr_scheduler_type": "--lr-schedule",
    "--max_steps": "--steps",
    "--max_grad_norm": "--max-grad-norm",
    "--gradient_checkpointing": "--gradient-checkpointing",
    "--lora_r": "--lora-rank",
    "--lora_rank": "--lora-rank",
    "--lora_alpha": "--lora-alpha",
    "--lora_target_modules": "--lora-targets",
    "--target_modules": "--lora-targets",
    "--max_length": "--max-length",
    "--max_seq_length": "--max-length",
    "--max_prompt_length": "--max-length",
    "--num_generations": "--group-size",
    "--max_completion_length": "--max-new-tokens",
    "--epsilon": "--clip-eps",
    "--reward_funcs": "--env (an environment scores the completions)",
    "--reward_model": "--env (an environment scores the completions)",
    "--model_name_or_path": "--model",
    "--output_dir": "--output",
    "--dataset_name": "--examples",
    "--dataset": "--examples",
    "--train_file": "--examples",
    "--eval_steps": "--eval-every",
    "--eval_dataset": "--eval-examples",
    "--save_steps": "--checkpoint-every",
    "--report_to": "--report-to",
    "--resume_from_checkpoint": "--resume",
    "--bf16": "--precision bf16",
    "--fp16": "--precision bf16 (or f32)",
    "--loss_type": "the objective: twinrun tune dpo | ipo | simpo",
    "--simpo_gamma": "--gamma",
    "--use_peft": "nothing: every twinrun run trains LoRA",
    "--lora_dropout": "--lora-dropout",
    "--config": "`twinrun run CONFIG.toml` (a TOML config is run by its own command)",
    "--packing": None,
}

# Where twinrun's name depends on the objective: TRL name -> objective -> twinrun's words.
# A run of epochs plans its steps from the data; --stop-after ends it early.
BY_OBJECTIVE: dict[str, dict[str, str]] = {
    "--max_steps": dict.fromkeys(
        EPOCH_RUNS, "--stop-after (this run's length is --epochs; --stop-after N runs its first N)"
    ),
    "--num_train_epochs": dict.fromkeys(STEP_RUNS, "--steps (this objective counts steps)"),
    "--beta": dict.fromkeys(
        names(batch="rollouts"),
        "--kl-beta (GRPO's KL weight; --beta is DPO's and IPO's temperature)",
    ),
}


def _trl_key(flag: str) -> str:
    """`--max-steps` and `--max_steps` alike: TRL's parser takes both spellings."""
    name = flag.split("=", 1)[0]
    return "--" + name[2:].replace("-", "_") if name.startswith("--") else name


def flag_objectives(flag: str) -> tuple[str, ...]:
    """The training commands that take twinrun's `flag` (() for a flag twinrun has not)."""
    for s in SETTINGS.values():
        if s.flag and flag in s.flag.split("/"):
            return s.objectives
    return ()


def twinrun_name(flag: str, objective: str | None = None) -> str | None:
    """twinrun's name for TRL's `flag` as `objective` (a `tune` command) takes it ("" when `flag`
    is not TRL's; None when TRL's has no twinrun equivalent)."""
    key = _trl_key(flag)
    theirs = BY_OBJECTIVE.get(key, {}).get(objective or "")
    if theirs is None:
        theirs = TRL_NAMES.get(key, "")
    if not theirs or objective is None or not theirs.startswith("--"):
        return theirs
    takes = flag_objectives(theirs.split()[0])
    if takes and objective not in takes:  # twinrun's flag, but not this objective's
        return (
            f"{theirs}, a flag of twinrun tune {', '.join(takes)} ({objective} has no such setting)"
        )
    return theirs


def other_objectives_flag(flag: str, objective: str) -> str:
    """For twinrun's own `flag` given to `tune objective` that does not take it: which `tune`
    commands do, in a few words ("" when none does, or `objective` does)."""
    takes = flag_objectives(flag.split("=", 1)[0])
    if not takes or objective in takes:
        return ""
    return f"a flag of twinrun tune {', '.join(takes)}, not of tune {objective}"
