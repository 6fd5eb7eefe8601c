"""Which modules LoRA wraps, known without building a model (no torch): an architecture's
default targets (its attention projections) and how `--lora-targets` is read."""

from __future__ import annotations

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
# The attention projections of architectures whose names differ from the default.
ARCHITECTURE_TARGETS: dict[str, tuple[str, ...]] = {
    "phi3": ("qkv_proj", "o_proj"),
    "phi": ("q_proj", "k_proj", "v_proj", "dense"),
    "gpt2": ("c_attn", "c_proj"),
    "gpt_neox": ("query_key_value", "dense"),
    "falcon": ("query_key_value", "dense"),
}
ALL_LINEAR = "all-linear"


def default_targets(model_type: str) -> tuple[str, ...]:
    """The LoRA targets of an architecture when `--lora-targets` is not given."""
    return ARCHITECTURE_TARGETS.get(model_type, DEFAULT_TARGETS)


def declared_targets(spec: str | None, model_type: str) -> list[str]:
    """What a run's `--lora-targets` says, before any model exists: the architecture's default
    (None), `["all-linear"]`, or the sorted names given."""
    if spec is None:
        return sorted(default_targets(model_type))
    if spec == ALL_LINEAR:
        return [ALL_LINEAR]
    return sorted({n.strip() for n in spec.split(",") if n.strip()})
