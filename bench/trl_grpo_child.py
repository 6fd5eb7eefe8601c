"""Child of bench/grpo_vs_trl.py, run by the interpreter of the benchmark's TRL environment
(`bench/.venv-trl`): TRL's GRPOTrainer on the given checkpoint for N steps, one torch thread,
writing each optimizer step's wall time (on_step_begin -> on_step_end) to a JSON file.

    bench/.venv-trl/bin/python bench/trl_grpo_child.py SETTINGS.json OUT.json

SETTINGS: model, examples, steps, seed, prompts_per_step, group_size, max_new_tokens,
temperature, learning_rate, lora_rank, lora_alpha, batch_size. Not part of the package.
"""

from __future__ import annotations

import json
import re
import sys
import time
from typing import Any


def main(settings_path: str, out_path: str) -> None:
    s: dict[str, Any] = json.loads(open(settings_path, encoding="utf-8").read())
    import torch

    torch.set_num_threads(1)
    import trl
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    rows = [json.loads(line) for line in open(s["examples"], encoding="utf-8") if line.strip()]
    data = Dataset.from_list([
        {"prompt": [{"role": "user", "content": r["prompt"]}], "answer": str(r["answer"])}
        for r in rows
    ])  # fmt: skip

    def arithmetic(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
        """twinrun's `arithmetic` reward: 1 when the first integer is the answer."""
        out = []
        for c, a in zip(completions, answer, strict=True):
            text = c[0]["content"] if isinstance(c, list) else c
            m = re.search(r"(-?\d+)", text)
            out.append(1.0 if m and int(m.group(1)) == int(a) else 0.0)
        return out

    rows_per_step = s["prompts_per_step"] * s["group_size"]
    cfg = GRPOConfig(
        output_dir=s["output"], use_cpu=True, seed=s["seed"], max_steps=s["steps"],
        per_device_train_batch_size=rows_per_step, gradient_accumulation_steps=1,
        num_generations=s["group_size"], max_completion_length=s["max_new_tokens"],
        temperature=s["temperature"], top_k=0, top_p=1.0, beta=0.0,
        learning_rate=s["learning_rate"], lr_scheduler_type="constant", warmup_steps=0,
        logging_steps=1, save_strategy="no", report_to="none", disable_dropout=True,
        dataloader_num_workers=0, bf16=False, fp16=False,
    )  # fmt: skip
    tok = AutoTokenizer.from_pretrained(s["model"])
    model = AutoModelForCausalLM.from_pretrained(
        s["model"], dtype=torch.float32, attn_implementation="eager"
    )
    lora = LoraConfig(
        r=s["lora_rank"], lora_alpha=s["lora_alpha"], lora_dropout=0.0,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM",
    )  # fmt: skip
    times: list[float] = []

    class StepTimes(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.t0 = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            times.append(time.perf_counter() - self.t0)

    trainer = GRPOTrainer(
        model=model, reward_funcs=[arithmetic], args=cfg, train_dataset=data,
        processing_class=tok, peft_config=lora, callbacks=[StepTimes()],
    )  # fmt: skip
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    result = {
        "trl": trl.__version__,
        "torch_threads": torch.get_num_threads(),
        "step_s": times,
        "completion_lengths": [h.get("completions/mean_length") for h in logs],
        "rewards": [h.get("reward") for h in logs],
    }
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
