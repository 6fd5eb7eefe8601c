"""An unknown flag spelled as TRL (or Hugging Face's TrainingArguments) spells it is answered with
twinrun's name for the same setting for that objective, not the nearest spelling; one twinrun has
no equivalent for gets no guess; every name the table gives is a real twinrun flag. twinrun's own
flag given to an objective that does not take it names the objectives that do; an objective
named as a command gets `twinrun tune`."""

from __future__ import annotations

import pytest

from twinrun.cli.main import run_cli
from twinrun.cli.trl_names import BY_OBJECTIVE, TRL_NAMES, flag_objectives
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
        # the name depends on the objective: a run of epochs stops early with --stop-after
        (["tune", "sft", "--max_steps", "4"], "TRL's --max_steps: --stop-after (this run's "
         "length is --epochs; --stop-after N runs its first N)."),
        (["tune", "dpo", "--max-steps=4"], "TRL's --max-steps: --stop-after"),
        (["tune", "text", "--max_steps", "4"], "TRL's --max_steps: --steps."),
        (["tune", "grpo", "--num_train_epochs", "1"], "TRL's --num_train_epochs: --steps"),
        (["tune", "grpo", "--beta", "0.04"], "TRL's --beta: --kl-beta"),
        (["tune", "grpo", "--gradient_accumulation_steps", "2"], "TRL's "
         "--gradient_accumulation_steps: --accumulation, a flag of twinrun tune sft, dpo, ipo, "
         "simpo, reward (grpo has no such setting)."),
        (["tune", "sft", "--learning-rate", "1", "--warmup_ratio", "0.1"], "TRL's "
         "--warmup_ratio: --warmup-ratio."),
        (["tune", "sft", "--assistant_only_loss"], "TRL's --assistant_only_loss: "
         "--messages-loss assistant (all: every token, TRL's default)."),
        (["tune", "dpo", "--assistant_only_loss"], "a flag of twinrun tune sft (dpo has no such "
         "setting)"),
        (["tune", "sft", "--lr-scheduler-type", "cosine"], "TRL's --lr-scheduler-type: "
         "--lr-schedule."),
        (["tune", "sft", "--config", "sft.yaml"], "TRL's --config: `twinrun run CONFIG.toml`"),
        # twinrun's own flag, of another objective
        (["tune", "sft", "--beta", "0.1"], "No such option '--beta': a flag of twinrun tune "
         "dpo, ipo, simpo, not of tune sft."),
        (["tune", "dpo", "--kl-beta", "0.1"], "'--kl-beta': a flag of twinrun tune grpo, not "
         "of tune dpo."),
        (["tune", "sft", "--corpus", "c.txt"], "'--corpus': a flag of twinrun tune text, not "
         "of tune sft."),
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


def test_a_name_by_objective_is_a_flag_of_that_objective() -> None:
    for theirs, by_objective in BY_OBJECTIVE.items():
        for objective, ours in by_objective.items():
            assert objective in flag_objectives(ours.split()[0]), (theirs, objective, ours)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["sft", "--model", "m"], "no such command; training is `twinrun tune sft`"),
        (["train", "dpo"], "no such command; training is `twinrun tune dpo`"),
        (
            ["train"],
            "training is `twinrun tune OBJECTIVE` (sft, dpo, ipo, simpo, reward, grpo, text)",
        ),
    ],
)
def test_an_objective_named_as_a_command_gets_tune(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err, err


def test_kl_beta_0_says_to_leave_the_flag_out(capsys: pytest.CaptureFixture[str]) -> None:
    from testkit.toy_runs import run_args

    argv = run_args("grpo", "/nonexistent/model", "/nonexistent/e.jsonl", "/nonexistent/o")
    assert run_cli([*argv, "--kl-beta", "0"]) == 2  # refused before any file is looked at
    err = capsys.readouterr().err
    assert err == (
        "twinrun: error: --kl-beta must be > 0 (TRL's beta 0 turns the KL term off; here leave "
        "--kl-beta out for that), got 0.0\n"
    )
