"""What usually makes a leaf diverge first, and what to do about it.

`advice_for(leaf)` looks the leaf up by exact name, then by its prefix (`adam.exp_avg_sq` →
`adam.`; `trace.forward.layers.0` → `trace.`), and falls back to generic advice. The table is
written for the *first* diverging leaf: everything downstream of it diverges as a consequence.

`trace_advice(div)` does the same for the first module where two step traces part
(`twinrun.diag.trace.TraceDivergence`): by entry kind (forward output, output gradient,
parameter-gradient accumulation, final gradient), whether the traces list different events
(structure), and the module's kind (LoRA factor, embedding, norm, attention, other).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = ["ADVICE", "Advice", "GENERIC", "MISSING_ROW", "advice_for", "trace_advice"]


@dataclass(frozen=True)
class Advice:
    leaf: str
    cause: str
    fix: str

    def one_line(self) -> str:
        return f"{self.cause}. Fix: {self.fix}"


_TABLE: dict[str, tuple[str, str]] = {
    "batch.sample_indices": (
        "the sampler or a replay draw used an unseeded or shared RNG (or the data order "
        "depends on file listing, set iteration or the number of workers)",
        "draw indices from twinrun's keyed stream (`stream(seed, 'shuffle', epoch)`), never from "
        "a global or framework generator; check --seed and the examples file match",
    ),
    "replay.priorities": (
        "the prioritized buffer holds different priorities before the draw: different rollouts "
        "or advantages entered it, priorities were updated in a different order, or a resumed "
        "buffer was not restored exactly",
        "add each step's rollouts after its update, in rollout order, with priority "
        "(|A| + eps) ** alpha; restore the buffer from the checkpoint's objective state",
    ),
    "replay.draws": (
        "the prioritized-replay uniforms are not keyed by (seed, step, draw): an unseeded draw "
        "or a shared generator",
        "draw u_i from `stream(seed, 'replay', step, i).uniform()`",
    ),
    "replay.weights": (
        "importance weights differ with equal draws: replay beta, the buffer's smallest "
        "priority, or the pow() of another libm",
        "check --replay-beta and --replay-alpha match; compare on one machine",
    ),
    "replay.sample_indices": (
        "the prioritized-replay draw is not keyed by (seed, step): an unseeded draw, a shared "
        "generator, or priorities updated in a different order",
        "draw replay indices from `stream(seed, 'replay', step)` and update priorities in a fixed "
        "order after the step",
    ),
    "rollout.tokens": (
        "model-visible nondeterminism in the environment observation (a timestamp, a temp path, "
        "a hostname, dict/set ordering), or sampling not keyed by (step, prompt, k, position)",
        "make the environment's prompt() a pure function of (row, rng); where the world is "
        "nondeterministic, capture the optimizer batch and replay it (`twinrun explain` / "
        "trainer = 'optimizer_replay')",
    ),
    "rollout.rewards": (
        "the environment's reward is nondeterministic (a timer, a network call, a random judge) "
        "or depends on state carried between calls",
        "make reward(row, completion) a pure function; cache or capture external judgements",
    ),
    "rollout.advantages": (
        "group statistics computed in a different order or precision (mean/std over a group "
        "reduced by a nondeterministic kernel), or the advantage clip differs",
        "normalise advantages in float64 in a fixed order; compare --advantage-clip and "
        "--group-size",
    ),
    "rollout.old_logprobs": (
        "the rollout forward differs: kernels, precision, batch shape or padding side of the "
        "sampling pass",
        "run with --strict and the same --precision/--batch-size; try --batch-invariant",
    ),
    "batch.tokens": (
        "the data changed: a different examples file, tokenizer, chat template or max length",
        "compare the data and model SHA256 in twinrun.json and --chat-template on both runs",
    ),
    "forward.logits": (
        "the forward pass differs with identical inputs: nondeterministic or different kernels, "
        "precision (bf16 vs f32), attention implementation, or batch shape (padding, batch size)",
        "run with --strict on the same device and --precision; keep --batch-size equal or use "
        "--batch-invariant; compare the determinism provenance in twinrun.json",
    ),
    "loss": (
        "the loss reduction differs with identical logits: a different mean/sum order, token "
        "normalisation or objective coefficient (e.g. --beta)",
        "compare the objective flags in twinrun.json; reduce in a fixed order",
    ),
    "grads.lora": (
        "reduction order in the backward pass: nondeterministic kernels (atomics, cuBLAS "
        "workspace), a different thread count, or an all-reduce whose order varies; or, far "
        "apart, gradient clipping on one side only (a checksum of exactly max_norm^2 — 1.0 "
        "for a Trainer's default max_grad_norm — is its sign)",
        "run with --strict (use_deterministic_algorithms, CUBLAS_WORKSPACE_CONFIG) and a fixed "
        "--threads; combine LoRA gradients in a fixed global order across processes; compare "
        "the clipping settings (twinrun clips nothing)",
    ),
    "adam.": (
        "the optimizer state diverged with equal gradients: different betas/eps/weight decay, "
        "a fused vs foreach implementation, or state restored from a different checkpoint",
        "compare the optimizer contract in twinrun.json; resume only from a complete checkpoint",
    ),
    "grads.trainable": (
        "reduction order in the backward pass: nondeterministic kernels (atomics, cuBLAS "
        "workspace), a different thread count, or an all-reduce whose order varies",
        "enable deterministic algorithms (torch.use_deterministic_algorithms, "
        "CUBLAS_WORKSPACE_CONFIG), fix the thread count, and reduce in a fixed order",
    ),
    "params.trainable": (
        "the update differs with equal optimizer state: a different learning rate, gradient "
        "clipping, or a parameter changed outside the optimizer",
        "compare the TrainingArguments (learning_rate, max_grad_norm, scheduler) of the runs",
    ),
    "params.lora": (
        "the update differs with equal optimizer state: a different learning rate, gradient "
        "clipping or a parameter changed outside the optimizer (initialisation, loading)",
        "compare --learning-rate, clipping and the initial adapter SHA256",
    ),
    "lr": (
        "the learning-rate schedule differs: --lr-schedule, --warmup-steps, --decay-steps, total "
        "steps or --epochs are not the same on both runs",
        "diff the `train` section of the two twinrun.json sidecars",
    ),
    "rng.state": (
        "a stray draw from a framework generator (torch.rand, dropout, a library seeding or "
        "sampling behind your back) moved the generator state",
        "seed framework generators only from twinrun's stream, explicitly; find the extra draw "
        "by recording rng.state before and after each stage (--trace-step)",
    ),
    "trace.": (
        "the first module whose output (or gradient) differs at the traced step",
        "look at that module's kernels, precision and inputs; rerun with --strict",
    ),
}

#: Generic advice for a leaf the table does not know.
GENERIC = (
    "a user-registered or unknown leaf diverged first: something upstream of it in the step "
    "differs between the runs",
    "record more leaves before this one (in dataflow order) to narrow it down, and compare the "
    "two twinrun.json sidecars",
)

#: Advice when one run has rows (steps) the other lacks.
MISSING_ROW = (
    "one run recorded steps the other did not: it stopped early, ran a different number of "
    "steps/epochs, or was resumed and re-recorded a step",
    "compare the commands and their step counts; rerun both to completion with --diag",
)

ADVICE: dict[str, Advice] = {k: Advice(k, *v) for k, v in _TABLE.items()}


def advice_for(leaf: str | None) -> Advice:
    """The usual cause of `leaf` diverging first, and the fix. `None` means a missing row."""
    if leaf is None:
        return Advice("(row)", *MISSING_ROW)
    if leaf in ADVICE:
        return ADVICE[leaf]
    if (seen := _OBSERVATION.fullmatch(leaf)) is not None:
        return observation_advice(leaf, seen)
    best = ""
    for key in ADVICE:
        if key.endswith(".") and leaf.startswith(key) and len(key) > len(best):
            best = key
    if best:
        a = ADVICE[best]
        return Advice(leaf, a.cause, a.fix)
    for key in ADVICE:  # e.g. "grads.lora.layers.0.q_proj" -> "grads.lora"
        if leaf.startswith(key + ".") and len(key) > len(best):
            best = key
    if best:
        a = ADVICE[best]
        return Advice(leaf, a.cause, a.fix)
    return Advice(leaf, *GENERIC)


_OBSERVATION = re.compile(r"observation\.prompt_(\d+)(?:\.sample_(\d+))?\.turn_(\d+)")


def observation_advice(leaf: str, seen: re.Match[str]) -> Advice:
    """An observation leaf (`observation.prompt_G[.sample_K].turn_T`) names where the
    environment said something different: which prompt, sample and turn."""
    prompt, sample, turn = seen.group(1), seen.group(2), int(seen.group(3))
    if sample is None:
        where = f"the observation of prompt {prompt} changed"
        what = "the environment's prompt differs"
    elif turn == 0:
        where = f"the observation changed at turn 0 of sample {sample} (prompt {prompt})"
        what = "the episode's first message differs"
    else:
        where = f"the observation changed at turn {turn} of sample {sample} (prompt {prompt})"
        what = "the tool result or the environment's reply differs"
    return Advice(
        leaf,
        f"the environment is not deterministic: {where}; {what}: a timestamp, a path or an id? "
        "(or state carried between rollouts)",
        "make the environment's answers a pure function of the row, its rng and what was said "
        "in the rollout; where the world is nondeterministic, capture the step and replay it "
        "(trainer = 'optimizer_replay')",
    )


# -- step traces ---------------------------------------------------------------------------

_TRACE_STRUCTURE = (
    "the runs did different work at the traced step: a module ran a different number of times "
    "or in another order, or a backward reached an output a different number of times (gradient "
    "accumulation, one backward per row instead of one per batch, gradient checkpointing, or a "
    "code path taken on one side only)",
    "compare the step's control flow (accumulation and batch flags, gradient checkpointing, the "
    "code that calls backward); the entry named is where the two event sequences differ",
)
_TRACE_FORWARD: dict[str, tuple[str, str]] = {
    "lora": (
        "the adapter weights differ going into the step (initialisation, a loaded or resumed "
        "adapter, or an earlier update) — every module before this one agreed",
        "compare params.lora at the previous step and the adapter/init SHA256 in twinrun.json",
    ),
    "input": (
        "the model's first computation differs: its inputs (tokens, padding, attention mask) or "
        "its first weights",
        "compare batch.tokens and the data and model SHA256 in twinrun.json",
    ),
    "norm": (
        "a normalisation differs with equal inputs: precision of its reduction (float32 vs bf16), "
        "eps, or the kernel",
        "run both with the same --precision and --strict on the same device",
    ),
    "attn": (
        "attention differs with equal projections: the attention implementation or kernel "
        "(eager vs SDPA/flash), the mask, or the rotary embedding",
        "use the same attention implementation and --precision; compare padding and batch shape",
    ),
    "other": (
        "this module (or an operation between modules feeding it: a residual add, the rotary "
        "embedding, a cast) computes differently from equal inputs: a matmul kernel, precision, "
        "thread count or batch shape",
        "run with --strict on the same device, --precision and --threads; try --batch-invariant",
    ),
}
_TRACE_BACKWARD_FIRST = (
    "the gradient entering the backward pass differs while the whole forward agreed: the loss "
    "is reduced or backpropagated differently (another normalisation or scale, a different "
    "sum order, one backward call per row or microbatch instead of one per batch)",
    "compare the loss reduction and how backward is called (the `loss` leaf and the objective "
    "flags in twinrun.json); reduce in one fixed order",
)
_TRACE_BACKWARD = (
    "the backward of the next module in the forward order differs for an equal incoming "
    "gradient: a nondeterministic backward kernel (atomics in embedding/scatter/index backward, "
    "split-K matmuls) or precision",
    "run with --strict (deterministic algorithms) and a fixed --threads on the same device",
)
_TRACE_PARAM_GRAD = (
    "the gradient accumulated into this parameter differs while the gradients flowing through "
    "the modules agreed: the weight-gradient reduction order (batched vs per-row backward, the "
    "order of microbatches) or a nondeterministic weight-gradient kernel",
    "call backward once per microbatch in a fixed order, run with --strict and a fixed "
    "--threads; across processes, combine gradients in a fixed global order",
)
_TRACE_FINAL_GRAD = (
    "the gradients changed after the backward and before the optimizer step: clipping, an "
    "all-reduce, or code that edits .grad",
    "check what runs between backward and optimizer.step on both sides",
)
_WITHIN_TOL = (
    " (every entry agrees within the tolerances: this is only where the bits first part, a "
    "difference that later steps amplify)"
)


def _module_class(name: str, first_of_kind: bool) -> str:
    last = name.rsplit(".", 1)[-1]
    if last.startswith("lora_"):
        return "lora"
    if "embed" in last or first_of_kind:
        return "input"
    if "norm" in last:
        return "norm"
    if last in ("self_attn", "attn", "attention") or last.endswith("_attn"):
        return "attn"
    return "other"


def trace_advice(div: Any) -> Advice:
    """The usual cause of two step traces parting at `div` (a TraceDivergence), and the fix."""
    if div.structural:
        cause, fix = _TRACE_STRUCTURE
    elif div.kind == "forward":
        cause, fix = _TRACE_FORWARD[_module_class(div.module, div.first_of_kind)]
    elif div.kind == "backward":
        cause, fix = _TRACE_BACKWARD_FIRST if div.first_of_kind else _TRACE_BACKWARD
    elif div.kind == "param_grad":
        cause, fix = _TRACE_PARAM_GRAD
    else:
        cause, fix = _TRACE_FINAL_GRAD
    if div.within_tol:
        cause += _WITHIN_TOL
    return Advice(div.module, cause, fix)
