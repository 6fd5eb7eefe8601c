"""A run as the code that runs it reads it: `validate` checks a `RunConfig` and returns a
`ValidRun`, a frozen value whose numbers are their declared types (no `None` left to check).

The numbers every run has are fields (`run.seed`, `run.learning_rate`, ...). The numbers only
some objectives have are small frozen records that exist exactly when the run uses them — which
objectives use a setting is its declaration's (config/run.py), read from the objective records
(objectives/registry.py), so no objective is named here: an examples file, an epoch plan or a
step count, the preference temperature and target margin, GRPO's rollouts and policy update, a
text run's windows, the prioritized replay buffer, evaluation during training. A recipe reads
its record with `run.record(Kind)`; a record a run does not have is a bug in twinrun (validation
gave it to every run that reads it), so asking for one fails loudly as an internal error, never
as the user's.

A replay (`trainer = "optimizer_replay"`) names its `ReplayPins` when it is loaded, and is
resolved by `replay_run` once its optimizer contract equals its source's: the contract pins the
settings declared `contract=True` that apply to the objective, so a replay has the records its
update reads and none that choose rows.

The switches and optional settings every run has, at their stated defaults when left out, are
typed records too, one field of the run each: `run.backend` (device, threads, CPU kernels,
strict and batch-invariant modes, gradient checkpointing, a sharded base), `run.build` (LoRA
targets and dropout, attention, row length, the adapter it starts from), `run.optimizer` (AdamW's
fixed numbers, gradient clipping, wsd's decay), `run.sampling` (GRPO's options) and
`run.switches` (what the run writes and how it goes: diag, trace, checkpoints, resume, faults,
...). `None` is left only where "not given" is a stated state (clipping off, torch's thread
count, the model's own positions). What records a run — the sidecar, the optimizer contract, the
capture manifest, the processes' agreement — reads its settings back as a `RunConfig`
(`as_config`); the code that runs it reads the typed values.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

from twinrun.config.run import (
    REPLAY_FIELDS,
    SETTINGS,
    RunConfig,
    applies,
    check_report_to,
    required_fields,
    value_problems,
)
from twinrun.config.setting import OBJECTIVES, Source
from twinrun.core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Examples:
    """The examples file a run reads, and whether its rows go through the chat template."""

    examples: str
    chat_template: str

    @property
    def templated(self) -> bool:
        return self.chat_template == "on"


@dataclass(frozen=True, slots=True)
class EpochPlan:
    """A run counted in passes over its examples, `accumulation` forwards per step."""

    epochs: int
    accumulation: int


@dataclass(frozen=True, slots=True)
class StepCount:
    """A run counted in optimizer steps."""

    steps: int


@dataclass(frozen=True, slots=True)
class Preference:
    """The preference loss's temperature."""

    beta: float


@dataclass(frozen=True, slots=True)
class Margin:
    """A preference loss's target reward margin (SimPO's gamma)."""

    gamma: float


@dataclass(frozen=True, slots=True)
class Rollouts:
    """What a sampling run draws each step: prompts, completions per prompt, their length, the
    advantages' clip, and the environment that scores them."""

    prompts_per_step: int
    group_size: int
    max_new_tokens: int
    advantage_clip: float
    env: str


@dataclass(frozen=True, slots=True)
class PolicyUpdate:
    """The clipped policy update: the temperature the policy's logprobs are taken at (sampling
    and the update alike), the clip epsilon and the completion tokens per row in the loss."""

    clip_eps: float
    temperature: float
    token_cap: int


@dataclass(frozen=True, slots=True)
class TextWindows:
    """A text run's corpus files, in order, and the windows it draws from them."""

    corpus: tuple[str, ...]
    window: int
    windows_per_step: int


@dataclass(frozen=True, slots=True)
class PerReplay:
    """The prioritized replay buffer (`--replay per`)."""

    replay_capacity: int
    replay_alpha: float
    replay_beta: float
    replay_fraction: float


@dataclass(frozen=True, slots=True)
class Evaluation:
    """Evaluation during training (`--eval-examples` with `--eval-every`): the SFT examples,
    scored after every `eval_every`-th optimizer step."""

    eval_examples: str
    eval_every: int


# every record a run may have; a record's fields are the config fields it holds
RECORDS: tuple[type, ...] = (
    Examples, EpochPlan, StepCount, Preference, Margin, Rollouts, PolicyUpdate, TextWindows,
    PerReplay, Evaluation,
)  # fmt: skip
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Backend:
    """How the run's forwards and backwards are computed: the device, torch's threads (torch's
    own count when `None`: left out), the CPU kernels, strict deterministic and batch-invariant
    modes, gradient checkpointing and the base sharded across torchrun's processes."""

    device: str
    threads: int | None
    cpu_kernels: str
    strict: bool
    batch_invariant: bool
    gradient_checkpointing: bool
    shard_base: bool


@dataclass(frozen=True, slots=True)
class Build:
    """How the model is built: the modules LoRA adapts (`None`: the architecture's default), the
    LoRA dropout (`None`: off, and not recorded), the attention implementation, the most tokens
    per row (`None`: the model's positions), the adapter the run starts from (`None`: a
    fresh one) and what a {messages} row trains (`None`: its assistant turns; "all": every
    token)."""

    lora_targets: tuple[str, ...] | None
    lora_dropout: float | None
    attention: str
    max_length: int | None
    init_adapter: str | None
    messages_loss: str | None


@dataclass(frozen=True, slots=True)
class Optimizer:
    """AdamW's fixed numbers, the gradient's clip norm (`None`: no clipping), wsd's decay
    steps (`None` unless the schedule is wsd) and the warm-up as a fraction of the run's steps
    (`None`: `--warmup-steps` gives it)."""

    weight_decay: float
    adam_betas: tuple[float, float]
    adam_eps: float
    max_grad_norm: float | None
    decay_steps: int | None
    warmup_ratio: float | None


@dataclass(frozen=True, slots=True)
class Sampling:
    """GRPO's options, at their stated defaults in a run of another objective: the KL weight
    (`None`: no KL term), prompt groups per decode block, a plugin environment's arguments, the
    tool environments' turn and time limits (`None` for a single-turn one), the rollouts written
    to completions.jsonl (`None`: none) and the replay buffer's kind."""

    kl_beta: float | None
    rollout_block: int
    env_args: Mapping[str, Any] | None
    max_turns: int | None
    log_completions: int | None
    tool_timeout: float | None
    replay: str


@dataclass(frozen=True, slots=True)
class Switches:
    """What the run writes besides its adapter and how it goes: diag.jsonl, the traced step
    (`None`: none), progress output, replacing or resuming its directory, batches prepared ahead,
    checkpoints (`None` or 0: none), the steps it stops after (`None`: all), the trackers it
    reports to, optimizer-batch capture (`capture_steps` `None`: a v1 capture of step 0),
    planted faults, the spike rerun (`None`: off), the evaluation rows kept (`None`: all), and
    the defaults the run took numbers from (`None`: none) with the settings it took."""

    diag: bool
    trace_step: int | None
    quiet: bool
    overwrite: bool
    resume: bool
    prefetch: int
    checkpoint_every: int | None
    stop_after: int | None
    report_to: tuple[str, ...]
    capture: bool
    capture_steps: tuple[int, ...] | None
    inject: tuple[str, ...]
    spike_factor: float | None
    spike_window: int | None
    eval_limit: int | None
    defaults: str | None
    taken: tuple[str, ...]


# the option records every run has, each the ValidRun field of its name in lower case
OPTIONS: tuple[type, ...] = (Backend, Build, Optimizer, Sampling, Switches)


@dataclass(frozen=True, kw_only=True)
class ValidRun:
    """A validated run. The fields are the objective and the numbers every run has; `backend`,
    `build`, `optimizer`, `sampling` and `switches` its options; `records` those its objective
    uses (`record`); `unused` the settings it was given that none of them holds (the replay
    numbers of a run without `--replay per`, the row-choosing settings of a replay), kept so
    that `as_config` gives back what was given."""

    objective: str
    model: str
    output: str
    seed: int
    batch_size: int
    learning_rate: float
    warmup_steps: int | None  # None: --warmup-ratio's, until the run's steps are known
    lr_schedule: str
    lora_rank: int
    lora_alpha: float
    precision: str
    backend: Backend
    build: Build
    optimizer: Optimizer
    sampling: Sampling
    switches: Switches
    records: tuple[Any, ...]
    unused: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    by_kind: Mapping[type, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_kind", MappingProxyType({type(r): r for r in self.records}))

    def record(self, kind: type[R]) -> R:
        """This run's `kind` record; RuntimeError (a bug in twinrun) when it has none."""
        if kind not in self.by_kind:
            raise RuntimeError(
                f"a {self.objective} run has no {kind.__name__} settings: the code that "
                "asks for them runs for another objective"
            )
        found: R = self.by_kind[kind]
        return found

    def has(self, kind: type) -> bool:
        return kind in self.by_kind

    def with_warmup(self, total_steps: int) -> ValidRun:
        """The run with its warm-up in steps, once its `total_steps` are known (`--warmup-ratio`
        makes ceil(ratio x steps)); ConfigError when both warm-ups are given and disagree."""
        from twinrun.config.schedule import warmup_of

        made = warmup_of(self.warmup_steps, self.optimizer.warmup_ratio, total_steps)
        return self if made == self.warmup_steps else dataclasses.replace(self, warmup_steps=made)

    def with_switches(self, **changes: Any) -> ValidRun:
        """The same run with options that do not shape it changed (the device a process of a
        torchrun launch uses, a resume that starts again): a new value, made where decided.
        TypeError for a name no option record holds."""
        unknown = sorted(set(changes) - {n for kind in OPTIONS for n in _names(kind)})
        if unknown:
            raise TypeError(f"no run option named {', '.join(unknown)}")
        replaced = {
            _attr(kind): dataclasses.replace(
                getattr(self, _attr(kind)),
                **{n: _frozen(v) for n, v in changes.items() if n in _names(kind)},
            )
            for kind in OPTIONS
            if set(changes) & set(_names(kind))
        }
        return dataclasses.replace(self, **replaced)

    def values(self) -> dict[str, Any]:
        """Every setting's value by its `RunConfig` name — what the run was resolved from, with
        the options as changed since — as a `RunConfig` holds it (lists, dicts)."""
        return {n: _thawed(n, v) for n, v in self._held.items()}

    def value(self, name: str) -> Any:
        """The value of setting `name` (`config.run.Settings`): what the records read (the
        sidecar's `train` numbers, the processes' agreement, the defaults taken), with no
        `RunConfig` made for it. A setting this run does not hold has its declared default,
        as in the `RunConfig` it was resolved from."""
        held = self._held
        return _thawed(name, held[name]) if name in held else _default(name)

    @functools.cached_property
    def _held(self) -> dict[str, Any]:
        """The values this run holds, frozen as held, gathered once (a record reads every
        setting; each reader gets its own thawed copy)."""
        values: dict[str, Any] = {"objective": self.objective}
        values |= {n: getattr(self, n) for n in COMMON}
        for held in (*self.records, *(getattr(self, _attr(k)) for k in OPTIONS)):
            values |= {n: getattr(held, n) for n in _names(type(held))}
        values |= self.unused
        return values

    def as_config(self) -> RunConfig:
        """The run's settings as a `RunConfig` (`values`), for what needs one to edit or write
        (a TOML config, a capture's resolved config)."""
        return RunConfig(**self.values())


def _default(name: str) -> Any:
    """The declared default of `RunConfig` field `name` (KeyError for no such field)."""
    field = {f.name: f for f in dataclasses.fields(RunConfig)}[name]
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


OPTION_FIELDS = tuple(kind.__name__.lower() for kind in OPTIONS)
COMMON = tuple(
    f.name
    for f in dataclasses.fields(ValidRun)
    if f.name not in ("objective", "records", "unused", "by_kind", *OPTION_FIELDS)
)


def validate(cfg: RunConfig, source: Source = "flag") -> ValidRun:
    """Every problem at once: missing numbers first, then bad values; each named as the user gave
    it (`source`: "flag" for the command line, "toml" for a TOML config). Numbers left out are
    first taken from the run's `--defaults`, when it names them. Returns the run."""
    from twinrun.config.trl_defaults import fill_defaults

    if cfg.objective not in OBJECTIVES:
        raise ConfigError(
            f"unknown objective {cfg.objective!r}", f"use one of {', '.join(OBJECTIVES)}"
        )
    cfg = fill_defaults(cfg)
    missing = [
        SETTINGS[n].name(source)
        for n in required_fields(cfg.objective)
        if getattr(cfg, n) is None and not (n == "warmup_steps" and cfg.warmup_ratio is not None)
    ]
    if cfg.threads is None and cfg.device == "cpu" and cfg.cpu_kernels == "native":
        missing.append(SETTINGS["threads"].name(source))  # native BLAS sums split by thread
    if missing:
        what = "flag" if source == "flag" else "key"
        raise ConfigError(
            f"missing required {what if len(missing) == 1 else what + 's'}: {' '.join(missing)}",
            f"TRL has no default twinrun can take for {'it' if len(missing) == 1 else 'these'}"
            if cfg.defaults
            else "every training number must be given (twinrun has no silent defaults), or "
            f"{SETTINGS['defaults'].name(source)} trl takes TRL's",
        )
    if cfg.lr_schedule == "wsd" and cfg.decay_steps is None:
        raise ConfigError(
            f"{SETTINGS['lr_schedule'].name(source)} wsd needs "
            f"{SETTINGS['decay_steps'].name(source)}",
            "give the number of decay steps",
        )
    if cfg.replay == "per":
        missing = [SETTINGS[n].name(source) for n in REPLAY_FIELDS if getattr(cfg, n) is None]
        if missing:
            raise ConfigError(
                f"{SETTINGS['replay'].name(source)} per needs {' '.join(missing)}",
                "every replay number must be given",
            )
    problems = value_problems(cfg, source)
    if problems:
        raise ConfigError("; ".join(problems))
    check_report_to(cfg.report_to, SETTINGS["report_to"].name(source))
    check_exclusive(cfg, source)
    run = _resolved(cfg, [k for k in RECORDS if _used(k, cfg)])
    return run.with_warmup(run.record(StepCount).steps) if run.has(StepCount) else run


def check_exclusive(cfg: RunConfig, source: Source) -> None:
    """A ConfigError for switches that do not run together: batch-invariant mode's packed
    forwards run outside gradient checkpointing's recompute of a layer (the recompute would
    save other tensors than the forward did)."""
    if cfg.batch_invariant and cfg.gradient_checkpointing:
        raise ConfigError(
            f"{SETTINGS['gradient_checkpointing'].name(source)} does not run with "
            f"{SETTINGS['batch_invariant'].name(source)} (its packed forwards are not "
            "recomputed as they ran)",
            "leave one of them out",
        )


def replay_run(cfg: RunConfig) -> ValidRun:
    """A replay's run, its `objective` the captured one, once its optimizer contract equals the
    source's: the records whose every setting the objective's contract pins."""
    from twinrun.config.contract import contract_settings

    pinned = set(contract_settings(cfg.objective))
    kinds = [k for k in RECORDS if set(_names(k)) <= pinned]
    check_exclusive(cfg, "toml")
    return _resolved(cfg, kinds)


@dataclass(frozen=True, slots=True)
class ReplayPins:
    """What a replay config must name before any check runs (its required keys): the model,
    the replay's output directory, the seed and the adapter state it starts from."""

    model: str
    output: str
    seed: int
    init_adapter: str


def replay_pins(cfg: RunConfig) -> ReplayPins:
    """A loaded replay config's required inputs (the loader refuses a config without them)."""
    return ReplayPins(**{n: _given(cfg, n) for n in _names(ReplayPins)})


def _names(kind: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(kind))


def _used(kind: type, cfg: RunConfig) -> bool:
    """Whether a validated `cfg` uses the record: its settings apply to the objective (the
    replay buffer's: with `--replay per`; evaluation's: when its examples are given)."""
    if kind is PerReplay:
        return cfg.replay == "per"
    if kind is Evaluation:
        return cfg.eval_examples is not None
    return all(applies(n, cfg.objective) for n in _names(kind))


def _resolved(cfg: RunConfig, kinds: list[type]) -> ValidRun:
    values = {n: _given(cfg, n) for n in COMMON if n != "warmup_steps"}
    values["warmup_steps"] = (
        cfg.warmup_steps if cfg.warmup_ratio is not None else _given(cfg, "warmup_steps")
    )
    records = tuple(k(**{n: _given(cfg, n) for n in _names(k)}) for k in kinds)
    options = {_attr(k): k(**{n: _frozen(getattr(cfg, n)) for n in _names(k)}) for k in OPTIONS}
    held = {n for k in (*kinds, *OPTIONS) for n in _names(k)} | {"objective", *COMMON}
    unused = {
        f.name: _frozen(value)
        for f in dataclasses.fields(RunConfig)
        if f.name not in held and (value := getattr(cfg, f.name)) is not None
    }
    return ValidRun(
        objective=cfg.objective,
        records=records,
        unused=MappingProxyType(unused),
        **values,
        **options,
    )


def _given(cfg: RunConfig, name: str) -> Any:
    value = getattr(cfg, name)
    if value is None:  # validation (or the replay's contract) requires it: a bug in twinrun
        raise RuntimeError(f"{name} of a {cfg.objective} run was resolved before it was checked")
    return _frozen(value)


def _attr(kind: type) -> str:
    """The ValidRun field that holds an option record."""
    return kind.__name__.lower()


def _frozen(value: Any) -> Any:
    """A given value as a record holds it: lists as tuples, a table read-only."""
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, dict):
        return MappingProxyType(dict(value))
    return value


# the kinds of setting a RunConfig holds as a list (a pair stays a tuple)
_LISTS = ("list[str]", "list[int]", "targets")


def _thawed(name: str, value: Any) -> Any:
    """A record's value as a RunConfig holds it (`_frozen` undone)."""
    if isinstance(value, tuple) and name in SETTINGS and SETTINGS[name].kind in _LISTS:
        return list(value)
    if isinstance(value, MappingProxyType):
        return dict(value)
    return value
