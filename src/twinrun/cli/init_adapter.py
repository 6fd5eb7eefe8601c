"""`twinrun init-adapter DIR`: the initial adapter and trainer_state.json (step -1). Its flags
are the run settings' own declarations (model, seed, LoRA rank and alpha)."""

from __future__ import annotations

from typing import Any

import click

from twinrun.cli.options import shared_options


@click.command("init-adapter")
@click.argument("directory", type=click.Path(file_okay=False))
@shared_options(
    "model", "seed", "lora_rank", "lora_alpha",
    seed={"help": "Seed in [0, 2**63) of the LoRA init."},
)  # fmt: skip
def init_adapter(directory: str, **opts: Any) -> None:
    """Write the initialization resume state a capture starts from."""
    from twinrun.config.run import common_problems, require_flags
    from twinrun.core.digest import sha256_file
    from twinrun.core.errors import ConfigError
    from twinrun.train.outputs.init_adapter import init_adapter as write

    flags = {"--model": opts["model"], "--seed": opts["seed"]}
    require_flags(flags | {"--lora-rank": opts["lora_rank"], "--lora-alpha": opts["lora_alpha"]},
                  "init-adapter")  # fmt: skip
    problems = common_problems(
        seed=opts["seed"], lora_rank=opts["lora_rank"], lora_alpha=opts["lora_alpha"]
    )
    if problems:
        raise ConfigError("; ".join(problems))
    out = write(directory, opts["model"], opts["seed"], opts["lora_rank"], opts["lora_alpha"])
    sha = sha256_file(out / "adapter_model.safetensors")
    click.echo(f"init-adapter: {out} (step -1), adapter sha256 {sha}")
