"""`twinrun toy-model DIR --seed N`: a tiny Llama-architecture checkpoint from twinrun streams."""

from __future__ import annotations

import math

import click

SIZES = ("layers", "hidden", "intermediate", "heads", "kv_heads")  # the architecture's flags


@click.command("toy-model")
@click.argument("directory", type=str)
@click.option("--seed", type=int, required=True, help="Seed for the weights.")
@click.option("--layers", type=int, default=4, show_default=True)
@click.option("--hidden", type=int, default=64, show_default=True)
@click.option("--intermediate", type=int, default=128, show_default=True)
@click.option("--heads", type=int, default=4, show_default=True)
@click.option("--kv-heads", type=int, default=2, show_default=True)
@click.option(
    "--init-std", type=float, default=0.02, show_default=True,
    help="Weight scale (0.02 is HF's; 0.2 gives a toy that LoRA can teach).",
)  # fmt: skip
@click.option("--overwrite", is_flag=True, help="Replace an existing toy checkpoint (only that).")
def toy_model(directory: str, seed: int, init_std: float, overwrite: bool, **sizes: int) -> None:
    """Write a tiny Llama checkpoint (byte-level tokenizer with a chat template) to DIRECTORY."""
    from twinrun.core.errors import ConfigError
    from twinrun.model.toy import write_toy_checkpoint

    if not 0 <= seed < 2**63:
        raise ConfigError(f"--seed must be in [0, 2**63), got {seed}")
    for name in SIZES:  # in this order, whatever order the flags were given in
        if sizes[name] < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {sizes[name]}")
    if not (math.isfinite(init_std) and init_std > 0):
        raise ConfigError("--init-std must be a positive finite number")
    if sizes["hidden"] % sizes["heads"] or sizes["heads"] % sizes["kv_heads"]:
        raise ConfigError("--hidden must divide by --heads, and --heads by --kv-heads")
    write_toy_checkpoint(directory, seed, overwrite=overwrite, init_std=init_std, **sizes)
    click.echo(f"toy model written to {directory}")
