"""`twinrun init-adapter DIR`: the initial adapter and trainer_state.json (step -1)."""

from __future__ import annotations

import click


@click.command("init-adapter")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--model", required=True, help="Local Hugging Face checkpoint directory.")
@click.option("--seed", type=int, required=True, help="Seed in [0, 2**63) of the LoRA init.")
@click.option("--lora-rank", type=int, required=True, help="LoRA rank r.")
@click.option("--lora-alpha", type=float, required=True, help="LoRA alpha.")
def init_adapter(directory: str, model: str, seed: int, lora_rank: int, lora_alpha: float) -> None:
    """Write the initialization resume state a capture starts from."""
    from twinrun.core.digest import sha256_file
    from twinrun.train.init_adapter import init_adapter as write

    out = write(directory, model, seed, lora_rank, lora_alpha)
    sha = sha256_file(out / "adapter_model.safetensors")
    click.echo(f"init-adapter: {out} (step -1), adapter sha256 {sha}")
