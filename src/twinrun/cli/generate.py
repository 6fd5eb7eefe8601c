"""`twinrun generate`: greedy at temperature 0 (ties to the lowest token id), otherwise sampling
with token i drawn from `stream(seed, "sample", i)`."""

from __future__ import annotations

import json
from typing import Any

import click


@click.command()
@click.option("--model", type=str, help="Local Hugging Face checkpoint directory.")
@click.option("--adapter", type=str, default=None, help="A LoRA adapter directory to apply.")
@click.option("--prompt", type=str, help="The prompt text.")
@click.option("--max-new-tokens", type=int, help="How many tokens at most.")
@click.option("--temperature", type=float, help="0 for greedy; > 0 samples.")
@click.option("--chat-template", type=str, help="on | off.")
@click.option("--seed", type=int, help="Seed for sampling draws.")
@click.option("--precision", default="f32", show_default=True, help="f32 | bf16.")
@click.option("--steer", type=str, default=None, help="A steering artifact (twinrun extract).")
@click.option("--steer-scale", type=float, default=None, help="Scale of the steering vector.")
@click.option("--device", default="cpu", show_default=True, help="cpu | cuda:0.")
@click.option("--threads", type=int, help="torch threads.")
@click.option("--strict/--no-strict", default=True, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print {prompt_tokens, tokens, text}.")
def generate(**opts: Any) -> None:
    """Generate a completion for one prompt."""
    from twinrun.infer.generate import GenerateConfig, run_generate

    result = run_generate(GenerateConfig(**{k: v for k, v in opts.items() if k != "as_json"}))
    if opts["as_json"]:
        click.echo(json.dumps(result))
    else:
        click.echo(result["text"])
