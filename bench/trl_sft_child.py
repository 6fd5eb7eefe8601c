"""Child of bench/sft_vs_trl.py, run by the interpreter of the benchmark's TRL environment
(`bench/.venv-trl`): TRL's SFTTrainer with LoRA on the given checkpoint for one epoch, one torch
thread — the whole process is what the parent times. Not part of the package.

    bench/.venv-trl/bin/python bench/trl_sft_child.py SETTINGS.json

SETTINGS: model, examples, output, seed, batch_size, learning_rate, lora_rank, lora_alpha.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def main(settings_path: str) -> None:
    s: dict[str, Any] = json.loads(open(settings_path, encoding="utf-8").read())
    import torch

    torch.set_num_threads(1)
    from datasets import Dataset
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    rows = []
    for line in open(s["examples"], encoding="utf-8"):
        if not line.strip():
            continue
        r = json.loads(line)
        if "messages" in r:
            prompt, answer = r["messages"][0]["content"], r["messages"][1]["content"]
        else:
            prompt, answer = r["prompt"], r["completion"]
        rows.append({
            "prompt": [{"role": "user", "content": prompt}],
            "completion": [{"role": "assistant", "content": answer}],
        })  # fmt: skip
    config = SFTConfig(
        output_dir=s["output"], num_train_epochs=1, per_device_train_batch_size=s["batch_size"],
        learning_rate=s["learning_rate"], lr_scheduler_type="cosine", warmup_steps=2,
        seed=s["seed"], report_to="none", save_strategy="no", logging_strategy="no",
        use_cpu=True, dataloader_num_workers=0, completion_only_loss=True,
    )  # fmt: skip
    lora = LoraConfig(
        r=s["lora_rank"], lora_alpha=s["lora_alpha"], lora_dropout=0.0,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM",
    )  # fmt: skip
    trainer = SFTTrainer(
        model=s["model"], args=config, train_dataset=Dataset.from_list(rows), peft_config=lora
    )
    trainer.train()
    trainer.save_model(s["output"])


if __name__ == "__main__":
    main(sys.argv[1])
