"""The inference commands' settings (config/inference.py): their flags are declarations (shared
ones are the run settings' own), their checks are generated, and one rule tells a pairs file
from an examples file (infer/inputs.py)."""

from __future__ import annotations

import dataclasses

import pytest

from twinrun.config.inference import (
    EvalConfig,
    EvalRun,
    ExtractConfig,
    ExtractRun,
    GenerateConfig,
    GenerateRun,
)
from twinrun.config.run import SETTINGS
from twinrun.config.setting import settings_of
from twinrun.core.errors import ConfigError, DataError
from twinrun.data.examples import SourcedRow
from twinrun.infer.inputs import examples_kind

EVAL = dict(model="m", examples="e.jsonl", chat_template="on", precision="f32", batch_size=2,
            output="r.json", threads=1)  # fmt: skip
GEN = dict(model="m", prompt="hi", max_new_tokens=2, temperature=0.0, chat_template="on",
           precision="f32", threads=1)  # fmt: skip


OWN = {"cpu_kernels", "diag"}  # checked by establish; evaluate's --diag FILE is its own


def test_shared_flags_are_the_run_settings_declarations() -> None:
    for cls in (EvalConfig, ExtractConfig, GenerateConfig):
        for name, s in settings_of(cls).items():
            if name in SETTINGS and name not in OWN:
                ours, theirs = dataclasses.asdict(s), dataclasses.asdict(SETTINGS[name])
                changed = {k for k in ours if ours[k] != theirs[k]}
                assert changed <= {"help", "low_open", "reason", "required"}, (cls, name, changed)
    assert settings_of(GenerateConfig)["temperature"].problem(0.0, "flag") is None
    assert SETTINGS["temperature"].problem(0.0, "flag") is not None  # GRPO must sample


def test_settings_are_frozen() -> None:
    cfg = EvalConfig(**EVAL)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.batch_size = 3  # type: ignore[misc]


def test_resolve_checks_then_gives_typed_values() -> None:
    assert EvalConfig(**EVAL).resolve() == EvalRun("e.jsonl", "r.json", "f32", 2)
    extract = ExtractConfig(**EVAL | {"output": "o.safetensors"}, layer=1, pool="mean")
    assert extract.resolve() == ExtractRun("e.jsonl", 1, "mean", "f32", 2)
    # greedy decoding draws nothing: a seed given with it is not taken
    assert GenerateConfig(**GEN, seed=5).resolve() == GenerateRun("hi", 2, 0.0, None, "f32", None)
    sampled = GenerateConfig(**GEN | {"temperature": 0.7}, seed=5, steer="s", steer_scale=2)
    assert sampled.resolve() == GenerateRun("hi", 2, 0.7, 5, "f32", ("s", 2.0))
    with pytest.raises(ConfigError, match="--seed"):  # resolve runs every check first
        GenerateConfig(**GEN | {"temperature": 0.7}).resolve()


def test_missing_flags_in_help_order_and_conditions() -> None:
    flags = "--model --examples --layer --pool --chat-template --precision --batch-size --output"
    with pytest.raises(ConfigError, match=f"missing required flags: {flags} --threads"):
        ExtractConfig().check()
    EvalConfig(**EVAL | {"threads": None}, device="cuda:0").check()  # the GPU needs no count
    GenerateConfig(**GEN).check()  # greedy needs no seed
    with pytest.raises(ConfigError, match="^missing required flag: --seed"):
        GenerateConfig(**GEN | {"temperature": 1.0}).check()


def test_value_checks_then_joint_rules_in_one_line() -> None:
    bad = EVAL | {"batch_size": 0, "precision": "fp16"}
    with pytest.raises(ConfigError) as exc:
        ExtractConfig(**bad | {"output": "o.bin"}, layer=-1, pool="max").check()
    assert exc.value.one_line().split("; ") == [
        "--layer must be >= 0, got -1", "--pool must be last or mean",
        "--precision must be f32 or bf16", "--batch-size must be >= 1, got 0",
        "--output must end in .safetensors",
    ]  # fmt: skip
    with pytest.raises(ConfigError, match="--steer and --steer-scale go together"):
        GenerateConfig(**GEN, steer="s.safetensors").check()
    with pytest.raises(ConfigError, match=r"^--temperature must be >= 0, got -1.0$"):
        GenerateConfig(**GEN | {"temperature": -1.0, "seed": 0}).check()


def rows(*data: dict[str, str]) -> list[SourcedRow]:
    return [SourcedRow(d, f"f.jsonl:{i + 1}") for i, d in enumerate(data)]


PAIR = {"prompt": "p", "chosen": "a", "rejected": "b"}
SFT = {"prompt": "p", "completion": "c"}


def test_examples_kind() -> None:
    assert examples_kind(rows(PAIR, PAIR)) == "pairs"
    assert examples_kind(rows(SFT, {"prompt": "only"})) == "examples"
    assert examples_kind(rows({"prompt": "p", "rejected": "b"})) == "pairs"  # missing a side
    for mixed, first, second in ((rows(SFT, SFT, PAIR), "f.jsonl:1 is an example",
                                  "f.jsonl:3 a preference pair"),
                                 (rows(PAIR, SFT), "f.jsonl:1 is a preference pair",
                                  "f.jsonl:2 an example")):  # fmt: skip
        with pytest.raises(DataError) as exc:
            examples_kind(mixed)
        line = exc.value.one_line()
        assert first in line and second in line and "not both" in line and "\n" not in line


def test_a_bad_value_is_refused_before_torch_is_imported() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from twinrun.cli.main import run_cli; rc = [run_cli(a) for a in ("
        "['generate', '--model', 'm', '--prompt', 'p', '--max-new-tokens', '1', '--temperature', "
        "'1', '--seed', '-1', '--chat-template', 'on', '--precision', 'f32', '--threads', '1'], "
        "['extract', '--model', 'm', '--examples', 'e', '--layer', '-1', '--pool', 'last', "
        "'--chat-template', 'on', '--precision', 'f32', '--batch-size', '1', '--output', "
        "'o.safetensors', '--threads', '1'])]; print(*rc, 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["2", "2", "False"], done.stderr
    assert done.stderr.splitlines() == [
        "twinrun: error: --seed must be in [0, 2**63), got -1",
        "twinrun: error: --layer must be >= 0, got -1",
    ]
