"""`twinrun extract`: hidden states at a layer, per example; `--steering` turns a pair file into a
steering vector (mean chosen - mean rejected) for `twinrun generate --steer`."""

from __future__ import annotations

from typing import Any

import click


@click.command()
@click.option("--model", type=str, help="Local Hugging Face checkpoint directory.")
@click.option("--adapter", type=str, default=None, help="A LoRA adapter directory to apply.")
@click.option("--examples", type=str, help="Examples or {prompt, chosen, rejected} pairs.")
@click.option("--layer", type=int, help="Residual stream index: 0 = embeddings .. num_layers.")
@click.option("--pool", type=str, help="last (last real token) | mean (over real tokens).")
@click.option("--chat-template", type=str, help="on | off.")
@click.option("--precision", type=str, help="f32 | bf16.")
@click.option("--batch-size", type=int, help="Rows per forward.")
@click.option("--output", type=str, help="OUT.safetensors (the sidecar is OUT.json).")
@click.option("--steering", is_flag=True, help="Pairs -> mean(chosen) - mean(rejected).")
@click.option("--batch-invariant", is_flag=True, help="Row results independent of batch.")
@click.option("--threads", type=int, help="torch threads (recorded).")
@click.option("--device", default="cpu", show_default=True, help="cpu | cuda:0.")
@click.option("--strict/--no-strict", default=True, show_default=True)
@click.option("--overwrite", is_flag=True, help="Replace existing output files.")
@click.option("--quiet", is_flag=True, help="No summary line.")
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
