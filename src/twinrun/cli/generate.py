"""`twinrun generate`: greedy at temperature 0 (ties to the lowest token id), otherwise sampling
with token i drawn from `stream(seed, "sample", i)`. Its flags are the declarations of
`GenerateConfig` (config/inference.py): those it shares with training (model, precision, seed,
device, ...) are the run settings' own; `--json` is this command's printing only."""

from __future__ import annotations

import json
from typing import Any

import click

from twinrun.cli.options import settings_options
from twinrun.config.inference import GenerateConfig


@click.command()
@settings_options(GenerateConfig)
@click.option("--json", "as_json", is_flag=True, help="Print {prompt_tokens, tokens, text}.")
def generate(**opts: Any) -> None:
    """Generate a completion for one prompt."""
    from twinrun.infer.generate import run_generate

    result = run_generate(GenerateConfig(**{k: v for k, v in opts.items() if k != "as_json"}))
    if opts["as_json"]:
        click.echo(json.dumps(result))
    else:
        click.echo(result["text"])
