"""`twinrun tune {sft,evaluate,...}`: training commands and evaluation."""

from __future__ import annotations

from typing import Any

import click

from twinrun.cli.options import common_train_options, config_from_options, epoch_options


@click.group()
def tune() -> None:
    """Train a LoRA adapter (sft, ...) or evaluate one."""


def print_run_summary(record: dict[str, Any], quiet: bool) -> None:
    if quiet:
        return
    m = record["metrics"]
    click.echo(
        f"{record['train']['objective']}: {m['steps']} steps, final loss {m['final_loss']:.6f}, "
        f"adapter sha256 {record['adapter']['sha256']}"
    )


@tune.command("sft")
@common_train_options
@epoch_options
def sft(**opts: Any) -> None:
    """Supervised fine-tuning with completion-only loss."""
    from twinrun.train.sft import train_sft

    cfg = config_from_options("sft", opts)
    print_run_summary(train_sft(cfg), cfg.quiet)


@tune.command("evaluate")
@click.option("--model", type=str, help="Local Hugging Face checkpoint directory.")
@click.option("--adapter", type=str, default=None, help="A LoRA adapter directory to apply.")
@click.option("--examples", type=str, help="Examples: JSONL or a JSON array.")
@click.option("--chat-template", type=str, help="on | off.")
@click.option("--precision", type=str, help="f32 | bf16.")
@click.option("--batch-size", type=int, help="Rows per forward.")
@click.option("--output", type=str, help="Report JSON file to write.")
@click.option("--threads", type=int, help="torch threads (recorded).")
@click.option("--device", default="cpu", show_default=True, help="cpu | cuda:0.")
@click.option("--strict/--no-strict", default=True, show_default=True)
@click.option("--batch-invariant", is_flag=True, help="Row results independent of batch.")
@click.option("--overwrite", is_flag=True, help="Replace an existing report.")
@click.option("--quiet", is_flag=True, help="No progress output.")
def evaluate(**opts: Any) -> None:
    """Score examples; write per-example losses in input order."""
    from twinrun.evaluate import EvalConfig, run_evaluate

    report = run_evaluate(EvalConfig(**opts))
    if not opts["quiet"]:
        click.echo(
            f"evaluate: {report['examples']} examples, {report['tokens']} tokens, "
            f"loss {report['loss']:.6f} -> {opts['output']}"
        )
