"""`twinrun generate`: greedy at temperature 0 (ties to the lowest token id), otherwise sampling
with token i drawn from `stream(seed, "sample", i)`. The flags it shares with training (model,
precision, seed, device, ...) are the run settings' own declarations."""

from __future__ import annotations

import json
from typing import Any

import click

from twinrun.cli.options import FINITE_FLOAT, shared_options


@click.command()
@shared_options("model", "adapter")
@click.option("--prompt", type=str, help="The prompt text.")
@shared_options(
    "max_new_tokens", "temperature", "chat_template", "seed", "precision",
    max_new_tokens={"help": "How many tokens at most."},
    temperature={"help": "0 for greedy; > 0 samples."},
    seed={"help": "Seed for sampling draws, in [0, 2**63)."},
)  # fmt: skip
@click.option("--steer", type=str, default=None, help="A steering artifact (twinrun extract).")
@click.option("--steer-scale", type=FINITE_FLOAT, default=None, help="Steering vector scale.")
@shared_options("device", "cpu_kernels", "threads", "strict")
@click.option("--json", "as_json", is_flag=True, help="Print {prompt_tokens, tokens, text}.")
def generate(**opts: Any) -> None:
    """Generate a completion for one prompt."""
    from twinrun.infer.generate import GenerateConfig, run_generate

    result = run_generate(GenerateConfig(**{k: v for k, v in opts.items() if k != "as_json"}))
    if opts["as_json"]:
        click.echo(json.dumps(result))
    else:
        click.echo(result["text"])
