"""Child of bench/tool_grpo_vs_trl.py, run by the interpreter of the benchmark's TRL environment
(`bench/.venv-trl`): TRL's GRPOTrainer with `environment_factory=Calculator` (the class of
bench/tool_grpo_vs_trl.py, the one twinrun loads too) on the given checkpoint for N steps, one
torch thread, writing each optimizer step's wall time (on_step_begin -> on_step_end), and per step
the mean model turns, model tokens and all tokens (model + tool) per episode, to a JSON file.

    bench/.venv-trl/bin/python bench/trl_tool_child.py SETTINGS.json OUT.json

The tokenizer gets `response_template`: the Hermes parser of TRL's `qwen3_template` (tool calls
between `<tool_call>` tags, JSON) with the checkpoint's assistant header and end of turn, since
TRL ships parsers only for the templates it knows. Not part of the package.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))  # twinrun's evaluate and first_integer
sys.path.insert(0, str(HERE))

HEADERS = {  # the assistant header and the end-of-turn pattern of each template
    "toy": ("<|assistant|>\n", r"<\|eos\|>\s*"),
    "smollm2": ("<|im_start|>assistant\n", r"<\|im_end\|>\s*"),
}


def response_template(kind: str) -> dict[str, Any]:
    anchor, close = HEADERS[kind]
    return {
        "defaults": {"role": "assistant"},
        "start_anchor": anchor,
        "fields": {
            "tool_calls": {
                "open": "<tool_call>",
                "close_pattern": r"</tool_call>\s*",
                "repeats": True,
                "content": "json",
                "transform": {"type": "function", "function": "{content}"},
            },
            "content": {"close_pattern": close, "content": "text"},
        },
    }


def main(settings_path: str, out_path: str) -> None:
    s: dict[str, Any] = json.loads(open(settings_path, encoding="utf-8").read())
    import torch

    torch.set_num_threads(1)
    import trl
    from datasets import Dataset
    from peft import LoraConfig
    from tool_grpo_vs_trl import Calculator
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from twinrun.rl.builtin_envs import first_integer

    rows = [json.loads(line) for line in open(s["examples"], encoding="utf-8") if line.strip()]
    data = Dataset.from_list([
        {"prompt": [*([{"role": "system", "content": s["system"]}] if s["system"] else []),
                    {"role": "user", "content": r["prompt"]}],
         "answer": str(r["answer"])}
        for r in rows
    ])  # fmt: skip

    def final_answer(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
        """twinrun's reward for a TRL class without `reward`: the final model turn starts with
        the answer."""
        out = []
        for c, a in zip(completions, answer, strict=True):
            turns = [m for m in c if m.get("role") == "assistant"] if isinstance(c, list) else []
            text = turns[-1].get("content") or "" if turns else (c if isinstance(c, str) else "")
            out.append(1.0 if first_integer(text) == int(a) else 0.0)
        return out

    rows_per_step = s["prompts_per_step"] * s["group_size"]
    cfg = GRPOConfig(
        output_dir=s["output"], use_cpu=True, seed=s["seed"], max_steps=s["steps"],
        per_device_train_batch_size=rows_per_step, gradient_accumulation_steps=1,
        num_generations=s["group_size"], max_completion_length=s["trl_max_completion_length"],
        max_tool_calling_iterations=s["trl_max_tool_calling_iterations"],
        temperature=s["temperature"], top_k=0, top_p=1.0, beta=0.0,
        learning_rate=s["learning_rate"], lr_scheduler_type="constant", warmup_steps=0,
        logging_steps=1, save_strategy="no", report_to="none", disable_dropout=True,
        dataloader_num_workers=0, bf16=False, fp16=False,
    )  # fmt: skip
    tok = AutoTokenizer.from_pretrained(s["model"])
    tok.response_template = response_template(s["kind"])
    model = AutoModelForCausalLM.from_pretrained(
        s["model"], dtype=torch.float32, attn_implementation="eager"
    )
    lora = LoraConfig(
        r=s["lora_rank"], lora_alpha=s["lora_alpha"], lora_dropout=0.0,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM",
    )  # fmt: skip
    times: list[float] = []
    episodes: list[dict[str, float]] = []

    class StepTimes(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.t0 = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            times.append(time.perf_counter() - self.t0)

    class Counted(GRPOTrainer):
        """GRPOTrainer, counting each episode's model turns and tokens after the tool loop."""

        def _tool_call_loop(self, *args: Any, **kwargs: Any) -> Any:
            out = super()._tool_call_loop(*args, **kwargs)
            tool_mask, completions, completion_ids = out[0], out[1], out[2]
            n = len(completions)
            episodes.append({
                "turns": sum(sum(m.get("role") == "assistant" for m in c) for c in completions) / n,
                "model_tokens": sum(sum(m) for m in tool_mask) / n,
                "tokens": sum(len(c) for c in completion_ids) / n,
            })  # fmt: skip
            return out

    trainer = Counted(
        model=model, reward_funcs=[final_answer], args=cfg, train_dataset=data,
        processing_class=tok, peft_config=lora, callbacks=[StepTimes()],
        environment_factory=Calculator,
    )  # fmt: skip
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    result = {
        "trl": trl.__version__,
        "torch_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "step_s": times,
        "turns_per_episode": [e["turns"] for e in episodes],
        "model_tokens_per_episode": [e["model_tokens"] for e in episodes],
        "tokens_per_episode": [e["tokens"] for e in episodes],
        "logged_mean_length": [h.get("completions/mean_length") for h in logs],
        "tool_call_frequency": [h.get("tools/call_frequency") for h in logs],
        "reward_mean": [h.get("reward") for h in logs],
    }
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
