"""LoRA in PEFT's numerics and file format, on any transformers causal LM.

`LoRALinear` computes what PEFT's `lora.Linear` computes:
`result = base_layer(x); result = result + lora_B(lora_A(dropout(x.to(A.dtype)))) * scaling`,
cast back to the base result's dtype, with `scaling = alpha / r` (`alpha / sqrt(r)` under
rsLoRA). `dropout` is the identity except inside a training forward of a run with
`--lora-dropout` (`twinrun.model.dropout`: masks from the keyed stream, by module name). LoRA
weights are float32 whatever the base precision (PEFT's `autocast_adapter_dtype`).

`apply_lora` draws A from `stream(seed, "lora_A", module_name).kaiming_uniform((r, in))` (as
PEFT's default init, but from twinrun's generator) and zeros B. `save_adapter` writes
`adapter_model.safetensors` (PEFT keys `base_model.model.<module>.lora_A.weight`, sorted,
metadata {"format": "pt"}) and `adapter_config.json` (a PEFT LoraConfig, sorted keys), each
atomically; identical weights give identical bytes (`lora_dropout` records the run's dropout
probability, 0.0 without one). `load_adapter` reads them back.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from twinrun.core import reading
from twinrun.core.errors import ModelError
from twinrun.core.redact import redact_string
from twinrun.model.adapter_check import ADAPTER_CONFIG, read_adapter_config
from twinrun.model.dropout import dropped
from twinrun.model.output import ModuleTree
from twinrun.model.targets import ALL_LINEAR, DEFAULT_TARGETS, default_targets

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_METADATA = {"format": "pt"}  # what PEFT writes
PEFT_PREFIX = "base_model.model."


class LoRALinear(nn.Module):
    """A frozen `nn.Linear` plus a low-rank update `lora_B(lora_A(dropout(x))) * scaling`;
    `module_name` (the wrapped Linear's name in the model) keys its dropout masks."""

    def __init__(
        self,
        base_layer: nn.Linear,
        rank: int,
        alpha: float,
        use_rslora: bool = False,
        module_name: str = "",
    ) -> None:
        super().__init__()
        if rank <= 0:
            raise ValueError(f"LoRA rank must be positive, got {rank}")
        self.base_layer = base_layer
        self.module_name = module_name
        self.rank = rank
        self.alpha = alpha
        self.scaling = alpha / math.sqrt(rank) if use_rslora else alpha / rank
        device = base_layer.weight.device
        if device.type == "meta":  # a base built on the meta device (sharded loading): real factors
            device = torch.device("cpu")
        # Built on the meta device so that no torch generator is drawn from, then zeroed.
        a = nn.Linear(base_layer.in_features, rank, bias=False, device="meta", dtype=torch.float32)
        b = nn.Linear(rank, base_layer.out_features, bias=False, device="meta", dtype=torch.float32)
        self.lora_A = a.to_empty(device=device)
        self.lora_B = b.to_empty(device=device)
        with torch.no_grad():
            self.lora_A.weight.zero_()
            self.lora_B.weight.zero_()
        self.disabled = False

    @property
    def in_features(self) -> int:
        return self.base_layer.in_features

    @property
    def out_features(self) -> int:
        return self.base_layer.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = self.base_layer(x)
        if self.disabled:
            return result
        result_dtype = result.dtype
        a = self.lora_A.weight
        if x.dtype != a.dtype:
            x = x.to(a.dtype)
        x = dropped(x, self.module_name)
        from twinrun.model.packing import recording_rows, row_lora

        if recording_rows(a):  # a batch-invariant packed forward: gradients per row
            delta = row_lora(x, a, self.lora_B.weight)
        else:
            delta = self.lora_B(self.lora_A(x))
        result = result + delta * self.scaling
        return result.to(result_dtype)

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha}, scaling={self.scaling}"


def lora_modules(model: ModuleTree) -> list[tuple[str, LoRALinear]]:
    """(module name, LoRALinear) in module order."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, LoRALinear)]


def lora_parameters(model: ModuleTree) -> list[tuple[str, nn.Parameter]]:
    """LoRA parameters in a stable order: module order, A then B (names as in the model)."""
    out: list[tuple[str, nn.Parameter]] = []
    for name, mod in lora_modules(model):
        out.append((f"{name}.lora_A.weight", mod.lora_A.weight))  # type: ignore[arg-type]  # nn.Linear declares weight a Tensor; it is a Parameter
        out.append((f"{name}.lora_B.weight", mod.lora_B.weight))  # type: ignore[arg-type]  # nn.Linear declares weight a Tensor; it is a Parameter
    return out


def resolve_targets(model: Any, model_type: str, spec: str | Iterable[str] | None) -> list[str]:
    """The module names LoRA wraps, sorted: the architecture's default (None), every Linear
    but the output layer (`all-linear`, as PEFT's rule), or the names given."""
    if spec is None:
        names: Iterable[str] = default_targets(model_type)
    elif spec == ALL_LINEAR or list(spec) == [ALL_LINEAR]:
        names = {n.rsplit(".", 1)[-1] for n, _ in _linear_modules(model)}
    elif isinstance(spec, str):
        names = [n.strip() for n in spec.split(",") if n.strip()]
    else:
        names = spec
    return sorted(set(names))


def _linear_modules(model: Any) -> list[tuple[str, nn.Linear]]:
    """Every nn.Linear of the model except the output layer (lm_head)."""
    output = None
    hf = getattr(model, "hf", model)
    if hasattr(hf, "get_output_embeddings"):
        output = hf.get_output_embeddings()
    return [
        (n, m)
        for n, m in model.named_modules()
        if isinstance(m, nn.Linear) and m is not output and n != "lm_head"
    ]


def _targets(model: ModuleTree, targets: Iterable[str]) -> list[tuple[str, nn.Linear]]:
    wanted = {targets} if isinstance(targets, str) else set(targets)
    if not wanted:
        raise ModelError("no LoRA target modules given", "name e.g. q_proj, v_proj")
    if lora_modules(model):
        raise ModelError("the model already has LoRA layers", "start from a fresh base model")
    found = [(n, m) for n, m in _linear_modules(model) if n.rsplit(".", 1)[-1] in wanted]
    seen = {n.rsplit(".", 1)[-1] for n, _ in found}
    if missing := sorted(wanted - seen):
        raise ModelError(
            f"LoRA target modules not found in the model: {missing}",
            "--lora-targets takes Linear module names of this model (e.g. q_proj,v_proj) "
            "or all-linear",
        )
    return found


def _wrap(
    model: ModuleTree, rank: int, alpha: float, targets: Iterable[str], use_rslora: bool = False
) -> list[tuple[str, LoRALinear]]:
    if isinstance(rank, bool) or not isinstance(rank, int) or rank <= 0:
        raise ModelError(f"LoRA rank must be a positive integer, got {rank!r}", "--lora-rank N")
    if not math.isfinite(alpha) or alpha <= 0:
        raise ModelError(f"LoRA alpha must be positive, got {alpha!r}", "--lora-alpha F")
    wrapped = []
    for name, linear in _targets(model, targets):
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        lora = LoRALinear(linear, rank, alpha, use_rslora, module_name=name)
        setattr(parent, child, lora)
        wrapped.append((name, lora))
    return wrapped


def apply_lora(
    model: ModuleTree,
    rank: int,
    alpha: float,
    seed: int,
    targets: Iterable[str] = DEFAULT_TARGETS,
) -> list[str]:
    """Wrap every target Linear in a LoRALinear (A from twinrun's stream, B zeros).

    Returns the wrapped module names in module order. LoRA weights are float32 and trainable."""
    from twinrun.core.rng import stream, torch_tensor

    wrapped = _wrap(model, rank, alpha, targets)
    with torch.no_grad():
        for name, lora in wrapped:
            draw = stream(seed, "lora_A", name).kaiming_uniform((rank, lora.in_features))
            lora.lora_A.weight.copy_(torch_tensor(draw, torch.float32))
    for _, p in lora_parameters(model):
        p.requires_grad_(True)
    return [n for n, _ in wrapped]


def lora_state_dict(
    model: ModuleTree, dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    """The adapter tensors under PEFT's saved keys (sorted), detached CPU copies."""
    out = {
        PEFT_PREFIX + name: p.detach().to("cpu", dtype).contiguous().clone()
        for name, p in lora_parameters(model)
    }
    if not out:
        raise ModelError("the model has no LoRA layers", "call apply_lora or load_adapter first")
    return dict(sorted(out.items()))


def _int_if_integral(x: float) -> int | float:
    return int(x) if float(x).is_integer() else float(x)


def adapter_config(
    base_model_path: str, rank: int, alpha: float, targets: Iterable[str], dropout: float = 0.0
) -> dict[str, Any]:
    """A PEFT LoraConfig dict (inference mode) for these LoRA settings (`dropout`: the
    probability the adapter was trained with, PEFT's `lora_dropout`). The base model is
    recorded as PEFT expects it: a local checkpoint by its absolute path (so the adapter loads
    from any working directory), anything else as given — redacted as the sidecar's is
    (`https://user:pass@host/m` keeps no credentials)."""
    base = Path(base_model_path)
    recorded = str(base.resolve()) if base.is_dir() else base_model_path
    return {
        "alpha_pattern": {},
        "auto_mapping": None,
        "base_model_name_or_path": redact_string(recorded),
        "bias": "none",
        "exclude_modules": None,
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
        "layer_replication": None,
        "layers_pattern": None,
        "layers_to_transform": None,
        "lora_alpha": _int_if_integral(alpha),
        "lora_bias": False,
        "lora_dropout": float(dropout),
        "modules_to_save": None,
        "peft_type": "LORA",
        "r": rank,
        "rank_pattern": {},
        "revision": None,
        "target_modules": sorted(set(targets)),
        "target_parameters": None,
        "task_type": "CAUSAL_LM",
        "use_dora": False,
        "use_rslora": False,
    }


def adapter_targets(model: Any) -> list[str]:
    """The module names (last name component, sorted) the model's LoRA layers wrap."""
    return _model_lora_shape(model)[2]


def _model_lora_shape(model: ModuleTree) -> tuple[int, float, list[str]]:
    mods = lora_modules(model)
    if not mods:
        raise ModelError("the model has no LoRA layers", "call apply_lora or load_adapter first")
    ranks = {m.rank for _, m in mods}
    alphas = {m.alpha for _, m in mods}
    if len(ranks) != 1 or len(alphas) != 1:
        raise ModelError("LoRA layers differ in rank or alpha", "PEFT needs one rank and alpha")
    return ranks.pop(), alphas.pop(), sorted({n.rsplit(".", 1)[-1] for n, _ in mods})


def save_adapter(
    model: ModuleTree,
    out_dir: str | os.PathLike[str],
    base_model_path: str,
    rank: int | None = None,
    alpha: float | None = None,
    targets: Iterable[str] | None = None,
    dtype: torch.dtype = torch.float32,
    dropout: float = 0.0,
) -> None:
    """Write adapter_model.safetensors + adapter_config.json (PEFT format), each atomically.

    rank/alpha/targets default to the model's LoRA layers and must agree with them; `dropout`
    is the probability the adapter was trained with (recorded as `lora_dropout`)."""
    from twinrun.core.fileio import atomic_write_text
    from twinrun.core.safetensors_io import write_tensors

    m_rank, m_alpha, m_targets = _model_lora_shape(model)
    if rank is not None and rank != m_rank or alpha is not None and alpha != m_alpha:
        raise ModelError(
            f"save_adapter: rank/alpha {rank}/{alpha} differ from the model's {m_rank}/{m_alpha}",
            "pass the values the LoRA layers were built with",
        )
    if targets is not None and sorted(set(targets)) != m_targets:
        raise ModelError(
            f"save_adapter: targets {sorted(set(targets))} differ from the model's {m_targets}",
            "pass the targets the LoRA layers were built with",
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_tensors(out / ADAPTER_WEIGHTS, lora_state_dict(model, dtype), ADAPTER_METADATA)
    cfg = adapter_config(base_model_path, m_rank, m_alpha, m_targets, dropout)
    atomic_write_text(out / ADAPTER_CONFIG, json.dumps(cfg, sort_keys=True, indent=2) + "\n")


def load_adapter(model: ModuleTree, adapter_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Wrap the model's target modules and load the saved LoRA weights; returns the config."""
    from twinrun.core.safetensors_io import read_safetensors

    cfg = read_adapter_config(adapter_dir)
    path = Path(adapter_dir) / ADAPTER_WEIGHTS
    if os.path.lexists(path):  # a FIFO or a device in its place: refused by kind, not waited on
        reading.open_regular(path, "adapter weights", ModelError).close()
    if not path.is_file():
        raise ModelError(f"no {ADAPTER_WEIGHTS} in {adapter_dir}", "the adapter is incomplete")
    saved = read_safetensors(
        path, "adapter weights", "the adapter file is damaged: write it again", ModelError
    ).tensors
    wrapped = _wrap(
        model,
        cfg["r"],
        float(cfg["lora_alpha"]),
        cfg["target_modules"],
        bool(cfg.get("use_rslora")),
    )
    params = dict(lora_parameters(model))
    expected = {PEFT_PREFIX + n for n in params}
    if set(saved) != expected:
        _unwrap(model, wrapped)
        missing, extra = sorted(expected - set(saved)), sorted(set(saved) - expected)
        raise ModelError(
            f"{path}: tensors do not match the model (missing {missing[:2]}, extra {extra[:2]})",
            "was the adapter trained on this base model?",
        )
    with torch.no_grad():
        for name, p in params.items():
            t = saved[PEFT_PREFIX + name]
            if t.shape != p.shape:
                _unwrap(model, wrapped)
                raise ModelError(
                    f"{path}: {name} has shape {tuple(t.shape)}, expected {tuple(p.shape)}",
                    "was the adapter trained on this base model?",
                )
            if not t.is_floating_point() or not bool(torch.isfinite(t).all()):
                _unwrap(model, wrapped)
                raise ModelError(
                    f"{path}: {name} is not finite floating point ({t.dtype})",
                    "the adapter file is damaged: write it again",
                )
            p.copy_(t.to(p.dtype))
    for p in params.values():
        p.requires_grad_(True)
    return cfg


def _unwrap(model: ModuleTree, wrapped: list[tuple[str, LoRALinear]]) -> None:
    for name, lora in wrapped:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, lora.base_layer)


@contextlib.contextmanager
def lora_disabled(model: ModuleTree) -> Iterator[None]:
    """Inside the block every LoRA layer skips its delta (the base model, e.g. DPO's reference)."""
    mods = [m for _, m in lora_modules(model)]
    before = [m.disabled for m in mods]
    for m in mods:
        m.disabled = True
    try:
        yield
    finally:
        for m, flag in zip(mods, before, strict=True):
            m.disabled = flag
