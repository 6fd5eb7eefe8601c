"""Config validation: every missing number in one error; bad values named."""

from __future__ import annotations

import pytest

from twinrun.config.resolved import validate
from twinrun.config.run import RunConfig, shaping_numbers
from twinrun.core.errors import ConfigError


def full(**over: object) -> RunConfig:
    base = dict(
        objective="sft",
        model="m",
        examples="e",
        output="o",
        seed=1,
        epochs=1,
        batch_size=2,
        accumulation=1,
        learning_rate=1e-3,
        warmup_steps=0,
        lr_schedule="cosine",
        lora_rank=4,
        lora_alpha=8.0,
        precision="f32",
        chat_template="off",
        threads=1,
    )
    base.update(over)
    return RunConfig(**base)  # type: ignore[arg-type]


def test_valid_config_passes() -> None:
    validate(full())


def test_all_missing_flags_in_one_error() -> None:
    with pytest.raises(ConfigError) as err:
        validate(full(seed=None, epochs=None, learning_rate=None))
    msg = str(err.value)
    assert "--seed" in msg and "--epochs" in msg and "--learning-rate" in msg


@pytest.mark.parametrize(
    ("over", "match"),
    [
        ({"seed": -1}, "--seed"),
        ({"seed": 2**63}, "--seed"),
        ({"batch_size": 0}, "--batch-size must be >= 1"),
        ({"accumulation": 0}, "--accumulation"),
        ({"learning_rate": 0.0}, "--learning-rate"),
        ({"precision": "fp16"}, "--precision"),
        ({"chat_template": "yes"}, "--chat-template"),
        ({"beta": 0.1}, "--beta does not apply to sft"),
        ({"lr_schedule": "step"}, "--lr-schedule must be one of cosine, wsd, constant, linear"),
        ({"lr_schedule": "wsd"}, "--lr-schedule wsd needs --decay-steps"),
        ({"decay_steps": 2}, "--decay-steps applies to --lr-schedule wsd only"),
        ({"lr_schedule": "wsd", "decay_steps": 0}, "--decay-steps must be >= 1"),
    ],
)
def test_bad_values(over: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        validate(full(**over))


def test_dpo_requires_beta() -> None:
    with pytest.raises(ConfigError, match="--beta"):
        validate(full(objective="dpo"))


def test_shaping_numbers_record_everything_that_shapes_a_run() -> None:
    numbers = shaping_numbers(full())
    for key in (
        "seed",
        "epochs",
        "batch_size",
        "accumulation",
        "learning_rate",
        "warmup_steps",
        "lr_schedule",
        "lora_rank",
        "lora_alpha",
        "precision",
        "chat_template",
        "weight_decay",
        "adam_betas",
        "adam_eps",
        "threads",
        "device",
        "strict",
    ):
        assert key in numbers
    assert "output" not in numbers
