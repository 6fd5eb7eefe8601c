"""The no-framework reference for bench/sft_epoch.py: a plain PyTorch + PEFT LoRA SFT loop.

Hugging Face `AutoModelForCausalLM` (`--attention`; by default transformers' own choice) +
`peft.get_peft_model` with a LoRA on q/k/v/o (dropout 0), AdamW (weight decay 0, as twinrun),
linear warmup then cosine to zero, one forward per optimizer step. The token rows and the
per-epoch batches are twinrun's (its encoding and batching helpers), so both loops see the same
data in the same order and take the same number of optimizer steps.
The loss is HF's own (`labels`, -100 on prompt and padding tokens): a token mean per forward,
which is twinrun's completion-only loss when each step is one forward.

    python bench/plain_sft.py --model DIR --examples FILE --output DIR --seed N --epochs N \
        --batch-size N --learning-rate F --warmup-steps N --lora-rank N --lora-alpha F \
        [--chat-template on|off] [--threads N] [--twinrun-init] [--attention eager|sdpa]

`--twinrun-init` draws the LoRA A factors from twinrun's stream (as twinrun does) instead of
PEFT's torch-generator init, so the per-step losses can be checked against a twinrun run.
Writes the adapter with `save_pretrained`, and per step the loss and the wall time from setting
the learning rate to the optimizer step (`wall_s`) to `metrics.jsonl`.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

T0 = time.perf_counter()

import torch  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from twinrun.data.batching import plan_steps  # noqa: E402
from twinrun.data.examples import encode_sft_rows, load_rows  # noqa: E402
from twinrun.model.tokens import load_tokenizer  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def lr_at(step: int, base: float, warmup: int, total: int) -> float:
    """Linear warmup, then cosine to exactly zero at the last step (twinrun's schedule)."""
    if step < warmup:
        return base * (step + 1) / warmup
    last = total - 1
    if last == warmup:
        return base
    return base * 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / (last - warmup)))


def collate(rows: list, pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad to the longest row: input_ids, attention_mask, labels (-100 = no loss)."""
    width = max(len(r.input_ids) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for b, r in enumerate(rows):
        t = len(r.input_ids)
        row = torch.tensor(r.input_ids, dtype=torch.long)
        ids[b, :t] = row
        attn[b, :t] = 1
        labels[b, :t] = torch.where(torch.tensor(r.loss_mask, dtype=torch.bool), row, -100)
    return ids, attn, labels


def twinrun_init(model: torch.nn.Module, seed: int) -> None:
    from twinrun.core.rng import stream, torch_tensor

    prefix = "base_model.model."
    with torch.no_grad():
        for name, mod in model.named_modules():
            if name.rsplit(".", 1)[-1] in TARGETS and hasattr(mod, "lora_A"):
                a = mod.lora_A["default"].weight
                draw = stream(seed, "lora_A", name.removeprefix(prefix)).kaiming_uniform(
                    tuple(a.shape)
                )
                a.copy_(torch_tensor(draw, torch.float32))


def main() -> None:
    ap = argparse.ArgumentParser(description="plain PyTorch + PEFT LoRA SFT (reference loop)")
    ap.add_argument("--model", required=True)
    ap.add_argument("--examples", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--epochs", type=int, required=True)
    ap.add_argument("--batch-size", type=int, required=True)
    ap.add_argument("--learning-rate", type=float, required=True)
    ap.add_argument("--warmup-steps", type=int, required=True)
    ap.add_argument("--lora-rank", type=int, required=True)
    ap.add_argument("--lora-alpha", type=float, required=True)
    ap.add_argument("--chat-template", choices=["on", "off"], default="on")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--twinrun-init", action="store_true")
    ap.add_argument("--attention", choices=["eager", "sdpa"], default=None)
    args = ap.parse_args()

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    tok = load_tokenizer(args.model)
    rows = encode_sft_rows(tok, load_rows(args.examples), args.chat_template == "on", 1 << 30)
    plans = plan_steps(len(rows), args.epochs, args.batch_size, 1, args.seed)

    model = AutoModelForCausalLM.from_pretrained(
        args.model, dtype=torch.float32, attn_implementation=args.attention
    )
    lora = LoraConfig(
        r=args.lora_rank,
        lora_alpha=args.lora_alpha,
        lora_dropout=0.0,
        target_modules=TARGETS,
        bias="none",
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(model, lora)
    if args.twinrun_init:
        twinrun_init(model, args.seed)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.learning_rate, weight_decay=0.0)  # as twinrun

    losses, walls = [], []
    t_loop = time.perf_counter()
    for plan in plans:
        t_step = time.perf_counter()
        lr = lr_at(plan.step, args.learning_rate, args.warmup_steps, len(plans))
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad()
        (fw,) = plan.forwards
        ids, attn, labels = collate([rows[i] for i in fw], tok.pad_id)
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
        walls.append(time.perf_counter() - t_step)
    loop_s = time.perf_counter() - t_loop

    out = Path(args.output)
    model.save_pretrained(out)
    with open(out / "metrics.jsonl", "w", encoding="utf-8") as f:
        for step, (loss_value, wall) in enumerate(zip(losses, walls, strict=True)):
            f.write(json.dumps({"step": step, "loss": loss_value, "wall_s": wall}) + "\n")
    summary = {
        "steps": len(plans),
        "final_loss": losses[-1],
        "loop_s": loop_s,
        "wall_s": time.perf_counter() - T0,
        "attn_implementation": model.config._attn_implementation,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
