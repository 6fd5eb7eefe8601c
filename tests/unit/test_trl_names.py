"""An unknown flag spelled as TRL (or Hugging Face's TrainingArguments) spells it is answered with
twinrun's name for the same setting, not the nearest spelling; one twinrun has no equivalent for
gets no guess; every name the table gives is a real twinrun flag."""

from __future__ import annotations

import pytest

from twinrun.cli.main import run_cli
from twinrun.cli.trl_names import TRL_NAMES
from twinrun.config.run import SETTINGS


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["tune", "sft", "--lr", "1e-4"], "twinrun's name for TRL's --lr: --learning-rate."),
        (["tune", "sft", "--num_train_epochs=3"], "TRL's --num_train_epochs: --epochs."),
        (["tune", "sft", "--per_device_train_batch_size", "8"], "TRL's "
         "--per_device_train_batch_size: --batch-size."),
        (["tune", "grpo", "--reward_funcs", "f"], "TRL's --reward_funcs: --env (an environment"),
        (["tune", "grpo", "--num_generations", "8"], "TRL's --num_generations: --group-size."),
        (["tune", "sft", "--max_grad_norm", "1"], "TRL's --max_grad_norm: --max-grad-norm."),
        (["tune", "dpo", "--lora_dropout", "0.05"], "TRL's --lora_dropout: --lora-dropout."),
        (["tune", "sft", "--packing"], "'--packing' (TRL's; twinrun has no such setting)."),
    ],
)  # fmt: skip
def test_trl_flag_names_get_twinrun_s_name(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err, err
    assert "Did you mean" not in err  # not the nearest spelling (--lr was nearest --help)


def test_a_typo_still_gets_the_nearest_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["tune", "sft", "--seeed", "1"]) == 2
    assert "Did you mean '--seed'?" in capsys.readouterr().err


def test_every_name_the_table_gives_is_a_twinrun_flag() -> None:
    flags = {f for s in SETTINGS.values() if s.flag for f in s.flag.split("/")}
    for theirs, ours in TRL_NAMES.items():
        assert theirs.startswith("--") and theirs not in flags, theirs
        if ours is not None and ours.startswith("--"):
            assert ours.split()[0] in flags, (theirs, ours)
