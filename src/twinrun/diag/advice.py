"""What usually makes a leaf diverge first, and what to do about it.

`advice_for(leaf)` looks the leaf up by exact name, then by its prefix (`adam.exp_avg_sq` →
`adam.`; `trace.forward.layers.0` → `trace.`), and falls back to generic advice. The table is
written for the *first* diverging leaf: everything downstream of it diverges as a consequence.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ADVICE", "Advice", "GENERIC", "MISSING_ROW", "advice_for"]


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
        "workspace), a different thread count, or an all-reduce whose order varies",
        "run with --strict (use_deterministic_algorithms, CUBLAS_WORKSPACE_CONFIG) and a fixed "
        "--threads; combine LoRA gradients in a fixed global order across processes",
    ),
    "adam.": (
        "the optimizer state diverged with equal gradients: different betas/eps/weight decay, "
        "a fused vs foreach implementation, or state restored from a different checkpoint",
        "compare the optimizer contract in twinrun.json; resume only from a complete checkpoint",
    ),
    "params.lora": (
        "the update differs with equal optimizer state: a different learning rate, gradient "
        "clipping or a parameter changed outside the optimizer (initialisation, loading)",
        "compare --learning-rate, clipping and the initial adapter SHA256",
    ),
    "lr": (
        "the learning-rate schedule differs: --warmup-steps, total steps, --epochs or the "
        "schedule flags are not the same on both runs",
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
