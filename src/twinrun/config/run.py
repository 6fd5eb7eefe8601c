"""The run configuration: one dataclass whose fields each name their flag and their TOML key, so
flags, a TOML config and the sidecar all map to the same tree.

Every training number is required — none has a silent default — and a command missing several
learns about all of them in one error.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from twinrun.core.errors import ConfigError
from twinrun.core.redact import redact, redact_env_args

OBJECTIVES = ("sft", "dpo", "reward", "grpo")
PRECISIONS = ("f32", "bf16")


def _f(flag: str, toml: str, required: bool = True, default: Any = None, doc: str = "") -> Any:
    return field(
        default=default, metadata={"flag": flag, "toml": toml, "required": required, "doc": doc}
    )


@dataclass(kw_only=True)
class RunConfig:
    """Everything that shapes a training run. `None` means "not given"."""

    objective: str = _f("", "training.trainer", doc="sft | dpo | reward | grpo")
    model: str | None = _f("--model", "model.path", doc="local HF checkpoint directory")
    examples: str | None = _f("--examples", "data.examples", doc="JSONL or JSON array")
    output: str | None = _f("--output", "logging.dir", doc="run directory")
    seed: int | None = _f("--seed", "training.seed")
    epochs: int | None = _f("--epochs", "training.epochs", required=False)
    batch_size: int | None = _f("--batch-size", "training.batch_size", doc="rows per forward")
    accumulation: int | None = _f("--accumulation", "training.accumulation", required=False)
    learning_rate: float | None = _f("--learning-rate", "training.learning_rate")
    warmup_steps: int | None = _f("--warmup-steps", "training.warmup_steps")
    lora_rank: int | None = _f("--lora-rank", "model.lora_rank")
    lora_alpha: float | None = _f("--lora-alpha", "model.lora_alpha")
    precision: str | None = _f("--precision", "training.precision", doc="f32 | bf16")
    chat_template: str | None = _f("--chat-template", "model.chat_template", doc="on | off")
    # objective coefficients
    beta: float | None = _f("--beta", "dpo.beta", required=False)
    # grpo (replaces epochs/accumulation)
    steps: int | None = _f("--steps", "training.max_steps", required=False)
    prompts_per_step: int | None = _f("--prompts-per-step", "grpo.prompts_per_step", False)
    group_size: int | None = _f("--group-size", "grpo.group_size", required=False)
    max_new_tokens: int | None = _f("--max-new-tokens", "grpo.max_new_tokens", required=False)
    temperature: float | None = _f("--temperature", "grpo.temperature", required=False)
    clip_eps: float | None = _f("--clip-eps", "grpo.clip_eps", required=False)
    advantage_clip: float | None = _f("--advantage-clip", "grpo.advantage_clip", False)
    token_cap: int | None = _f("--token-cap", "grpo.token_cap", required=False)
    env: str | None = _f("--env", "environment.name", required=False)
    env_args: dict[str, Any] | None = _f("--env-arg", "environment.args", required=False)
    replay: str = _f("--replay", "replay.kind", required=False, default="none")
    replay_capacity: int | None = _f("--replay-capacity", "replay.capacity", False)
    replay_alpha: float | None = _f("--replay-alpha", "replay.alpha", required=False)
    replay_beta: float | None = _f("--replay-beta", "replay.beta", required=False)
    replay_fraction: float | None = _f("--replay-fraction", "replay.fraction", False)
    # optional switches (defaults are stated, not silent: they are recorded in the sidecar)
    diag: bool = _f("--diag", "logging.diag", required=False, default=False)
    trace_step: int | None = _f("--trace-step", "logging.trace_step", required=False)
    inject: list[str] = _f("--inject", "debug.inject", required=False, default=None)
    threads: int | None = _f("--threads", "backend.options.threads", required=False)
    device: str = _f("--device", "backend.devices", required=False, default="cpu")
    strict: bool = _f(
        "--strict/--no-strict", "backend.options.strict_deterministic", required=False, default=True
    )
    batch_invariant: bool = _f(
        "--batch-invariant", "backend.options.batch_invariant", required=False, default=False
    )
    checkpoint_every: int | None = _f("--checkpoint-every", "training.save_every", False)
    resume: bool = _f("--resume", "", required=False, default=False)
    prefetch: int = _f("--prefetch", "data.prefetch", required=False, default=0)
    spike_factor: float | None = _f("--spike-factor", "debug.spike_factor", required=False)
    spike_window: int | None = _f("--spike-window", "debug.spike_window", required=False)
    init_adapter: str | None = _f("--init-adapter", "resume.from", required=False)
    capture: bool = _f("", "optimizer_batch.capture", required=False, default=False)
    capture_steps: list[int] | None = _f("", "optimizer_batch.capture_steps", required=False)
    gradient_checkpointing: bool = _f(
        "", "backend.options.gradient_checkpointing", required=False, default=False
    )
    overwrite: bool = _f("--overwrite", "", required=False, default=False)
    quiet: bool = _f("--quiet", "", required=False, default=False)
    # fixed optimizer numbers: recorded so the sidecar is the whole record
    weight_decay: float = field(default=0.0, metadata={"toml": "optimizer.weight_decay"})
    adam_betas: tuple[float, float] = field(
        default=(0.9, 0.999), metadata={"toml": "optimizer.betas"}
    )
    adam_eps: float = field(default=1e-8, metadata={"toml": "optimizer.eps"})

    def __post_init__(self) -> None:
        if self.inject is None:
            self.inject = []


GRPO_FIELDS = (
    "steps",
    "prompts_per_step",
    "group_size",
    "max_new_tokens",
    "temperature",
    "clip_eps",
    "advantage_clip",
    "token_cap",
    "env",
)
REPLAY_FIELDS = ("replay_capacity", "replay_alpha", "replay_beta", "replay_fraction")
EPOCH_FIELDS = ("epochs", "accumulation")
REQUIRED_BY_OBJECTIVE: dict[str, tuple[str, ...]] = {
    "sft": EPOCH_FIELDS,
    "dpo": (*EPOCH_FIELDS, "beta"),
    "reward": EPOCH_FIELDS,
    "grpo": GRPO_FIELDS,
}
NOT_FOR: dict[str, tuple[str, ...]] = {
    "sft": ("beta", *GRPO_FIELDS),
    "dpo": GRPO_FIELDS,
    "reward": ("beta", *GRPO_FIELDS),
    "grpo": ("beta", *EPOCH_FIELDS),
}


def fields_meta() -> dict[str, dict[str, Any]]:
    return {f.name: dict(f.metadata) for f in dataclasses.fields(RunConfig)}


def validate(cfg: RunConfig) -> None:
    """Every problem at once: missing numbers first, then bad values."""
    meta = fields_meta()
    by_objective = REQUIRED_BY_OBJECTIVE.get(cfg.objective, ())
    missing = [
        m["flag"]
        for name, m in meta.items()
        if (m.get("required") or name in by_objective)
        and m.get("flag")
        and getattr(cfg, name) is None
    ]
    if missing:
        raise ConfigError(
            f"missing required {'flag' if len(missing) == 1 else 'flags'}: {' '.join(missing)}",
            "every training number must be given (twinrun has no silent defaults)",
        )
    problems: list[str] = []
    for name in NOT_FOR.get(cfg.objective, ()):
        if getattr(cfg, name) is not None:
            problems.append(f"{meta[name]['flag']} does not apply to {cfg.objective}")
    if cfg.replay == "per":
        missing = [meta[n]["flag"] for n in REPLAY_FIELDS if getattr(cfg, n) is None]
        if missing:
            raise ConfigError(
                f"--replay per needs {' '.join(missing)}",
                "every replay number must be given",
            )
    assert cfg.seed is not None
    if not 0 <= cfg.seed < 2**63:
        problems.append(f"--seed must be in [0, 2**63), got {cfg.seed}")
    positive = (
        "epochs",
        "batch_size",
        "accumulation",
        "lora_rank",
        "steps",
        "prompts_per_step",
        "group_size",
        "max_new_tokens",
        "token_cap",
        "replay_capacity",
    )
    for name in positive:
        value = getattr(cfg, name)
        if value is not None and value < 1:
            problems.append(f"{meta[name]['flag']} must be >= 1, got {value}")
    if cfg.objective == "grpo":
        problems += grpo_problems(cfg)
    if cfg.warmup_steps is not None and cfg.warmup_steps < 0:
        problems.append(f"--warmup-steps must be >= 0, got {cfg.warmup_steps}")
    if not (cfg.learning_rate or 0) > 0:
        problems.append(f"--learning-rate must be > 0, got {cfg.learning_rate}")
    if not (cfg.lora_alpha or 0) > 0:
        problems.append(f"--lora-alpha must be > 0, got {cfg.lora_alpha}")
    problems += common_problems(precision=cfg.precision, chat_template=cfg.chat_template)
    if cfg.beta is not None and not cfg.beta > 0:
        problems.append(f"--beta must be > 0, got {cfg.beta}")
    if cfg.threads is not None and cfg.threads < 1:
        problems.append(f"--threads must be >= 1, got {cfg.threads}")
    if cfg.trace_step is not None and cfg.trace_step < 0:
        problems.append(f"--trace-step must be >= 0, got {cfg.trace_step}")
    if cfg.checkpoint_every is not None and cfg.checkpoint_every < 0:
        problems.append(f"--checkpoint-every must be >= 0, got {cfg.checkpoint_every}")
    if cfg.prefetch < 0:
        problems.append(f"--prefetch must be >= 0, got {cfg.prefetch}")
    if cfg.prefetch > 0 and cfg.objective == "grpo":
        problems.append(
            "--prefetch does not apply to grpo (its next batch is sampled from the updated policy)"
        )
    if (cfg.spike_factor is None) != (cfg.spike_window is None):
        problems.append("--spike-factor and --spike-window go together")
    if cfg.spike_factor is not None and not cfg.spike_factor > 1:
        problems.append(f"--spike-factor must be > 1, got {cfg.spike_factor}")
    if cfg.spike_window is not None and cfg.spike_window < 1:
        problems.append(f"--spike-window must be >= 1, got {cfg.spike_window}")
    if problems:
        raise ConfigError("; ".join(problems))


def grpo_problems(cfg: RunConfig) -> list[str]:
    problems = []
    if cfg.group_size is not None and cfg.group_size < 2:
        problems.append("--group-size must be >= 2 (advantages are relative within a group)")
    if cfg.temperature is not None and not cfg.temperature > 0:
        problems.append(f"--temperature must be > 0 (GRPO samples), got {cfg.temperature}")
    if cfg.clip_eps is not None and not 0 < cfg.clip_eps < 1:
        problems.append(f"--clip-eps must be in (0, 1), got {cfg.clip_eps}")
    if cfg.advantage_clip is not None and not cfg.advantage_clip > 0:
        problems.append(f"--advantage-clip must be > 0, got {cfg.advantage_clip}")
    if cfg.replay not in ("none", "per"):
        problems.append(f"--replay must be none or per, got {cfg.replay!r}")
    if cfg.replay_fraction is not None and not 0 < cfg.replay_fraction <= 1:
        problems.append(f"--replay-fraction must be in (0, 1], got {cfg.replay_fraction}")
    if cfg.replay_alpha is not None and not cfg.replay_alpha >= 0:
        problems.append(f"--replay-alpha must be >= 0, got {cfg.replay_alpha}")
    if cfg.replay_beta is not None and not 0 <= cfg.replay_beta <= 1:
        problems.append(f"--replay-beta must be in [0, 1], got {cfg.replay_beta}")
    return problems


def shaping_numbers(cfg: RunConfig) -> dict[str, Any]:
    """Every number that shaped the run, as recorded in the sidecar's `train` section."""
    skip = {"model", "examples", "output", "overwrite", "quiet", "resume"}
    not_for = set(NOT_FOR.get(cfg.objective, ()))
    if cfg.replay != "per":
        not_for |= set(REPLAY_FIELDS)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(RunConfig):
        if f.name in skip or f.name in not_for:
            continue
        value = getattr(cfg, f.name)
        out[f.name] = list(value) if isinstance(value, tuple) else value
    if "env_args" in out:
        out["env_args"] = redact_env_args(out["env_args"])
    return redact(out)


def require_flags(flags: dict[str, Any], command: str) -> None:
    """One error naming every flag of `flags` whose value is None."""
    missing = [flag for flag, value in flags.items() if value is None]
    if missing:
        raise ConfigError(
            f"missing required {'flag' if len(missing) == 1 else 'flags'}: {' '.join(missing)}",
            f"{command} needs every one of them",
        )


def common_problems(
    *,
    batch_size: int | None = None,
    precision: str | None = "f32",
    chat_template: str | None = "on",
) -> list[str]:
    """The checks every command shares: batch size, precision, chat template."""
    problems = []
    if batch_size is not None and batch_size < 1:
        problems.append(f"--batch-size must be >= 1, got {batch_size}")
    if precision not in PRECISIONS:
        problems.append(f"--precision must be f32 or bf16, got {precision!r}")
    if chat_template not in ("on", "off"):
        problems.append(f"--chat-template must be on or off, got {chat_template!r}")
    return problems
