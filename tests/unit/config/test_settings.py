"""The run settings are declared once: the click options of every training command, the TOML
schema and the sidecar keys are exactly what the declarations say; the checks generated from
them name the flag or the TOML key; lengths and LoRA targets resolve as promised."""

from __future__ import annotations

import math

import click
import pytest

from twinrun.cli.tune import tune
from twinrun.config.run import SETTINGS, RunConfig, shaping_numbers
from twinrun.config.setting import Setting
from twinrun.config.toml import schema
from twinrun.config.values import parse_env_args, parse_lora_targets, resolve_max_length
from twinrun.core.errors import ConfigError

OBJECTIVES = ("sft", "dpo", "reward", "grpo", "text")

# The flags each command took before the declarations existed, plus the three new ones: a renamed
# or lost flag fails here.
COMMON = {
    "--model", "--examples", "--output", "--seed", "--batch-size", "--learning-rate",
    "--warmup-steps", "--lora-rank", "--lora-alpha", "--precision", "--chat-template", "--diag",
    "--trace-step", "--inject", "--threads", "--device", "--strict", "--batch-invariant",
    "--checkpoint-every", "--resume", "--prefetch", "--spike-factor", "--spike-window",
    "--init-adapter", "--overwrite", "--quiet", "--report-to",
    "--lora-targets", "--attention", "--max-length", "--shard-base", "--lr-schedule",
    "--decay-steps", "--eval-examples", "--eval-every", "--eval-limit", "--stop-after",
    "--cpu-kernels", "--max-grad-norm", "--gradient-checkpointing", "--lora-dropout",
    "--defaults", "--warmup-ratio",
}  # fmt: skip
GRPO = {
    "--steps", "--prompts-per-step", "--group-size", "--max-new-tokens", "--temperature",
    "--clip-eps", "--advantage-clip", "--token-cap", "--env", "--env-arg", "--replay",
    "--replay-capacity", "--replay-alpha", "--replay-beta", "--replay-fraction",
    "--rollout-block", "--max-turns", "--tool-timeout", "--kl-beta", "--log-completions",
}  # fmt: skip
EXPECTED_FLAGS = {
    "sft": COMMON | {"--epochs", "--accumulation", "--messages-loss"},
    "dpo": COMMON | {"--epochs", "--accumulation", "--beta"},
    "reward": COMMON | {"--epochs", "--accumulation"},
    "grpo": COMMON | GRPO,
    "text": (COMMON - {"--examples", "--chat-template"})
    | {"--corpus", "--window", "--windows-per-step", "--steps"},
}

# The sidecar `train` keys a run wrote before the declarations (printed from the old
# shaping_numbers, plus the lora_targets the session added), and the two new recorded settings.
EPOCH_KEYS = [
    "objective", "seed", "epochs", "batch_size", "accumulation", "learning_rate", "warmup_steps",
    "lora_rank", "lora_alpha", "precision", "chat_template", "env_args", "replay", "diag",
    "trace_step", "inject", "threads", "device", "strict", "batch_invariant", "checkpoint_every",
    "prefetch", "spike_factor", "spike_window", "init_adapter", "capture", "capture_steps",
    "gradient_checkpointing", "weight_decay", "adam_betas", "adam_eps", "lora_targets",
]  # fmt: skip
GRPO_KEYS = [
    "objective", "seed", "batch_size", "learning_rate", "warmup_steps", "lora_rank", "lora_alpha",
    "precision", "chat_template", "steps", "prompts_per_step", "group_size", "max_new_tokens",
    "temperature", "clip_eps", "advantage_clip", "token_cap", "env", "env_args", "replay", "diag",
    "trace_step", "inject", "threads", "device", "strict", "batch_invariant", "checkpoint_every",
    "prefetch", "spike_factor", "spike_window", "init_adapter", "capture", "capture_steps",
    "gradient_checkpointing", "weight_decay", "adam_betas", "adam_eps", "lora_targets",
]  # fmt: skip
NEW_KEYS = {
    "attention", "max_length", "lr_schedule", "decay_steps", "eval_every", "eval_limit",
    "stop_after", "cpu_kernels",
}  # fmt: skip
# a text run records the grpo-free common keys and its own (the corpus is recorded as data)
TEXT_KEYS = [
    *(k for k in GRPO_KEYS if k not in {"chat_template", "prompts_per_step", "group_size",
      "max_new_tokens", "temperature", "clip_eps", "advantage_clip", "token_cap", "env"}),
    "window", "windows_per_step",
]  # fmt: skip


def command_options(objective: str) -> dict[str, list[str]]:
    """Parameter name -> every spelling of the option, for one `tune` command."""
    cmd = tune.commands[objective]
    return {
        p.name: [*p.opts, *p.secondary_opts]
        for p in cmd.params
        if isinstance(p, click.Option) and p.name is not None and p.name != "help"
    }


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_the_options_are_the_declarations(objective: str) -> None:
    declared = {
        name: s.flag.split("/")
        for name, s in SETTINGS.items()
        if s.flag and objective in s.objectives
    }
    assert command_options(objective) == declared
    assert {s[0] for s in declared.values()} == EXPECTED_FLAGS[objective]


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_option_types_follow_the_kind(objective: str) -> None:
    cmd = tune.commands[objective]
    defaults = cmd.make_context(objective, [], resilient_parsing=True).params
    for p in cmd.params:
        if not isinstance(p, click.Option) or p.name == "help":
            continue
        s = SETTINGS[p.name]  # type: ignore[index]
        if s.kind == "float":
            assert p.type.name == "float" and type(p.type).__name__ == "FiniteFloat", p.name
        elif s.kind == "int":
            assert p.type is click.INT, p.name
        assert p.multiple == s.multiple, p.name
        if s.default in (None, []):  # a training number: no default at the click level
            assert defaults[p.name] in (None, ()), p.name  # type: ignore[index]
        else:
            assert defaults[p.name] == s.default, p.name  # type: ignore[index]


def test_the_toml_schema_is_the_declarations() -> None:
    keys = schema()
    for name, s in SETTINGS.items():
        if s.toml:
            assert keys[s.toml] == ("cfg", name, s.kind)
    declared = {s.toml for s in SETTINGS.values() if s.toml}
    extras = {k for k, (owner, _, _) in keys.items() if owner == "extras"}
    assert set(keys) == declared | extras
    assert {"model.lora_targets", "model.attention", "training.max_length"} <= declared


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_sidecar_keys_are_unchanged_plus_the_new_settings(objective: str) -> None:
    before = {"grpo": GRPO_KEYS, "text": TEXT_KEYS}.get(objective, EPOCH_KEYS)
    if objective == "dpo":
        before = [*before[:11], "beta", *before[11:]]
    keys = set(shaping_numbers(RunConfig(objective=objective)))
    grpo_only = {"rollout_block", "log_completions"} if objective == "grpo" else set()
    assert keys == set(before) | NEW_KEYS | grpo_only


def test_sidecar_records_replay_numbers_only_for_per() -> None:
    per = shaping_numbers(RunConfig(objective="grpo", replay="per", replay_alpha=0.6))
    assert per["replay_alpha"] == 0.6 and "replay_capacity" in per
    assert "replay_alpha" not in shaping_numbers(RunConfig(objective="grpo"))


def test_sidecar_records_resolved_values_instead_of_none() -> None:
    resolved = {"lora_targets": ["q_proj", "v_proj"], "max_length": 2048}
    numbers = shaping_numbers(RunConfig(objective="sft"), resolved=resolved)
    assert numbers["lora_targets"] == ["q_proj", "v_proj"] and numbers["max_length"] == 2048
    assert numbers["attention"] == "eager"
    given = RunConfig(objective="sft", lora_targets=["o_proj"], max_length=7)
    numbers = shaping_numbers(given, resolved={"lora_targets": ["o_proj"], "max_length": 2048})
    assert numbers["lora_targets"] == ["o_proj"] and numbers["max_length"] == 7
    # the targets are always the names the model's LoRA layers wrap: all-linear, or any order
    for spec in (["all-linear"], ["v_proj", "q_proj"]):
        numbers = shaping_numbers(RunConfig(objective="sft", lora_targets=spec), resolved)
        assert numbers["lora_targets"] == ["q_proj", "v_proj"], spec
    assert shaping_numbers(given)["lora_targets"] == ["o_proj"]  # nothing resolved: as given


def test_resolve_max_length() -> None:
    assert resolve_max_length(7, {"max_position_embeddings": 64}) == 7
    assert resolve_max_length(None, {"max_position_embeddings": 64}) == 64
    for config in ({}, {"max_position_embeddings": "64"}, {"max_position_embeddings": True},
                   {"max_position_embeddings": 0}):  # fmt: skip
        with pytest.raises(ConfigError, match="no max_position_embeddings") as err:
            resolve_max_length(None, config)
        assert "--max-length" in err.value.hint


def test_parse_lora_targets_and_env_args() -> None:
    assert parse_lora_targets("q_proj, v_proj") == ["q_proj", "v_proj"]
    assert parse_lora_targets("all-linear") == ["all-linear"]
    assert parse_lora_targets(["o_proj"]) == ["o_proj"]
    assert parse_env_args(("a=1", "b=x", 'c={"d": [2]}')) == {"a": 1, "b": "x", "c": {"d": [2]}}
    assert parse_env_args(()) is None
    with pytest.raises(ConfigError) as err:
        parse_env_args(("level=3", "https://u:SECRET@h/"))
    assert "SECRET" not in err.value.one_line() and "number 2" in str(err.value)


def s_(**kw: object) -> Setting:
    return Setting(flag="--x", toml="t.x", **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        (s_(kind="float", low=0, low_open=True), 0.0, "--x must be > 0, got 0.0"),
        (s_(kind="float", low=0, low_open=True), math.inf, "--x must be a finite number, got inf"),
        (s_(kind="float", low=0, low_open=True), math.nan, "--x must be a finite number, got nan"),
        (s_(kind="float", low=0, low_open=True, high=1, high_open=True), 1.0,
         "--x must be in (0, 1), got 1.0"),
        (s_(kind="float", low=0, high=1), -0.5, "--x must be in [0, 1], got -0.5"),
        (s_(kind="float"), "1", "--x must be a number"),
        (s_(kind="float"), True, "--x must be a number"),
        (s_(kind="int", low=1), 0, "--x must be >= 1, got 0"),
        (s_(kind="int", low=1), 2**63, "--x must be < 2**63, got 9223372036854775808"),
        (s_(kind="int", low=1), 2.0, "--x must be an integer"),
        (s_(kind="int", low=2, reason="why"), 1, "--x must be >= 2 (why), got 1"),
        (s_(kind="int", low=0, high=2**63, high_open=True), 10**30,
         "--x must be in [0, 2**63), got an integer too large to show"),
        (s_(kind="int", low=0), -(10**5000), "--x must be >= 0, got an integer too large to show"),
        (s_(kind="pair", low=0, high=1, high_open=True), (0.9, 1.0), "--x must be in [0, 1)"),
        (s_(kind="str", choices=("f32", "bf16")), "fp16", "--x must be f32 or bf16"),
        (s_(kind="str", choices=("a", "b", "c")), "hf_SECRET_TOKEN_123",
         "--x must be one of a, b, c"),
    ],
    ids=lambda v: type(v).__name__,  # pytest would call str() on the 5000-digit integer
)  # fmt: skip
def test_generated_checks(setting: Setting, value: object, message: str) -> None:
    got = setting.problem(value, "flag")
    assert got is not None and got.startswith(message)
    if isinstance(value, str) and "SECRET" in value:
        assert got == message
    assert setting.problem(value, "toml").startswith(message.replace("--x", "t.x"))  # type: ignore[union-attr]


def test_values_inside_the_range_pass() -> None:
    assert s_(kind="float", low=0, low_open=True).problem(1e-300, "flag") is None
    assert s_(kind="int", low=0, high=2**63, high_open=True).problem(2**63 - 1, "flag") is None
    assert s_(kind="str", choices=("a",)).problem("a", "flag") is None


def test_the_documented_table_is_the_generated_one() -> None:
    from pathlib import Path

    from twinrun.config.reference import BEGIN, END, settings_table

    doc = (Path(__file__).parents[3] / "docs" / "training.md").read_text(encoding="utf-8")
    start, end = doc.index(BEGIN), doc.index(END) + len(END)
    assert doc[start:end] == settings_table()


def test_help_marks_the_required_flags(capsys: pytest.CaptureFixture[str]) -> None:
    from twinrun.cli.main import run_cli
    from twinrun.config.run import required_fields

    assert run_cli(["tune", "grpo", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for name in required_fields("grpo"):
        flag = SETTINGS[name].flag
        assert f"{flag} " in text and text.split(f"{flag} ", 1)[1].split()[1] == "[required]", flag
    assert "--threads INTEGER [required with --cpu-kernels native]" in text
    assert "--max-turns INTEGER Tool environments" in text  # optional flags are not marked


def test_a_bad_value_is_refused_before_torch_is_imported() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from twinrun.cli.main import run_cli; rc = run_cli(['tune', 'sft', "
        "'--model', 'm', '--examples', 'e', '--output', 'o', '--seed', '-1', '--epochs', '1', "
        "'--batch-size', '1', '--accumulation', '1', '--learning-rate', '1e-3', "
        "'--warmup-steps', '0', '--lr-schedule', 'constant', '--lora-rank', '2', "
        "'--lora-alpha', '4', '--precision', 'f32', '--chat-template', 'on', '--threads', '1']);"
        " print(rc, 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["2", "False"], done.stderr
    assert done.stderr.strip() == "twinrun: error: --seed must be in [0, 2**63), got -1"
