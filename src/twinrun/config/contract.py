"""The optimizer contract: every setting that decides what one optimizer update does to the
adapter, given the batch — as flat TOML-keyed values, so two contracts diff key by key.

It holds the optimizer (AdamW and its numbers, the learning rate, warmup and schedule), the
model (base weights SHA256, LoRA shape, precision), the objective's own coefficients, the forward
split (`batch_size`, `accumulation`, or a text run's `windows_per_step`), the seed, and the
backend (device, strict mode, threads, CPU kernels, batch-invariant mode, gradient
checkpointing). It leaves out what only chose the rows (examples, corpus, environment,
sampling numbers): the logical digest pins those.

A replay's contract must equal its source's, except for keys it declares in
`allow_config_differences` — and v1 allows only `backend.options.gradient_checkpointing`. An
undeclared difference fails; so does a declared difference that is not there (a stale allowlist
must not weaken the gate).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twinrun.config.run import RECORDED_WHEN_GIVEN, SETTINGS, Settings, applies
from twinrun.core.digest import canonical_json

V1_ALLOWED_DIFFERENCES = ("backend.options.gradient_checkpointing",)
BY_TOML = {s.toml: name for name, s in SETTINGS.items() if s.toml}  # TOML key -> config field

# how a contract setting's value is written (numbers that may be given as integers are floats)
_AS_WRITTEN: dict[str, Callable[[Any], Any]] = {
    "lora_alpha": lambda v: None if v is None else float(v),
    "lora_dropout": float,
    "adam_betas": lambda v: [float(b) for b in v],
    "adam_eps": float,
    "weight_decay": float,
    "inject": list,
}


def contract_settings(objective: str) -> tuple[str, ...]:
    """The config fields in `objective`'s contract: every setting declared `contract=True` that
    applies to it, in declaration order."""
    return tuple(n for n, s in SETTINGS.items() if s.contract and applies(n, objective))


def optimizer_contract(
    cfg: Settings,
    objective: str,
    model_sha256: str,
    lora_targets: list[str],
    engine: str = "pytorch",
) -> dict[str, Any]:
    """The contract of a run whose LoRA layers wrap `lora_targets` (as resolved for the model:
    the source's from its model, a replay's from the adapter it starts from). Its keys are the
    contract settings' TOML keys, and what no setting holds: the objective, the base weights'
    SHA256, the optimizer's name and the inference engine."""
    c: dict[str, Any] = {
        "training.objective": objective,
        "model.sha256": model_sha256,
        "optimizer.name": "adamw",
        "inference.engine": engine,
    }
    for name in contract_settings(objective):
        value = cfg.value(name)
        if value is None and name in RECORDED_WHEN_GIVEN:
            continue  # off: a capture made before the setting existed has no key either
        c[SETTINGS[name].toml] = _AS_WRITTEN.get(name, lambda v: v)(value)
    c["model.lora_targets"] = sorted(lora_targets)  # as resolved, not as given
    return c


ABSENT = object()


def _same(a: Any, b: Any) -> bool:
    if a is ABSENT or b is ABSENT:
        return a is b
    return canonical_json(a) == canonical_json(b)


def contract_diff(source: dict[str, Any], replay: dict[str, Any]) -> list[str]:
    """Keys whose values differ (a key one side lacks differs), sorted."""
    keys = sorted(set(source) | set(replay))
    return [k for k in keys if not _same(source.get(k, ABSENT), replay.get(k, ABSENT))]


def _show(value: Any) -> str:
    return "absent" if value is ABSENT else canonical_json(value).decode()


def allowlist_problems(
    source: dict[str, Any],
    replay: dict[str, Any],
    declared: list[str],
    allowed: tuple[str, ...] = V1_ALLOWED_DIFFERENCES,
) -> list[str]:
    """Every way the observed differences break the declared allowlist."""
    observed = contract_diff(source, replay)
    problems = [
        f"{k} may not differ in v1 (allowed: {', '.join(allowed)})"
        for k in declared
        if k not in allowed
    ]
    for k in observed:
        if k not in declared:
            src, rep = _show(source.get(k, ABSENT)), _show(replay.get(k, ABSENT))
            problems.append(f"undeclared difference {k}: source {src}, replay {rep}")
    for k in declared:
        if k in allowed and k not in observed:
            problems.append(
                f"declared difference {k} is not present (both {_show(source.get(k, ABSENT))})"
            )
    return problems
