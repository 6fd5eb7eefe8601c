"""What transformers itself computes on a checkpoint: the references twinrun's numbers are held to.

- `greedy_reference(model_dir, prompt_ids, n)`: transformers' greedy `generate` (new tokens only,
  stopping at the checkpoint's eos ids) — a twinrun decoder must give the same tokens;
- `completion_loss_reference(model_dir, input_ids, loss_mask)`: the mean negative log-likelihood
  of the masked tokens (token t scored by the logits at t-1), in float64 from float32 logits — a
  twinrun per-example loss on the same tokens must equal it.

One eager float32 model per directory per process (loading the 135M model takes about a second).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

_MODELS: dict[str, Any] = {}


def reference_model(model_dir: Path) -> Any:
    """transformers' model of `model_dir`: float32, eager attention, eval mode (cached)."""
    key = str(Path(model_dir).resolve())
    if key not in _MODELS:
        import torch
        from transformers import AutoModelForCausalLM

        _MODELS[key] = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation="eager"
        ).eval()
    return _MODELS[key]


def greedy_reference(model_dir: Path, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy `generate` on `prompt_ids`: the new tokens (the last one an end id
    when it stopped early)."""
    import torch

    model = reference_model(model_dir)
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]),
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
        )
    return [int(t) for t in out[0, len(prompt_ids) :]]


def completion_loss_reference(
    model_dir: Path, input_ids: list[int] | tuple[int, ...], loss_mask: list[int] | tuple[int, ...]
) -> float:
    """Mean NLL of the tokens where `loss_mask` is 1, from one forward of transformers' model."""
    import torch

    model = reference_model(model_dir)
    ids = torch.tensor([list(input_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0, :-1].double()
    logprobs = torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None])[:, 0]
    mask = torch.tensor(list(loss_mask)[1:], dtype=torch.bool)
    if not bool(mask.any()):
        raise ValueError("the loss mask covers no token after the first")
    return float(-logprobs[mask].mean())
