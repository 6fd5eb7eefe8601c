"""`twinrun tune {sft,dpo,reward,grpo,text,evaluate}`: training commands and evaluation. There is
one training command per objective record (objectives/registry.py), its help the record's
summary and its flags the run settings that apply to its objective."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import click

from twinrun.cli.options import config_from_options, run_options, settings_options
from twinrun.config.inference import EvalConfig
from twinrun.objectives.registry import OBJECTIVES, Objective

if TYPE_CHECKING:
    from twinrun.config.resolved import ValidRun
    from twinrun.config.setting import Source


@click.group()
def tune() -> None:
    """Train a LoRA adapter (sft, ...) or evaluate one."""


def print_run_summary(record: dict[str, Any], quiet: bool, output: str | None = None) -> None:
    """The finished run in one line: objective, steps, wall time, final loss (and GRPO's final
    mean reward), the adapter's SHA256 and where the run was written."""
    if quiet or not record:  # no record: a data-parallel process other than rank 0
        return
    m = record["metrics"]
    reward = m.get("final_reward_mean")
    said = [
        f"{record['train']['objective']}: {m['steps']} steps in {m.get('wall_s', 0.0):.1f} s",
        f"final loss {m['final_loss']:.6f}",
        *([f"final mean reward {reward:.4f}"] if reward is not None else []),
        f"adapter sha256 {record['adapter']['sha256']}",
        *([f"written to {output}"] if output else []),
    ]
    click.echo(", ".join(said))


def print_defaults_table(valid: ValidRun, source: Source = "flag") -> None:
    """The numbers a run took from `--defaults`, once, to stderr (stdout stays for results):
    not under --quiet, and under torchrun by rank 0 only; named as flags or TOML keys."""
    from twinrun.config.trl_defaults import defaults_table

    if valid.switches.quiet or os.environ.get("RANK", "0") != "0":
        return
    table = defaults_table(valid, source)
    if table:
        click.echo(table, err=True)


def training_command(objective: Objective) -> click.Command:
    """`twinrun tune NAME`: the record's summary as help, the settings that apply as flags."""

    def run(**opts: Any) -> None:
        from twinrun.config.resolved import validate

        cfg = config_from_options(objective.name, opts)
        valid = validate(cfg)  # every missing or bad value in one line, before torch is imported
        print_defaults_table(valid)
        from twinrun.train.setup.preflight import preflight

        data = preflight(valid)  # a path that cannot be used: one line, before torch is imported
        from twinrun.train.recipes import train

        print_run_summary(train(valid, data), cfg.quiet, cfg.output)

    return tune.command(objective.name, help=objective.summary)(run_options(objective.name)(run))


for _objective in OBJECTIVES:
    training_command(_objective)


@tune.command("evaluate")
@settings_options(EvalConfig)
def evaluate(**opts: Any) -> None:
    """Score examples; write per-example losses in input order."""
    from twinrun.infer.evaluate import run_evaluate

    report = run_evaluate(EvalConfig(**opts))
    if not opts["quiet"]:
        what = (
            f"accuracy {report['accuracy']:.4f}"
            if report["mode"] == "pairwise"
            else f"{report['tokens']} tokens"
        )
        click.echo(
            f"evaluate: {report['examples']} examples, {what}, "
            f"loss {report['loss']:.6f} -> {opts['output']}"
        )
