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
    from twinrun.train.recipes.sft import train_sft

    cfg = config_from_options("sft", opts)
    print_run_summary(train_sft(cfg), cfg.quiet)


@tune.command("dpo")
@common_train_options
@epoch_options
@click.option("--beta", type=float, help="DPO temperature beta (> 0).")
def dpo(**opts: Any) -> None:
    """Direct preference optimisation on {prompt, chosen, rejected} pairs."""
    from twinrun.train.recipes.pairs import train_pairs

    cfg = config_from_options("dpo", opts)
    print_run_summary(train_pairs(cfg, "dpo"), cfg.quiet)


@tune.command("reward")
@common_train_options
@epoch_options
def reward(**opts: Any) -> None:
    """Reward model: LoRA + a scalar head, Bradley-Terry loss on preference pairs."""
    from twinrun.train.recipes.pairs import train_pairs

    cfg = config_from_options("reward", opts)
    print_run_summary(train_pairs(cfg, "reward"), cfg.quiet)


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
@click.option("--diag", type=str, default=None, help="Write eval-phase diag rows to this file.")
@click.option("--overwrite", is_flag=True, help="Replace an existing report.")
@click.option("--quiet", is_flag=True, help="No progress output.")
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


def parse_env_args(pairs: tuple[str, ...]) -> dict[str, Any] | None:
    """`--env-arg KEY=VALUE` (repeatable); VALUE is read as JSON when it parses, else a string."""
    import json

    from twinrun.core.errors import ConfigError

    if not pairs:
        return None
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--env-arg {pair!r} is not KEY=VALUE", "e.g. --env-arg level=3")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


@tune.command("grpo")
@common_train_options
@click.option("--steps", type=int, help="Optimizer steps.")
@click.option("--prompts-per-step", type=int, help="Prompts sampled per step.")
@click.option("--group-size", type=int, help="Completions per prompt (>= 2).")
@click.option("--max-new-tokens", type=int, help="Completion length limit.")
@click.option("--temperature", type=float, help="Sampling temperature (> 0).")
@click.option("--clip-eps", type=float, help="PPO clip epsilon.")
@click.option("--advantage-clip", type=float, help="Clip advantages to +-this.")
@click.option("--token-cap", type=int, help="Completion tokens per row in the loss, at most.")
@click.option("--env", type=str, help="arithmetic | clock | module.path:factory.")
@click.option("--env-arg", multiple=True, help="KEY=VALUE for a plugin environment.")
@click.option("--replay", default="none", show_default=True, help="none | per.")
@click.option("--replay-capacity", type=int, help="Prioritized replay: buffer size.")
@click.option("--replay-alpha", type=float, help="Prioritized replay: priority exponent.")
@click.option("--replay-beta", type=float, help="Prioritized replay: importance exponent.")
@click.option("--replay-fraction", type=float, help="Replayed rows per fresh row.")
def grpo(**opts: Any) -> None:
    """GRPO on an environment (PPO-clip, group-relative advantages, no KL term)."""
    from twinrun.train.recipes.grpo import train_grpo

    opts["env_args"] = parse_env_args(opts.pop("env_arg"))
    cfg = config_from_options("grpo", opts)
    print_run_summary(train_grpo(cfg), cfg.quiet)
