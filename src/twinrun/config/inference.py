"""The inference commands' settings (`twinrun tune evaluate`, `extract`, `generate`): frozen
dataclasses whose fields carry their `Setting`, as `RunConfig`'s do, so each command's flags
(cli/options.py `settings_options`), its required-flag error and its value checks come from one
declaration per setting.

A flag these commands share with training is the run setting's own declaration (`shared`),
changed only where the command says more (its help) or allows more (generate's temperature may
be 0); a flag of their own is declared here (`own`). `check()` names every missing flag in one
error, in declaration order (the order `--help` shows), then every bad value in one error: the
declarations' checks, then the rules that join two settings. `resolve()` checks, then gives the
command's settings as typed values (`EvalRun`, `ExtractRun`, `GenerateRun`: a required setting
is never None there). Nothing here touches a file: the commands claim their outputs (infer/)
after `resolve()`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from twinrun.config.run import SETTINGS, require_flags
from twinrun.config.setting import Kind, Setting, declare, settings_of
from twinrun.core.errors import ConfigError
from twinrun.core.portable import default_mode

POOLS = ("last", "mean")


def shared(name: str, **changes: Any) -> Any:
    """A field declared by the run setting `name` (config/run.py), with `changes` for this
    command (its help, a range)."""
    s = dataclasses.replace(SETTINGS[name], **changes)
    if name == "cpu_kernels":
        # checked by `establish`, which names TWINRUN_CPU_KERNELS when the value came from it;
        # the default is read when the settings are made (the flag's when the CLI is built)
        s = dataclasses.replace(s, choices=())
        return dataclasses.field(default_factory=default_mode, metadata={"setting": s})
    return declare(s)


def own(kind: Kind, flag: str, help: str, **more: Any) -> Any:
    """A field declared by a flag of the inference commands' own (never recorded for a run)."""
    return declare(Setting(kind=kind, flag=flag, help=help, shapes=False, **more))


class InferenceSettings:
    """What the three commands' settings share: the checks generated from their fields (a
    mixin: each command's frozen dataclass declares every field itself, in its `--help` order)."""

    command: ClassVar[str]
    device: str  # a field of each command

    def required_when(self) -> dict[str, bool]:
        """Settings whose being required depends on another's value (overriding `required`):
        the thread count shapes CPU results, so a CPU run needs one."""
        return {"threads": self.device == "cpu"}

    def joint_problems(self) -> list[str]:
        """The rules that join two settings, or say more than one declaration can."""
        return []

    def check(self) -> None:
        """ConfigError naming every missing flag, else every bad value, in one line."""
        declared = settings_of(type(self))
        when = self.required_when()
        require_flags(
            {s.option: getattr(self, n) for n, s in declared.items() if when.get(n, s.required)},
            self.command,
        )
        problems = []
        for name, s in declared.items():
            value = getattr(self, name)
            if value is not None and (problem := s.problem(value, "flag")) is not None:
                problems.append(problem)
        problems += self.joint_problems()
        if problems:
            raise ConfigError("; ".join(problems))


ADAPTER = "A LoRA adapter directory to apply."


@dataclass(frozen=True)
class EvalRun:
    """`twinrun tune evaluate`'s checked settings that a flag may leave out, as typed values."""

    examples: str
    output: str
    precision: str
    batch_size: int


@dataclass(frozen=True)
class ExtractRun:
    """`twinrun extract`'s checked settings that a flag may leave out, as typed values."""

    examples: str
    layer: int
    pool: str
    precision: str
    batch_size: int


@dataclass(frozen=True)
class GenerateRun:
    """`twinrun generate`'s checked settings that a flag may leave out, as typed values."""

    prompt: str
    max_new_tokens: int
    temperature: float
    seed: int | None  # None for greedy decoding (temperature 0), which draws nothing
    precision: str
    steering: tuple[str, float] | None  # the artifact and its scale


def given(value: Any) -> Any:
    """A setting `check()` has required: present."""
    assert value is not None, "resolve() runs check() first"
    return value


@dataclass(frozen=True, kw_only=True)
class EvalConfig(InferenceSettings):
    """`twinrun tune evaluate`."""

    command: ClassVar[str] = "evaluate"

    model: str | None = shared("model")
    adapter: str | None = own("str", "--adapter", ADAPTER)
    examples: str | None = shared("examples")
    chat_template: str | None = shared("chat_template")
    precision: str | None = shared("precision")
    batch_size: int | None = shared("batch_size")
    output: str | None = shared("output", help="Report JSON file to write.")
    threads: int | None = shared("threads")
    device: str = shared("device")
    cpu_kernels: str = shared("cpu_kernels")
    strict: bool = shared("strict")
    batch_invariant: bool = shared("batch_invariant")
    diag: str | None = own("str", "--diag", "Write eval-phase diag rows to this file.")
    overwrite: bool = shared("overwrite", help="Replace an existing report.")
    quiet: bool = shared("quiet")

    def resolve(self) -> EvalRun:
        self.check()
        return EvalRun(given(self.examples), given(self.output), given(self.precision),
                       given(self.batch_size))  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class ExtractConfig(InferenceSettings):
    """`twinrun extract`."""

    command: ClassVar[str] = "extract"

    model: str | None = shared("model")
    adapter: str | None = own("str", "--adapter", ADAPTER)
    examples: str | None = shared("examples", help="Examples or {prompt, chosen, rejected} pairs.")
    layer: int | None = own(
        "int", "--layer", "Residual stream index: 0 = embeddings .. num_layers.",
        required=True, low=0,
    )  # fmt: skip
    pool: str | None = own(
        "str", "--pool", "last (last real token) | mean (over real tokens).",
        required=True, choices=POOLS,
    )  # fmt: skip
    chat_template: str | None = shared("chat_template")
    precision: str | None = shared("precision")
    batch_size: int | None = shared("batch_size")
    output: str | None = shared("output", help="OUT.safetensors (the sidecar is OUT.json).")
    steering: bool = own("bool", "--steering", "Pairs -> mean(chosen) - mean(rejected).",
                         default=False)  # fmt: skip
    batch_invariant: bool = shared("batch_invariant")
    threads: int | None = shared("threads")
    device: str = shared("device")
    cpu_kernels: str = shared("cpu_kernels")
    strict: bool = shared("strict")
    overwrite: bool = shared("overwrite", help="Replace existing output files.")
    quiet: bool = shared("quiet", help="No summary line.")

    def joint_problems(self) -> list[str]:
        if not str(self.output).endswith(".safetensors"):
            return ["--output must end in .safetensors"]
        return []

    def resolve(self) -> ExtractRun:
        self.check()
        return ExtractRun(given(self.examples), given(self.layer), given(self.pool),
                          given(self.precision), given(self.batch_size))  # fmt: skip

    @property
    def out_path(self) -> Path:
        return Path(str(self.output))

    @property
    def sidecar_path(self) -> Path:
        return self.out_path.with_suffix(".json")


@dataclass(frozen=True, kw_only=True)
class GenerateConfig(InferenceSettings):
    """`twinrun generate`."""

    command: ClassVar[str] = "generate"

    model: str | None = shared("model")
    adapter: str | None = own("str", "--adapter", ADAPTER)
    prompt: str | None = own("str", "--prompt", "The prompt text.", required=True)
    max_new_tokens: int | None = shared("max_new_tokens", help="How many tokens at most.")
    temperature: float | None = shared(
        "temperature", help="0 for greedy; > 0 samples.", low_open=False, reason=""
    )
    chat_template: str | None = shared("chat_template")
    seed: int | None = shared("seed", help="Seed for sampling draws, in [0, 2**63).")
    precision: str | None = shared("precision")
    steer: str | None = own("str", "--steer", "A steering artifact (twinrun extract).")
    steer_scale: float | None = own("float", "--steer-scale", "Steering vector scale.")
    device: str = shared("device")
    cpu_kernels: str = shared("cpu_kernels")
    threads: int | None = shared("threads")
    strict: bool = shared("strict")

    def required_when(self) -> dict[str, bool]:
        # greedy decoding draws nothing: it needs no seed
        return super().required_when() | {"seed": self.temperature != 0}

    def joint_problems(self) -> list[str]:
        if (self.steer is None) != (self.steer_scale is None):
            return ["--steer and --steer-scale go together"]
        return []

    def resolve(self) -> GenerateRun:
        self.check()
        temperature = float(given(self.temperature))
        steering = None if self.steer is None else (self.steer, float(given(self.steer_scale)))
        return GenerateRun(
            given(self.prompt), given(self.max_new_tokens), temperature,
            None if temperature == 0 else given(self.seed), given(self.precision), steering,
        )  # fmt: skip
