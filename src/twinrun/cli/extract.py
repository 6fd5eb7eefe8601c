"""`twinrun extract`: hidden states at a layer, per example; `--steering` turns a pair file into a
steering vector (mean chosen - mean rejected) for `twinrun generate --steer`. Its flags are the
declarations of `ExtractConfig` (config/inference.py): those it shares with training are the run
settings' own."""

from __future__ import annotations

from typing import Any

import click

from twinrun.cli.options import settings_options
from twinrun.config.inference import ExtractConfig


@click.command()
@settings_options(ExtractConfig)
def extract(**opts: Any) -> None:
    """Hidden states per example (float32 [N, H]) or a steering vector, to safetensors."""
    from twinrun.infer.extract import run_extract

    record = run_extract(ExtractConfig(**opts))
    if not opts["quiet"]:
        shapes = ", ".join(f"{k} {v}" for k, v in record["tensors"].items())
        click.echo(
            f"extract: layer {record['layer']} pool {record['pool']}: {shapes} -> "
            f"{opts['output']} (+ {record['output'][: -len('.safetensors')]}.json)"
        )
