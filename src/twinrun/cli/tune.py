"""`twinrun tune {sft,dpo,reward,grpo,text,evaluate}`: training commands and evaluation. Each
training command's flags are generated from the run settings that apply to its objective."""

from __future__ import annotations

from typing import Any

import click

from twinrun.cli.options import config_from_options, run_options, shared_options


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
@run_options("sft")
def sft(**opts: Any) -> None:
    """Supervised fine-tuning with completion-only loss."""
    from twinrun.train.recipes.sft import train_sft

    cfg = config_from_options("sft", opts)
    print_run_summary(train_sft(cfg), cfg.quiet)


@tune.command("dpo")
@run_options("dpo")
def dpo(**opts: Any) -> None:
    """Direct preference optimisation on {prompt, chosen, rejected} pairs."""
    from twinrun.train.recipes.pairs import train_pairs

    cfg = config_from_options("dpo", opts)
    print_run_summary(train_pairs(cfg, "dpo"), cfg.quiet)


@tune.command("reward")
@run_options("reward")
def reward(**opts: Any) -> None:
    """Reward model: LoRA + a scalar head, Bradley-Terry loss on preference pairs."""
    from twinrun.train.recipes.pairs import train_pairs

    cfg = config_from_options("reward", opts)
    print_run_summary(train_pairs(cfg, "reward"), cfg.quiet)


@tune.command("grpo")
@run_options("grpo")
def grpo(**opts: Any) -> None:
    """GRPO on an environment (PPO-clip, group-relative advantages, no KL term)."""
    from twinrun.train.recipes.grpo import train_grpo

    cfg = config_from_options("grpo", opts)
    print_run_summary(train_grpo(cfg), cfg.quiet)


@tune.command("text")
@run_options("text")
def text(**opts: Any) -> None:
    """Continued pre-training on plain text: next-token loss on windows drawn from the corpus."""
    from twinrun.train.recipes.text import train_text

    cfg = config_from_options("text", opts)
    print_run_summary(train_text(cfg), cfg.quiet)


@tune.command("evaluate")
@shared_options("model")
@click.option("--adapter", type=str, default=None, help="A LoRA adapter directory to apply.")
@shared_options(
    "examples", "chat_template", "precision", "batch_size", "output", "threads", "device",
    "cpu_kernels", "strict", "batch_invariant", output={"help": "Report JSON file to write."},
)  # fmt: skip
@click.option("--diag", type=str, default=None, help="Write eval-phase diag rows to this file.")
@shared_options("overwrite", "quiet", overwrite={"help": "Replace an existing report."})
def evaluate(**opts: Any) -> None:
    """Score examples; write per-example losses in input order."""
    from twinrun.infer.evaluate import EvalConfig, run_evaluate

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
