"""TRL's and Hugging Face `TrainingArguments`' flag names, and twinrun's for the same setting.

A user coming from TRL types `--learning_rate`, `--lr` or `--num_train_epochs`; the closest
spelling among twinrun's flags is often a different setting (`--lr` is nearest `--help`,
`--reward_funcs` nearest `--threads`). An unknown flag found here is answered with twinrun's
name for it; one that has no twinrun equivalent gets no guess at all rather than a wrong one.
"""

from __future__ import annotations

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
    "--lr_scheduler_type": "--lr-schedule",
    "--max_steps": "--steps",
    "--max_grad_norm": "--max-grad-norm",
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
    "--loss_type": "the objective: twinrun tune dpo | ipo",
    "--use_peft": "nothing: every twinrun run trains LoRA",
    "--lora_dropout": "--lora-dropout",
    "--packing": None,
}


def twinrun_name(flag: str) -> str | None:
    """twinrun's name for TRL's `flag` ("" when `flag` is not TRL's; None when TRL's has no
    twinrun equivalent)."""
    return TRL_NAMES.get(flag.split("=", 1)[0], "")
