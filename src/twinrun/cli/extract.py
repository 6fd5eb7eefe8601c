"""`twinrun extract`: hidden states at a layer, per example; `--steering` turns a pair file into a
steering vector (mean chosen - mean rejected) for `twinrun generate --steer`. The flags it shares
with training are the run settings' own declarations."""

from __future__ import annotations

from typing import Any

import click

from twinrun.cli.options import shared_options


@click.command()
@shared_options("model", "adapter")
@shared_options("examples", examples={"help": "Examples or {prompt, chosen, rejected} pairs."})
@click.option("--layer", type=int, help="Residual stream index: 0 = embeddings .. num_layers.")
@click.option("--pool", type=str, help="last (last real token) | mean (over real tokens).")
@shared_options(
    "chat_template", "precision", "batch_size", "output",
    output={"help": "OUT.safetensors (the sidecar is OUT.json)."},
)  # fmt: skip
@click.option("--steering", is_flag=True, help="Pairs -> mean(chosen) - mean(rejected).")
@shared_options(
    "batch_invariant", "threads", "device", "cpu_kernels", "strict", "overwrite", "quiet",
    overwrite={"help": "Replace existing output files."}, quiet={"help": "No summary line."},
)  # fmt: skip
def extract(**opts: Any) -> None:
    """Hidden states per example (float32 [N, H]) or a steering vector, to safetensors."""
    from twinrun.infer.extract import ExtractConfig, run_extract

    record = run_extract(ExtractConfig(**opts))
    if not opts["quiet"]:
        shapes = ", ".join(f"{k} {v}" for k, v in record["tensors"].items())
        click.echo(
            f"extract: layer {record['layer']} pool {record['pool']}: {shapes} -> "
            f"{opts['output']} (+ {record['output'][: -len('.safetensors')]}.json)"
        )
