"""The model prelude: what every command that runs a checkpoint does before its first forward —
training, replay, `tune evaluate`, `extract`, `generate` — once, in one order.

`open_model(...)`:

1. establishes the determinism settings (strict mode, threads, device, the CPU kernels) before
   torch runs any kernel, tokenization included; `Prelude.provenance` is what `establish`
   records;
2. reads the checkpoint's config (ModelError when the directory is not a checkpoint) and, with
   an adapter, its `adapter_config.json` (a bad adapter fails before anything is tokenized or
   built);
3. loads the checkpoint's tokenizer (`Prelude.tok`). `Prelude.templated` is whether rows are
   encoded with its chat template; `Prelude.max_length(given)` is the row length (the given one,
   else the model config's `max_position_embeddings`).

The caller then reads and encodes its data — every data error comes before the model exists —
and calls `Prelude.build(...)`, which seeds torch's default generators from the run's seed when
one is given (recorded as `provenance["torch_seed"]`; inference draws from them never and
records none) and builds the model with its adapter: the one given to `open_model`, fresh LoRA
factors (`lora=`), or none.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from twinrun.config.values import resolve_max_length

if TYPE_CHECKING:
    from twinrun.model.build import CausalLM, FreshLora
    from twinrun.model.tokens import CheckpointTokenizer


@dataclass
class Prelude:
    """An opened checkpoint: strict mode established, its config and tokenizer read."""

    model_dir: Path
    device: str
    provenance: dict[str, Any]  # `establish`'s record (+ "torch_seed" once built with a seed)
    config: dict[str, Any]  # the checkpoint's config.json
    tok: CheckpointTokenizer
    adapter: str | None = None  # checked; `build` loads it
    templated: bool = False  # rows are encoded with the chat template

    def max_length(self, given: int | None = None) -> int:
        """Most tokens per row: `given`, else the model config's positions."""
        return resolve_max_length(given, self.config)

    def build(
        self,
        *,
        precision: str,
        seed: int | None = None,
        lora: FreshLora | None = None,
        attention: str = "eager",
        batch_invariant: bool = False,
        gradient_checkpointing: bool = False,
        shard_over: int | None = None,
    ) -> CausalLM:
        """The model at `precision` on the prelude's device, with the prelude's adapter or a
        fresh `lora` (not both); torch's generators seeded from `seed` first when it is given.
        `shard_over`: `--shard-base`'s processes (the base on the meta device, `build_model`)."""
        from twinrun.model.build import build_model

        if seed is not None:
            from twinrun.core.rng import seed_torch

            self.provenance["torch_seed"] = seed_torch(seed)
        return build_model(
            self.model_dir,
            precision=precision,
            device=self.device,
            attention=attention,
            adapter=self.adapter,
            lora=lora,
            batch_invariant=batch_invariant,
            gradient_checkpointing=gradient_checkpointing,
            shard_over=shard_over,
        )

    def model_sha256(self) -> str:
        """The checkpoint's SHA256 (over the files it is loaded from)."""
        from twinrun.model.loading import model_sha256

        return model_sha256(self.model_dir)

    def adapter_sha256(self) -> str | None:
        """The adapter weights' SHA256; None without an adapter."""
        if self.adapter is None:
            return None
        from twinrun.core.digest import sha256_file
        from twinrun.model.lora import ADAPTER_WEIGHTS

        return sha256_file(Path(self.adapter) / ADAPTER_WEIGHTS)


def open_model(
    model_dir: str | os.PathLike[str],
    *,
    strict: bool,
    threads: int | None,
    device: str,
    cpu_kernels: str,
    adapter: str | None = None,
    templated: bool = False,
) -> Prelude:
    """Establish strict mode, then read the checkpoint's config, the adapter's config and the
    tokenizer (the module docstring)."""
    from twinrun.core.determinism import establish
    from twinrun.model.loading import read_model_config
    from twinrun.model.tokens import load_tokenizer

    path = Path(model_dir)
    config = read_model_config(path)  # ModelError when missing / not a checkpoint: no torch yet
    # then: the CPU kernels are pinned before torch runs any (tokenization may)
    provenance = establish(strict=strict, threads=threads, device=device, cpu_kernels=cpu_kernels)
    if adapter is not None:
        from twinrun.model.adapter_check import read_adapter_config

        read_adapter_config(adapter)  # fail before tokenizing or building anything
    return Prelude(
        model_dir=path,
        device=device,
        provenance=provenance,
        config=config,
        tok=load_tokenizer(path),
        adapter=adapter,
        templated=templated,
    )


class InferenceFlags(Protocol):
    """What an inference command (`tune evaluate`, `extract`, `generate`) gives the prelude."""

    @property
    def model(self) -> Any: ...
    @property
    def adapter(self) -> Any: ...
    @property
    def chat_template(self) -> str | None: ...
    @property
    def strict(self) -> bool: ...
    @property
    def threads(self) -> int | None: ...
    @property
    def device(self) -> str: ...
    @property
    def cpu_kernels(self) -> str: ...


def open_for_inference(flags: InferenceFlags) -> Prelude:
    """`open_model` with an inference command's flags (its chat template on or off)."""
    return open_model(
        str(flags.model), strict=flags.strict, threads=flags.threads, device=flags.device,
        cpu_kernels=flags.cpu_kernels, adapter=flags.adapter,
        templated=flags.chat_template == "on",
    )  # fmt: skip
