"""One model builder for every command: transformers' own causal LM, frozen, at one precision.

`load_causal_lm(path, precision, device, attention)` loads any `AutoModelForCausalLM` checkpoint
stored as safetensors (pickle files are refused) and returns a `CausalLM`: transformers' model
(`.hf`) plus the few switches twinrun adds around its forward. The numbers are transformers'
numbers — the same that PEFT and serving stacks compute on that checkpoint.

The precision policy, in one place: `f32` runs everything in float32; `bf16` loads the frozen
base weights in bfloat16 and runs every forward under bfloat16 autocast — training updates,
GRPO sampling, evaluation and extraction alike. LoRA factors stay float32 (PEFT's
`autocast_adapter_dtype`). Logits are returned as float32.

Around transformers' forward:

- right-padded batches: position ids 0..T-1 in every row, every padded key masked out of every
  query (transformers' own causal + padding mask); a left-padded batch (block decoding,
  `model/decoding.py`) passes each row's `position_ids` (its real tokens count from 0);
- `hidden_layer=L` also returns the residual stream at transformers' `hidden_states[L]` (0 = the
  embeddings, L = the output of decoder layer L-1; for L = num_layers the stream *before* the
  final norm); `steer=(L, v)` adds `v` to the residual stream at that same point (and the
  returned hidden state includes it); `model.steering = (L, v)` is used when `steer` is not given;
- batch-invariant mode (`model.batch_invariant = True`): a forward without a KV cache runs each row
  alone at its real length (`twinrun.model.invariant`);
- gradient checkpointing through transformers' own switch (non-reentrant), a layer's recompute
  under the LoRA dropout of its forward (`twinrun.model.dropout`).

`CausalLM` is deliberately not an `nn.Module` container: `named_modules()`, `parameters()` and
friends are transformers' model's, so module names (LoRA targets, adapter keys, step traces) are
the checkpoint's own names (`model.layers.0.self_attn.q_proj`).
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from twinrun.core.determinism import ATTENTION_IMPLEMENTATIONS
from twinrun.core.errors import ModelError
from twinrun.model.loading import read_model_config, shard_files
from twinrun.model.output import ModelOutput

PRECISIONS = {"f32": torch.float32, "bf16": torch.bfloat16}
# model types whose logits are exactly the output head applied to the final-norm hidden states
# (no soft-capping, no logit scale): `logits_at` runs the head on the positions it is asked for
PLAIN_HEADS = frozenset({"llama", "mistral", "qwen2", "qwen3"})


class CausalLM:
    """transformers' causal LM plus twinrun's switches (see the module docstring)."""

    def __init__(self, hf: Any, precision: str, attention: str) -> None:
        self.hf = hf
        self.precision = precision
        self.attention = attention
        self.batch_invariant = False
        self.steering: tuple[int, torch.Tensor] | None = None
        # `--shard-base`: the base is FSDP2-sharded (its forwards go through the root module)
        # and, while `pace` is set, every forward first tells the other processes it runs one
        # (train/parallel/sharding.py: processes without work of their own match it with a forward)
        self.sharded = False
        self.pace: Callable[[], None] | None = None
        # built on the meta device from this checkpoint, its weights not read yet (sharded loading)
        self.on_meta: Path | None = None

    # -- what the checkpoint is ---------------------------------------------------------------
    @property
    def config(self) -> Any:
        return self.hf.config

    @property
    def model_type(self) -> str:
        return str(self.hf.config.model_type)

    @property
    def num_layers(self) -> int:
        return len(self.decoder_layers())

    @property
    def hidden_size(self) -> int:
        return int(self.hf.get_input_embeddings().embedding_dim)

    @property
    def max_positions(self) -> int | None:
        value = getattr(self.hf.config, "max_position_embeddings", None)
        return int(value) if value else None

    @property
    def device(self) -> torch.device:
        return next(self.hf.parameters()).device

    def decoder_layers(self) -> nn.ModuleList:
        """The decoder layers, found generically (the one ModuleList of the base model)."""
        base = self.hf.base_model
        layers = getattr(base, "layers", None)
        if isinstance(layers, nn.ModuleList):
            return layers
        lists = [m for _, m in base.named_children() if isinstance(m, nn.ModuleList)]
        if len(lists) != 1:
            raise ModelError(
                f"cannot find the decoder layers of a {self.model_type} model",
                "this architecture is not supported for hidden states and steering",
            )
        return lists[0]

    def final_norm(self) -> nn.Module:
        """The norm after the last decoder layer."""
        norm = getattr(self.hf.base_model, "norm", None)
        if not isinstance(norm, nn.Module):
            raise ModelError(
                f"cannot find the final norm of a {self.model_type} model",
                "this architecture is not supported by the reward head",
            )
        return norm

    # -- nn.Module's surface, delegated to transformers' model ---------------------------------
    def named_modules(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, nn.Module]]:
        return self.hf.named_modules(*args, **kwargs)

    def modules(self) -> Iterator[nn.Module]:
        return self.hf.modules()

    def named_parameters(self, *args: Any, **kwargs: Any) -> Iterator[tuple[str, nn.Parameter]]:
        return self.hf.named_parameters(*args, **kwargs)

    def parameters(self) -> Iterator[nn.Parameter]:
        return self.hf.parameters()

    def get_submodule(self, target: str) -> nn.Module:
        return self.hf.get_submodule(target)

    @property
    def training(self) -> bool:
        return bool(self.hf.training)

    def train(self, mode: bool = True) -> CausalLM:
        self.hf.train(mode)
        return self

    def eval(self) -> CausalLM:
        self.hf.eval()
        return self

    @property
    def chunked_head(self) -> bool:
        """Whether every training forward runs the output layer and its loss by position chunks
        (`model.head_chunks`), short rows too: the long-row mode (`--attention blockwise`); not
        under batch-invariant mode or a sharded base, whose forwards make the logits."""
        return self.attention == "blockwise" and not self.batch_invariant and not self.sharded

    @property
    def plain_head(self) -> bool:
        """Whether the logits are the output head on `last_hidden`'s states, so the head may run
        on some positions alone (`logits_at`, `model.head_chunks`): a plain projection
        (`PLAIN_HEADS`), no batch-invariant rows, no sharded base, no steering."""
        return (self.model_type in PLAIN_HEADS and not self.batch_invariant
                and not self.sharded and self.steering is None)  # fmt: skip

    @property
    def gradient_checkpointing(self) -> bool:
        """Whether transformers checkpoints the decoder layers (in training mode)."""
        return bool(self.hf.is_activation_checkpointing)

    def set_gradient_checkpointing(self, on: bool) -> None:
        """transformers' non-reentrant gradient checkpointing; it acts in training mode only. A
        layer's recompute runs under the LoRA dropout its forward ran under (the same masks)."""
        if on:
            from twinrun.model.dropout import recompute_contexts

            self.hf.activation_checkpointing_enable(
                activation_checkpointing_kwargs={
                    "use_reentrant": False,
                    "context_fn": recompute_contexts,
                }
            )
        else:
            self.hf.activation_checkpointing_disable()

    # -- forwards ---------------------------------------------------------------------------------
    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The precision policy: bf16 runs under bfloat16 autocast, f32 casts nothing."""
        if self.precision == "bf16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def new_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache(config=self.hf.config)

    @staticmethod
    def fork_cache(cache: Any) -> Any:
        """An independent copy of a KV cache (a prompt's prefill, extended per completion)."""
        return copy.deepcopy(cache)

    def __call__(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        kv_cache: Any = None,
        steer: tuple[int, torch.Tensor] | None = None,
        position_ids: torch.Tensor | None = None,
        last_only: bool = False,
    ) -> torch.Tensor:
        """float32 logits [B, T, V] for right-padded `input_ids` [B, T] (mask 1 = real token);
        a left-padded batch (KV-cached decoding) also gives each row's `position_ids`.
        `last_only`: the last position's logits alone, [B, 1, V] (a prefill: transformers'
        `logits_to_keep=1` runs the head on that position's hidden state only)."""
        return self.run(input_ids, attention_mask, kv_cache, steer=steer,
                        position_ids=position_ids, last_only=last_only).logits  # fmt: skip

    def hidden_states_at(
        self, input_ids: torch.Tensor, layer: int, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The residual stream at transformers' `hidden_states[layer]` ([B, T, H])."""
        hidden = self.run(input_ids, attention_mask, hidden_layer=layer).hidden
        assert hidden is not None
        return hidden

    def last_hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The final-norm hidden states [B, T, H] (what a sequence-classification head reads).
        A sharded base runs its root module (the unit that holds the embeddings): transformers'
        last `hidden_states` are these same final-norm states."""
        if self.pace is not None:
            self.pace()
        with self.autocast():
            if self.sharded:
                whole = self.hf(
                    input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True
                )
                return whole.hidden_states[-1]
            out = self.hf.base_model(
                input_ids=input_ids, attention_mask=attention_mask, use_cache=False
            )
        return out.last_hidden_state

    def logits_at(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        at: torch.Tensor,
        keep_all: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """float32 logits [K, V] of the K positions `at` marks ([B, T] bool, row-major order) —
        the values of `self(input_ids, attention_mask)[at]` — and, with `keep_all`, every
        position's logits [B, T, V] (no grad). Where the head is a plain projection
        (`PLAIN_HEADS`; no batch-invariant rows, no sharded base, no steering) it runs on the
        marked positions' hidden states alone, so no [B, T, V] tensor is made for the backward
        (a long multi-turn GRPO row trains a fraction of its positions); otherwise the marked
        rows are picked from the whole logits."""
        if not self.plain_head:
            logits = self(input_ids, attention_mask)
            return logits[at], logits if keep_all else None
        hidden = self.last_hidden(input_ids, attention_mask)
        head = self.hf.get_output_embeddings()
        with self.autocast():
            rows = head(hidden[at]).float()
            if not keep_all:
                return rows, None
            with torch.no_grad():
                return rows, head(hidden.detach()).float()

    def run(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        kv_cache: Any = None,
        hidden_layer: int | None = None,
        steer: tuple[int, torch.Tensor] | None = None,
        position_ids: torch.Tensor | None = None,
        last_only: bool = False,
    ) -> ModelOutput:
        """The full forward; see the module docstring for `hidden_layer`, `steer`, `position_ids`
        and batch-invariant mode; `last_only` as in `__call__` (batched or cached forwards)."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [B, T], got shape {tuple(input_ids.shape)}")
        if steer is None:
            steer = self.steering
        n = self.num_layers
        for label, at in (("hidden_layer", hidden_layer), ("steer layer", steer and steer[0])):
            if at is not None and not 0 <= at <= n:
                raise ValueError(f"{label} must be in [0, {n}], got {at}")
        if (
            attention_mask is not None
            and kv_cache is None
            and attention_mask.shape != input_ids.shape
        ):
            raise ValueError("attention_mask must have the shape of input_ids")
        if attention_mask is not None and attention_mask.shape[0] != input_ids.shape[0]:
            raise ValueError("attention_mask must have a row per row of input_ids")  # cached: keys
        if position_ids is not None and position_ids.shape != input_ids.shape:
            raise ValueError("position_ids must have the shape of input_ids")
        if self.batch_invariant:
            if position_ids is not None:
                raise ValueError("batch-invariant mode takes no position_ids (rows run alone)")
            if kv_cache is None:
                from twinrun.model.invariant import run_rows

                return run_rows(self, input_ids, attention_mask, hidden_layer, steer)
            if input_ids.shape[0] != 1:
                raise ValueError("batch-invariant mode runs a KV cache for one row only")
        return self.run_batch(
            input_ids, attention_mask, kv_cache, hidden_layer, steer, position_ids, last_only
        )

    def run_batch(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        kv_cache: Any,
        hidden_layer: int | None,
        steer: tuple[int, torch.Tensor] | None,
        position_ids: torch.Tensor | None = None,
        last_only: bool = False,
    ) -> ModelOutput:
        """The ordinary batched forward (transformers' model), with the residual-stream taps."""
        captured: list[torch.Tensor] = []
        if self.pace is not None:
            self.pace()
        keep = {"logits_to_keep": 1} if last_only else {}
        with self._residual_taps(hidden_layer, steer, captured), self.autocast():
            out = self.hf(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                cache=kv_cache,
                use_cache=kv_cache is not None,
                **keep,
            )
        return ModelOutput(out.logits.float(), captured[0] if captured else None)

    @contextlib.contextmanager
    def _residual_taps(
        self,
        hidden_layer: int | None,
        steer: tuple[int, torch.Tensor] | None,
        captured: list[torch.Tensor],
    ) -> Iterator[None]:
        """Forward hooks at residual-stream index L (embeddings for 0, decoder layer L-1's
        output otherwise): add the steering vector, then capture the hidden state."""
        points = {p for p in (hidden_layer, steer and steer[0]) if p is not None}
        handles = []

        def tap_for(index: int) -> Any:
            def tap(_module: nn.Module, _inputs: Any, output: Any) -> Any:
                x = output[0] if isinstance(output, tuple) else output
                if steer is not None and steer[0] == index:
                    x = x + steer[1].to(device=x.device, dtype=x.dtype)
                if hidden_layer == index:
                    captured.append(x)
                return (x, *output[1:]) if isinstance(output, tuple) else x

            return tap

        layers = self.decoder_layers()
        for index in sorted(points):
            module = self.hf.get_input_embeddings() if index == 0 else layers[index - 1]
            handles.append(module.register_forward_hook(tap_for(index)))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()


def causal_lm_class(config: dict[str, Any], where: str) -> None:
    """ModelError unless transformers knows `model_type` as a causal LM."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    kind = config.get("model_type")
    if kind not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ModelError(
            f"{where}: model_type {kind!r} is not a causal language model transformers knows",
            "point --model at an AutoModelForCausalLM checkpoint (Llama, Qwen, Mistral, ...)",
        )


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """No progress bars or info lines from transformers for the duration (restored after)."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def load_causal_lm(
    model_dir: str | os.PathLike[str],
    precision: str = "f32",
    device: str = "cpu",
    attention: str = "eager",
    *,
    on_meta: bool = False,
    processes: int = 1,
) -> CausalLM:
    """A frozen (requires_grad=False), eval-mode causal LM from a local checkpoint directory.
    `on_meta`: built on the meta device, nothing of the weights read — `--shard-base` fills
    each of its `processes`' shards after sharding (`model/shards.py`,
    `train/parallel/sharding.py`).
    Before any weight is read, a base that cannot fit in what this process may allocate is
    refused in one line (`model.shards.check_fits`)."""
    _check_choices(precision, attention)
    root = Path(model_dir)
    config = read_model_config(root)
    from twinrun.model import shards

    # the headers alone (refuses pickle-only, weightless, out-of-directory, damaged shards), and
    # a base larger than this process may allocate, before the library maps a file
    shards.check_fits(root, PRECISIONS[precision], processes if on_meta else 1)
    causal_lm_class(config, str(root / "config.json"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if on_meta:
        with quiet_transformers():
            hf = shards.skeleton(root, PRECISIONS[precision], attention)
    else:
        hf = _load_weights(root, precision, attention).to(device)
    hf.requires_grad_(False)
    hf.eval()
    model = CausalLM(hf, precision, attention)
    if on_meta:
        model.on_meta = root
    return model


def _check_choices(precision: str, attention: str) -> None:
    """A ModelError for an unknown precision or attention; twinrun's own blockwise attention is
    registered with transformers before anything loads."""
    if precision not in PRECISIONS:
        raise ModelError(f"unknown precision {precision!r}", "use f32 or bf16")
    if attention not in ATTENTION_IMPLEMENTATIONS:
        known = ", ".join(ATTENTION_IMPLEMENTATIONS)
        raise ModelError(f"unknown attention {attention!r}", f"use one of: {known}")
    if attention == "blockwise":
        from twinrun.model.blockwise import register

        register()


def _load_weights(root: Path, precision: str, attention: str) -> Any:
    """transformers' model with every weight of the checkpoint at `root` (each safetensors
    header checked first); a ModelError in one line for a checkpoint that does not load whole —
    transformers would initialise a missing weight at random: never train on that."""
    from twinrun.core.safetensors_io import check_header

    for shard in shard_files(root):
        if shard.suffix == ".safetensors":  # a truncated or damaged file: one line naming it
            check_header(
                shard, "model weights", "re-download or re-save the checkpoint", ModelError
            )
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    try:
        with quiet_transformers():
            # transformers' annotation does not describe output_loading_info=True: a pair
            loaded: Any = AutoModelForCausalLM.from_pretrained(
                str(root),
                dtype=PRECISIONS[precision],
                attn_implementation=attention,
                use_safetensors=True,
                local_files_only=True,
                output_loading_info=True,
            )
        hf, info = loaded
    except (OSError, ValueError, KeyError, RuntimeError, SafetensorError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(
            f"cannot load {root} with transformers: {first}",
            "check that the checkpoint is complete",
        ) from exc
    incomplete = {k: sorted(v) for k, v in info.items() if k != "error_msgs" and v}
    if incomplete or info.get("error_msgs"):
        what = "; ".join(f"{k} {v[:2]}" for k, v in incomplete.items()) or "load errors"
        raise ModelError(
            f"{root}: the weights do not match config.json ({what})",
            "check that the checkpoint is complete and config.json is its own",
        )
    return hf


@dataclass(frozen=True)
class FreshLora:
    """A new adapter: A from `stream(seed, "lora_A", module)`, B zero, on `targets` (None: the
    architecture's default; "all-linear"; or module names)."""

    rank: int
    alpha: float
    seed: int
    targets: str | list[str] | tuple[str, ...] | None = None


def build_model(
    model_dir: str | os.PathLike[str],
    *,
    precision: str,
    device: str,
    attention: str = "eager",
    adapter: str | os.PathLike[str] | None = None,
    lora: FreshLora | None = None,
    batch_invariant: bool = False,
    gradient_checkpointing: bool = False,
    shard_over: int | None = None,
) -> CausalLM:
    """The model every command runs: transformers' model at `precision`, plus an adapter loaded
    from `adapter` or a fresh one (`lora`), or none. With gradient checkpointing the model is left
    in training mode (transformers checkpoints only then); otherwise in eval mode. `shard_over`
    (`--shard-base`, the processes): the base is built on the meta device, its weights read
    after sharding (`train/parallel/sharding.py`); the adapter is real."""
    from twinrun.model.lora import apply_lora, load_adapter, resolve_targets

    if adapter is not None and lora is not None:
        raise ValueError("build_model: give an adapter to load or a fresh LoRA, not both")
    model = load_causal_lm(
        model_dir, precision=precision, device=device, attention=attention,
        on_meta=shard_over is not None, processes=shard_over or 1,
    )  # fmt: skip
    if adapter is not None:
        load_adapter(model, adapter)
    elif lora is not None:
        targets = resolve_targets(model, model.model_type, lora.targets)
        apply_lora(model, lora.rank, lora.alpha, lora.seed, targets=targets)
    model.set_gradient_checkpointing(gradient_checkpointing)
    model.train(gradient_checkpointing)
    model.batch_invariant = batch_invariant
    return model
