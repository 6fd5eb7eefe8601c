"""The run configuration: one dataclass whose fields each carry their `Setting` — flag, TOML key,
kind, range, help, whether required, whether recorded, which objectives — so the flags, a TOML
config, the checks and the sidecar all come from the same declarations.

Every training number is required — none has a silent default — and a command missing several
learns about all of them in one error. What is optional has a stated default that is recorded.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from twinrun.config.setting import (
    INT_LIMIT,
    Kind,
    Setting,
    Source,
    declare,
    settings_of,
)
from twinrun.config.values import targets_problems
from twinrun.core.determinism import ATTENTION_IMPLEMENTATIONS, threads_problem
from twinrun.core.errors import ConfigError
from twinrun.core.portable import MODES, default_mode
from twinrun.core.redact import redact, redact_env_args
from twinrun.objectives.registry import BY_NAME, names, taking

PRECISIONS = ("f32", "bf16")
EPOCHS = names(counts="epochs")  # objectives that count passes over the examples
GRPO = names(samples=True)  # objectives that sample from an environment
TEXT = names(data="corpus")  # objectives that read a plain-text corpus
EXAMPLES = names(reads_examples=True)  # every objective that reads an examples file
STEPS = names(counts="steps")  # objectives that count optimizer steps, not epochs
SCHEDULES = ("cosine", "wsd", "constant", "linear")
CPU_KERNELS = MODES


class Settings(Protocol):
    """A run's settings by name: a `RunConfig` as given, or a validated `ValidRun` (what the
    records are made from, without turning one back into the other)."""

    @property
    def objective(self) -> str: ...

    def value(self, name: str) -> Any:
        """The value of setting `name` (a `RunConfig` field's name; None where not given)."""
        ...


def _s(kind: Kind, flag: str, toml: str, help: str = "", **more: Any) -> Any:
    return declare(Setting(kind=kind, flag=flag, toml=toml, help=help, **more))


@dataclass(kw_only=True, frozen=True)
class RunConfig:
    """Everything that shapes a training run, as given. `None` means "not given". Frozen:
    `validate` (config/resolved.py) checks it and returns the `ValidRun` the run reads."""

    objective: str = _s("str", "", "training.trainer", " | ".join(names()))
    model: str | None = _s(
        "str", "--model", "model.path", "Local Hugging Face checkpoint directory.",
        required=True, shapes=False,
    )  # fmt: skip
    examples: str | None = _s(
        "str", "--examples", "data.examples",
        "Examples: JSONL, a JSON array, CSV; Parquet or a save_to_disk directory (datasets extra).",
        required=True, shapes=False, objectives=EXAMPLES,
    )  # fmt: skip
    output: str | None = _s(
        "str", "--output", "logging.dir", "Run directory to write.", required=True, shapes=False
    )
    defaults: str | None = _s(
        "str", "--defaults", "training.defaults",
        "trl: take every number left out from TRL 1.16's defaults for this trainer (PEFT's "
        "LoraConfig for the adapter, the seed too); printed as a table before the run starts "
        "and recorded in twinrun.json with where each came from. Without it every training "
        "number must be given.",
        choices=("trl",), shapes=False,
    )  # fmt: skip
    seed: int | None = _s(
        "int", "--seed", "training.seed", "Seed in [0, 2**63): fixes the whole run.",
        required=True, low=0, high=INT_LIMIT, high_open=True,
        contract=True,
    )  # fmt: skip
    epochs: int | None = _s(
        "int", "--epochs", "training.epochs", "Passes over the examples.",
        required=True, objectives=EPOCHS, low=1,
    )  # fmt: skip
    batch_size: int | None = _s(
        "int", "--batch-size", "training.batch_size", "Rows per forward.", required=True, low=1,
        contract=True,
    )  # fmt: skip
    accumulation: int | None = _s(
        "int", "--accumulation", "training.accumulation", "Forwards per optimizer step.",
        required=True, objectives=EPOCHS, low=1,
        contract=True,
    )  # fmt: skip
    learning_rate: float | None = _s(
        "float", "--learning-rate", "training.learning_rate", "Peak learning rate (AdamW).",
        required=True, low=0, low_open=True,
        contract=True,
    )  # fmt: skip
    warmup_steps: int | None = _s(
        "int", "--warmup-steps", "training.warmup_steps",
        "Linear warmup steps (then the schedule).", required=True, low=0,
        contract=True,
    )  # fmt: skip
    warmup_ratio: float | None = _s(
        "float", "--warmup-ratio", "training.warmup_ratio",
        "Warm up for this fraction of the run's steps instead of --warmup-steps: "
        "ceil(ratio x steps), transformers' rule (recorded, with the steps it made).",
        low=0, high=1, high_open=True, contract=True,
    )  # fmt: skip
    lr_schedule: str | None = _s(
        "str", "--lr-schedule", "training.lr_schedule",
        "After warmup: cosine (to 0) | wsd (stable, then linear to 0) | constant | linear "
        "(transformers' linear: base * (T - s) / (T - W)).",
        required=True, choices=SCHEDULES,
        contract=True,
    )  # fmt: skip
    decay_steps: int | None = _s(
        "int", "--decay-steps", "training.decay_steps",
        "wsd: the last N steps decay linearly to exactly 0 (wsd only).", low=1,
        contract=True,
    )  # fmt: skip
    max_grad_norm: float | None = _s(
        "float", "--max-grad-norm", "training.max_grad_norm",
        "Clip each step's gradient to this L2 norm (TRL's max_grad_norm; off when left out).",
        low=0, low_open=True, contract=True,
    )  # fmt: skip
    lora_rank: int | None = _s(
        "int", "--lora-rank", "model.lora_rank", "LoRA rank r.", required=True, low=1,
        contract=True,
    )  # fmt: skip
    lora_alpha: float | None = _s(
        "float", "--lora-alpha", "model.lora_alpha", "LoRA alpha (scaling alpha / r).",
        required=True, low=0, low_open=True,
        contract=True,
    )  # fmt: skip
    lora_dropout: float | None = _s(
        "float", "--lora-dropout", "model.lora_dropout",
        "Dropout probability on the LoRA branch's input in training forwards, each mask drawn "
        "from the seed's keyed stream (PEFT's lora_dropout; off when left out).",
        low=0, high=1, high_open=True, contract=True,
    )  # fmt: skip
    precision: str | None = _s(
        "str", "--precision", "training.precision", "f32 | bf16 (f32 casts nothing).",
        required=True, choices=PRECISIONS,
        contract=True,
    )  # fmt: skip
    chat_template: str | None = _s(
        "str", "--chat-template", "model.chat_template", "on | off.",
        required=True, choices=("on", "off"), objectives=EXAMPLES,
    )  # fmt: skip
    messages_loss: str | None = _s(
        "str", "--messages-loss", "data.messages_loss",
        "What a {messages} row trains: assistant (every assistant turn, TRL's "
        "assistant_only_loss=True; the default when left out) | all (every token, TRL's "
        "default). Prompt-completion rows always train their completion.",
        choices=("assistant", "all"), objectives=names(data="examples"),
    )  # fmt: skip
    # objective coefficients
    beta: float | None = _s(
        "float", "--beta", "dpo.beta",
        "Preference temperature beta (> 0): DPO's and SimPO's beta, IPO's tau.",
        required=True, objectives=taking("beta"), low=0, low_open=True,
        contract=True,
    )  # fmt: skip
    gamma: float | None = _s(
        "float", "--gamma", "simpo.gamma",
        "Target reward margin gamma (>= 0) of SimPO's loss -logsigmoid(beta * (chosen - "
        "rejected) - gamma) (TRL's simpo_gamma).",
        required=True, objectives=taking("gamma"), low=0, contract=True,
    )  # fmt: skip
    kl_beta: float | None = _s(
        "float", "--kl-beta", "grpo.kl_beta",
        "GRPO: weight of the KL term against the reference, the base with the adapter off "
        "(TRL's beta; off when left out).",
        objectives=GRPO, low=0, low_open=True, contract=True,
        reason="TRL's beta 0 turns the KL term off; here leave --kl-beta out for that",
    )  # fmt: skip
    # grpo (replaces epochs/accumulation)
    steps: int | None = _s(
        "int", "--steps", "training.max_steps", "Optimizer steps.",
        required=True, objectives=STEPS, low=1,
    )  # fmt: skip
    # text (continued pre-training on raw text)
    corpus: list[str] | None = _s(
        "list[str]", "--corpus", "data.corpus", "Plain UTF-8 text files, in order.",
        required=True, objectives=TEXT, multiple=True, shapes=False,
    )  # fmt: skip
    window: int | None = _s(
        "int", "--window", "text.window", "Tokens per window (one row).",
        required=True, objectives=TEXT, low=2,
        reason="a window predicts its tokens after the first",
    )  # fmt: skip
    windows_per_step: int | None = _s(
        "int", "--windows-per-step", "text.windows_per_step", "Windows per optimizer step.",
        required=True, objectives=TEXT, low=1,
        contract=True,
    )  # fmt: skip
    prompts_per_step: int | None = _s(
        "int", "--prompts-per-step", "grpo.prompts_per_step", "Prompts sampled per step.",
        required=True, objectives=GRPO, low=1,
    )  # fmt: skip
    group_size: int | None = _s(
        "int", "--group-size", "grpo.group_size", "Completions per prompt (>= 2).",
        required=True, objectives=GRPO, low=2, reason="advantages are relative within a group",
    )  # fmt: skip
    max_new_tokens: int | None = _s(
        "int", "--max-new-tokens", "grpo.max_new_tokens", "Completion length limit.",
        required=True, objectives=GRPO, low=1,
    )  # fmt: skip
    temperature: float | None = _s(
        "float", "--temperature", "grpo.temperature", "Sampling temperature (> 0).",
        required=True, objectives=GRPO, low=0, low_open=True, reason="GRPO samples",
        contract=True,
    )  # fmt: skip
    clip_eps: float | None = _s(
        "float", "--clip-eps", "grpo.clip_eps", "PPO clip epsilon, in (0, 1).",
        required=True, objectives=GRPO, low=0, low_open=True, high=1, high_open=True,
        contract=True,
    )  # fmt: skip
    advantage_clip: float | None = _s(
        "float", "--advantage-clip", "grpo.advantage_clip", "Clip advantages to +-this.",
        required=True, objectives=GRPO, low=0, low_open=True,
    )  # fmt: skip
    token_cap: int | None = _s(
        "int", "--token-cap", "grpo.token_cap", "Completion tokens per row in the loss, at most.",
        required=True, objectives=GRPO, low=1,
        contract=True,
    )  # fmt: skip
    rollout_block: int = _s(
        "int", "--rollout-block", "grpo.rollout_block",
        "Prompt groups decoded as one batch: consecutive groups 0..N-1, N..2N-1, ... "
        "(a row's bytes depend on its block; fixed, whatever the process count).",
        objectives=GRPO, default=4, low=1,
    )  # fmt: skip
    env: str | None = _s(
        "str", "--env", "environment.name",
        "arithmetic | clock | math-verify | reasoning_gym:TASK (single-turn) | calculator | "
        "lookup | http://127.0.0.1:PORT (tool environments) | module.path:factory — a plugin "
        "runs with your rights: your own module on the Python path, or a module an installed "
        "distribution declares under the twinrun.environments entry-point group; the standard "
        "library and other installed packages are refused (explain never imports it).",
        required=True, objectives=GRPO,
    )  # fmt: skip
    env_args: dict[str, Any] | None = _s(
        "table", "--env-arg", "environment.args", "KEY=VALUE for a plugin environment.",
        objectives=GRPO, record_for_all=True, multiple=True,
    )  # fmt: skip
    max_turns: int | None = _s(
        "int", "--max-turns", "environment.max_turns",
        "Tool environments: model turns per episode, at most (required for them).",
        objectives=GRPO, low=1,
    )  # fmt: skip
    log_completions: int | None = _s(
        "int", "--log-completions", "logging.log_completions",
        "Write each step's first N rollouts (prompt, turns, tool replies, reward) to "
        "completions.jsonl.",
        objectives=GRPO, low=1, metavar="N",
    )  # fmt: skip
    tool_timeout: float | None = _s(
        "float", "--tool-timeout", "environment.tool_timeout",
        "Tool environments: seconds any one call into the environment may take (required, "
        "at most 86400: one day).",
        objectives=GRPO, low=0, low_open=True, high=86400, shapes=False,
    )  # fmt: skip
    replay: str = _s(
        "str", "--replay", "replay.kind", "none | per.",
        objectives=GRPO, record_for_all=True, default="none", choices=("none", "per"),
    )  # fmt: skip
    replay_capacity: int | None = _s(
        "int", "--replay-capacity", "replay.capacity", "Prioritized replay: buffer size.",
        objectives=GRPO, low=1,
    )  # fmt: skip
    replay_alpha: float | None = _s(
        "float", "--replay-alpha", "replay.alpha", "Prioritized replay: priority exponent.",
        objectives=GRPO, low=0,
    )  # fmt: skip
    replay_beta: float | None = _s(
        "float", "--replay-beta", "replay.beta", "Prioritized replay: importance exponent.",
        objectives=GRPO, low=0, high=1,
    )  # fmt: skip
    replay_fraction: float | None = _s(
        "float", "--replay-fraction", "replay.fraction", "Replayed rows per fresh row.",
        objectives=GRPO, low=0, low_open=True, high=1,
    )  # fmt: skip
    # what the model is built with: stated defaults, recorded resolved
    lora_targets: list[str] | None = _s(
        "targets", "--lora-targets", "model.lora_targets",
        "Modules LoRA adapts: NAMES (comma-separated) or all-linear. "
        "Default: the architecture's attention projections (recorded).",
        metavar="NAMES|all-linear",
        contract=True,
    )  # fmt: skip
    attention: str = _s(
        "str", "--attention", "model.attention", "Attention implementation (recorded).",
        default="eager", choices=ATTENTION_IMPLEMENTATIONS,
        contract=True,
    )  # fmt: skip
    max_length: int | None = _s(
        "int", "--max-length", "training.max_length",
        "Most tokens per row. Default: the model config's max_position_embeddings (recorded).",
        low=1,
    )  # fmt: skip
    # optional switches (defaults are stated, not silent: they are recorded in the sidecar)
    diag: bool = _s(
        "bool", "--diag", "logging.diag", "Write diag.jsonl (per-step checksums).", default=False
    )
    trace_step: int | None = _s(
        "int", "--trace-step", "logging.trace_step",
        "Also record per-module checksums at step K.", low=0,
    )  # fmt: skip
    eval_examples: str | None = _s(
        "str", "--eval-examples", "eval.examples",
        "Evaluate on these SFT examples during training (with --eval-every).", shapes=False,
    )  # fmt: skip
    eval_every: int | None = _s(
        "int", "--eval-every", "eval.every", "Evaluate after every N-th optimizer step.", low=1
    )
    eval_limit: int | None = _s(
        "int", "--eval-limit", "eval.limit", "Evaluate only the first N eval examples.", low=1
    )
    inject: list[str] = _s(
        "list[str]", "--inject", "debug.inject", "Plant a fault: FAULT@STEP (testing).",
        default=[], multiple=True,
        contract=True,
    )  # fmt: skip
    threads: int | None = _s(
        "int", "--threads", "backend.options.threads",
        "torch threads (recorded; torch's default when left out). Required with --cpu-kernels "
        "native, where the count shapes the bytes. At most max(256, this machine's cores).", low=1,
        contract=True,
    )  # fmt: skip
    device: str = _s(
        "str", "--device", "backend.devices",
        "cpu | cuda | cuda:N (cuda is cuda:0 on one process, cuda:LOCAL_RANK under torchrun).",
        default="cpu", contract=True,
    )  # fmt: skip
    cpu_kernels: str = _s(
        "str", "--cpu-kernels", "backend.options.cpu_kernels",
        "native: the machine's own kernels, fast, bytes of this CPU kind and thread count only; "
        "portable: the same bytes on every x86-64 CPU and thread count (exact matrix products, "
        "own transcendental functions, AVX2 kernels), several times slower. Default: native, "
        "or TWINRUN_CPU_KERNELS.",
        default=default_mode(), choices=CPU_KERNELS,
        contract=True,
    )  # fmt: skip
    strict: bool = _s(
        "bool", "--strict/--no-strict", "backend.options.strict_deterministic",
        "Strict deterministic mode.", default=True,
        contract=True,
    )  # fmt: skip
    batch_invariant: bool = _s(
        "bool", "--batch-invariant", "backend.options.batch_invariant",
        "Row results independent of batch.", default=False,
        contract=True,
    )  # fmt: skip
    stop_after: int | None = _s(
        "int", "--stop-after", "training.stop_after",
        "Run only the first N steps of the planned run (its schedule unchanged).", low=1,
    )  # fmt: skip
    checkpoint_every: int | None = _s(
        "int", "--checkpoint-every", "training.save_every",
        "Write a checkpoint every N steps (0: none).", low=0,
    )  # fmt: skip
    resume: bool = _s(
        "bool", "--resume", "", "Continue --output from its newest checkpoint.",
        default=False, shapes=False,
    )  # fmt: skip
    prefetch: int = _s(
        "int", "--prefetch", "data.prefetch", "Batches prepared ahead on a background thread.",
        default=0, low=0,
    )  # fmt: skip
    spike_factor: float | None = _s(
        "float", "--spike-factor", "debug.spike_factor",
        "Rerun a step whose loss > F x median.", low=1, low_open=True,
    )  # fmt: skip
    spike_window: int | None = _s(
        "int", "--spike-window", "debug.spike_window", "Steps in the spike median.", low=1
    )
    init_adapter: str | None = _s(
        "str", "--init-adapter", "resume.from", "Start from this adapter (init-adapter)."
    )
    capture: bool = _s("bool", "", "optimizer_batch.capture", "Capture optimizer batches.",
                        default=False)  # fmt: skip
    capture_steps: list[int] | None = _s("list[int]", "", "optimizer_batch.capture_steps",
        "Steps to capture (default: every step).", low=0,
    )  # fmt: skip
    gradient_checkpointing: bool = _s(
        "bool",
        "--gradient-checkpointing",
        "backend.options.gradient_checkpointing",
        "Recompute each decoder layer's activations in backward (same bytes, less memory).",
        default=False,
        contract=True,
    )
    shard_base: bool = _s(
        "bool", "--shard-base", "backend.options.shard_base",
        "Shard the frozen base with FSDP2 across torchrun's processes (same bytes).",
        default=False, shapes=False,
    )  # fmt: skip
    overwrite: bool = _s(
        "bool", "--overwrite", "", "Replace a run directory twinrun wrote (refuses other files).",
        default=False, shapes=False,
    )  # fmt: skip
    quiet: bool = _s("bool", "--quiet", "", "No progress output.", default=False, shapes=False)
    report_to: list[str] = _s(
        "list[str]", "--report-to", "logging.report_to",
        "Also log each step's metrics to tensorboard | wandb | mlflow, offline, under --output "
        "(comma-separated or repeated; TOML: a list). Needs that package; never changes a byte.",
        default=[], multiple=True, shapes=False, metavar="NAMES",
    )  # fmt: skip
    # fixed optimizer numbers: recorded so the sidecar is the whole record
    weight_decay: float = _s("float", "", "optimizer.weight_decay", "AdamW weight decay.",
                             default=0.0, low=0, contract=True)  # fmt: skip
    adam_betas: tuple[float, float] = _s(
        "pair", "", "optimizer.betas", "AdamW betas.",
        default=(0.9, 0.999), low=0, high=1, high_open=True,
        contract=True,
    )  # fmt: skip
    adam_eps: float = _s("float", "", "optimizer.eps", "AdamW epsilon.", default=1e-8,
                        low=0, low_open=True, contract=True)  # fmt: skip

    taken: tuple[str, ...] = ()
    """The settings whose values were taken from `defaults` (config/trl_defaults.py), in the
    order they were taken: not a setting of its own, but the record of where numbers came from."""

    def __post_init__(self) -> None:
        if self.inject is None:
            self.inject = []

    def value(self, name: str) -> Any:
        """The value of setting `name` (`Settings`)."""
        return getattr(self, name)


SETTINGS: dict[str, Setting] = settings_of(RunConfig)
REPLAY_FIELDS = ("replay_capacity", "replay_alpha", "replay_beta", "replay_fraction")


def setting(name: str) -> Setting:
    return SETTINGS[name]


def required_fields(objective: str) -> list[str]:
    """The fields a run of `objective` must be given (every one is a training number)."""
    return [n for n, s in SETTINGS.items() if s.required and objective in s.objectives]


def applies(name: str, objective: str) -> bool:
    return objective in SETTINGS[name].objectives


# --report-to: backend -> (the module train/hooks/report.py imports, the package providing it)
REPORT_BACKENDS: dict[str, tuple[str, str]] = {
    "tensorboard": ("torch.utils.tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"),
}
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9_-]{1,20}$")  # a mistyped name is shown, nothing else


def report_backends(values: Iterable[str]) -> list[str]:
    """The backends `--report-to a,b` (or repeated, or a TOML list) names, in order, once each."""
    names = [name.strip() for value in values for name in value.split(",")]
    return list(dict.fromkeys(name for name in names if name))


def _installed(module: str, package: str) -> bool:
    """Whether `module` can be imported, without importing it (None in sys.modules blocks it)."""
    for name in (module, package):
        if name in sys.modules:
            return sys.modules[name] is not None
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def check_report_to(values: Iterable[str], name: str = "--report-to") -> list[str]:
    """The backends `values` names; one-line ConfigError for an unknown one or one whose optional
    package is not installed (checked when the run is validated: before anything is written)."""
    backends = report_backends(values)
    for backend in backends:
        if backend not in REPORT_BACKENDS:
            shown = f" {backend!r}" if _PLAIN_NAME.match(backend) else ""
            raise ConfigError(
                f"{name}: unknown backend{shown}",
                f"choose from {', '.join(REPORT_BACKENDS)} (comma-separated or repeated)",
            )
        module, package = REPORT_BACKENDS[backend]
        if not _installed(module, package):
            raise ConfigError(
                f"{name} {backend} needs the {package} package, which is not installed",
                f"pip install {package} (or leave {name} out)",
            )
    return backends


def value_problems(cfg: RunConfig, source: Source = "flag") -> list[str]:
    """Each given value against its declaration, then the rules that join two settings."""
    problems = [p for name in SETTINGS if (p := _given_problem(cfg, name, source)) is not None]
    if cfg.lora_targets is not None:
        problems += targets_problems(cfg.lora_targets, SETTINGS["lora_targets"].name(source))
    return problems + _joint_problems(cfg, source)


def _given_problem(cfg: RunConfig, name: str, source: Source) -> str | None:
    """What is wrong with the value given for `name` (None when none is given, or it is fine):
    a setting that does not apply to the objective, else the declaration's own checks."""
    s, value = SETTINGS[name], getattr(cfg, name)
    if value is None or name == "objective":
        return None
    if cfg.objective not in s.objectives:
        return f"{s.name(source)} does not apply to {cfg.objective}" if value != s.default else None
    if (p := s.problem(value, source)) is not None:
        return p
    if name == "threads":  # before any thread pool: flags, TOML and sidecars alike
        return threads_problem(value, s.name(source))
    return None


def _joint_problems(cfg: RunConfig, source: Source) -> list[str]:
    """The rules that join two settings."""
    n = {k: s.name(source) for k, s in SETTINGS.items()}
    rules = (
        (
            bool(cfg.prefetch and BY_NAME[cfg.objective].samples),
            f"{n['prefetch']} does not apply to {cfg.objective} "
            "(its next batch is sampled from the updated policy)",
        ),
        (
            cfg.replay != "per" and any(spec.startswith("replay@") for spec in cfg.inject or []),
            f"{n['inject']} replay@STEP needs {n['replay']} per",
        ),
        (
            cfg.decay_steps is not None and cfg.lr_schedule not in (None, "wsd"),
            f"{n['decay_steps']} applies to {n['lr_schedule']} wsd only",
        ),
        (
            (cfg.eval_examples is None) != (cfg.eval_every is None),
            f"{n['eval_examples']} and {n['eval_every']} go together",
        ),
        (
            cfg.eval_limit is not None and cfg.eval_examples is None,
            f"{n['eval_limit']} needs {n['eval_examples']}",
        ),
        (
            (cfg.spike_factor is None) != (cfg.spike_window is None),
            f"{n['spike_factor']} and {n['spike_window']} go together",
        ),
    )
    return [message for broken, message in rules if broken]


# settings added after runs were first recorded: absent from the sidecar (and the optimizer
# contract) when left out, so a run or capture recorded before they existed still compares equal
RECORDED_WHEN_GIVEN = (
    "max_turns", "max_grad_norm", "kl_beta", "lora_dropout", "messages_loss", "warmup_ratio"
)  # fmt: skip


def shaping_numbers(cfg: Settings, resolved: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every setting that shaped the run, as recorded in the sidecar's `train` section.

    `resolved` holds what the model builder decided for settings left at "from the model"
    (`lora_targets`, `max_length`): those values are recorded instead of None. `lora_targets` is
    always recorded as resolved — the sorted names the LoRA layers wrap — so `all-linear` and
    any order of the same names record the same run."""
    out: dict[str, Any] = {}
    for name, s in SETTINGS.items():
        if not s.shapes or not (cfg.objective in s.objectives or s.record_for_all):
            continue
        if name in REPLAY_FIELDS and cfg.value("replay") != "per":
            continue
        value = cfg.value(name)
        if name in RECORDED_WHEN_GIVEN and value is None:
            continue  # off: runs recorded before the setting existed agree
        if resolved is not None and name in resolved and (value is None or name == "lora_targets"):
            value = resolved[name]
        out[name] = list(value) if isinstance(value, tuple) else value
    if "env_args" in out:
        out["env_args"] = redact_env_args(out["env_args"])
    return redact(out)


def fields_meta() -> dict[str, Setting]:
    """Field name -> its declaration (kept for callers of the older name)."""
    return dict(SETTINGS)


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
    **more: Any,
) -> list[str]:
    """The checks every command shares (batch size, precision, chat template, and any other run
    setting passed by field name, e.g. `threads=`, `seed=`), from the run settings' declarations."""
    values = {"batch_size": batch_size, "precision": precision, "chat_template": chat_template}
    problems = []
    for name, value in (values | more).items():
        if value is not None or name in ("precision", "chat_template"):
            s = SETTINGS[name]
            problem = s.problem(value, "flag") if value is not None else None
            if value is None:
                problem = f"{s.option} must be {' or '.join(s.choices)}"
            if problem is not None:
                problems.append(problem)
    return problems
