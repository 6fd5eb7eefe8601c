"""`DiagCallback`: twinrun diag rows from a Hugging Face `transformers.Trainer`.

    from twinrun.integrations.hf import DiagCallback

    trainer = Trainer(model=model, args=args, train_dataset=ds,
                      callbacks=[DiagCallback("runs/a")])   # writes runs/a/diag.jsonl
    trainer.train()
    # then: twinrun diff runs/a runs/b

One `twinrun.diag.v1` row per optimizer step, numbered as twinrun numbers its own: `step` =
the Trainer's `state.global_step` before the step (0 for the first optimizer step, as in a
twinrun run), phase "train", leaves in dataflow order (any subset via `leaves=`):

- `batch.tokens`     the `input_ids` of every microbatch of the step (a forward pre-hook on the
                     model; training forwards only: the model in train mode with grad enabled)
- `forward.logits`   the logits of every microbatch (a forward hook; `output.logits`)
- `loss`             the loss every microbatch's forward returned (`output.loss`), as computed
- `grads.trainable`  the `.grad` of every trainable parameter (`requires_grad`, in
                     `named_parameters()` order) at `on_pre_optimizer_step`: after gradient
                     clipping, just before `optimizer.step()`
- `adam.exp_avg`, `adam.exp_avg_sq`  the optimizer state of those parameters after the step
                     (`on_optimizer_step`), when the optimizer keeps them (Adam/AdamW)
- `params.trainable` the trainable parameters after the step
- `lr`               the learning rate used by the step (one value when every parameter
                     group with parameters has the same one, as twinrun records it; else each
                     group's)
- `rng.state`        the torch CPU (and initialised CUDA) generator states, Python's `random`
                     and numpy's global generator states, at the end of the step

Microbatch leaves are reduced as they arrive (an exact merged checksum and a digest over the
per-microbatch digests): nothing large is held between forwards. When every trainable
parameter is a LoRA factor (PEFT: `lora_A` / `lora_B` in its name) the gradient and parameter
leaves are recorded under twinrun's names, `grads.lora` / `params.lora`, so `twinrun diff
--common-leaves` lines a Trainer/TRL run up with a twinrun run leaf by leaf; a Trainer that
trains other parameters records `grads.trainable` / `params.trainable`. (The selection names
in `leaves=` are always those of `HF_LEAVES`.) A row is written and flushed when the step
ends (`on_step_end`); hooks are removed and the file closed at `on_train_end`.

Needs a transformers whose `TrainerCallback` has `on_pre_optimizer_step` and
`on_optimizer_step` (the 5.x line twinrun pins has both).
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from typing import Any

import torch
from transformers import TrainerCallback

from twinrun.diag.checksum import SumSq, digest, leaf_hasher
from twinrun.diag.recorder import HF_LEAVES, DiagRecorder, LeafValue, leaf_value

__all__ = ["DiagCallback", "HF_LEAVES"]


class _Parts:
    """A leaf made of parts that arrive one at a time (microbatches): exact merged checksum and
    digest (`leaf_hasher`) over the parts' digests, in arrival order."""

    def __init__(self) -> None:
        self.acc = SumSq()
        self.hash = leaf_hasher(b"twinrun.parts.v1\0")
        self.n = 0

    def add(self, t: torch.Tensor) -> None:
        t = t.detach()
        self.acc.add(t)
        self.hash.update(bytes.fromhex(digest(t)))
        self.n += 1

    def value(self) -> LeafValue:
        self.hash.update(self.n.to_bytes(8, "big"))
        return LeafValue(self.acc.value(), self.hash.hexdigest())


def _unwrap(optimizer: Any) -> Any:
    """The torch optimizer inside accelerate's AcceleratedOptimizer (or the optimizer itself)."""
    return getattr(optimizer, "optimizer", optimizer)


def rng_state_parts() -> list[Any]:
    """torch CPU (+ initialised CUDA) generator states, Python `random` and numpy global
    generator states, as integer arrays."""
    import numpy as np

    parts: list[Any] = [torch.get_rng_state()]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        parts += list(torch.cuda.get_rng_state_all())
    version, internal, gauss = random.getstate()
    parts.append(np.asarray([version, *internal], dtype=np.int64))
    parts.append(np.asarray([0.0 if gauss is None else gauss, float(gauss is None)]))
    _, keys, pos, has_gauss, cached = np.random.get_state()
    parts.append(np.asarray(keys, dtype=np.int64))
    parts.append(np.asarray([pos, has_gauss, cached], dtype=np.float64))
    return parts


def _is_lora(name: str) -> bool:
    """A PEFT LoRA factor's parameter name (`...lora_A.default.weight`)."""
    return ".lora_A." in name or ".lora_B." in name


class DiagCallback(TrainerCallback):
    """Write a twinrun diag.jsonl from a `transformers.Trainer` (see the module docstring).

    `path`: the diag.jsonl file or a directory for it. `leaves`: which of `HF_LEAVES` to record
    (default all; the row keeps dataflow order whatever order is given). `append=True` adds to an
    existing file (a resumed run) instead of truncating it; `fsync=True` fsyncs every row."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        leaves: Sequence[str] | None = None,
        *,
        append: bool = False,
        fsync: bool = False,
    ) -> None:
        wanted = HF_LEAVES if leaves is None else tuple(leaves)
        unknown = sorted(set(wanted) - set(HF_LEAVES))
        if unknown:
            raise ValueError(f"unknown DiagCallback leaves {unknown}; choose from {HF_LEAVES}")
        self.leaves = tuple(leaf for leaf in HF_LEAVES if leaf in wanted)
        self.recorder = DiagRecorder(path, append=append, fsync=fsync)
        self.path = self.recorder.path
        self._handles: list[Any] = []
        self._micro: dict[str, _Parts] = {}
        self._late: dict[str, Any] = {}
        self._reset()

    # -- per-step state ------------------------------------------------------------------------

    def _reset(self) -> None:
        self._micro = {
            leaf: _Parts()
            for leaf in ("batch.tokens", "forward.logits", "loss")
            if leaf in self.leaves
        }
        self._late = {}

    @staticmethod
    def _recording(module: Any) -> bool:
        return bool(module.training) and torch.is_grad_enabled()

    def _pre_hook(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not self._recording(module) or "batch.tokens" not in self._micro:
            return
        ids = kwargs.get("input_ids")
        if ids is None and args and isinstance(args[0], torch.Tensor):
            ids = args[0]
        if isinstance(ids, torch.Tensor):
            self._micro["batch.tokens"].add(ids)

    def _forward_hook(self, module: Any, args: Any, kwargs: Any, output: Any) -> None:
        if not self._recording(module):
            return
        for leaf, attr in (("forward.logits", "logits"), ("loss", "loss")):
            if leaf in self._micro:
                value = getattr(output, attr, None)
                if value is None and isinstance(output, dict):
                    value = output.get(attr)
                if isinstance(value, torch.Tensor):
                    self._micro[leaf].add(value)

    # -- Trainer events ------------------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        model = kwargs.get("model")
        if model is None or self._handles or not self._micro:
            return
        self._handles.append(model.register_forward_pre_hook(self._pre_hook, with_kwargs=True))
        self._handles.append(model.register_forward_hook(self._forward_hook, with_kwargs=True))

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._reset()

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        model, optimizer = kwargs.get("model"), kwargs.get("optimizer")
        if model is not None and "grads.trainable" in self.leaves:
            grads = [
                p.grad.detach() if p.grad is not None else torch.zeros_like(p)
                for _, p in self._trainable(model)
            ]
            self._late["grads.trainable"] = leaf_value(grads)
        if optimizer is not None and "lr" in self.leaves:
            groups = [g for g in _unwrap(optimizer).param_groups if g["params"]]
            lrs = [float(g["lr"]) for g in groups]
            if len(set(lrs)) == 1:
                lrs = lrs[:1]  # one rate for the step, as twinrun records it
            self._late["lr"] = leaf_value(torch.tensor(lrs, dtype=torch.float64))

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        model, optimizer = kwargs.get("model"), kwargs.get("optimizer")
        if model is None:
            return
        params = [p for _, p in self._trainable(model)]
        if optimizer is not None:
            opt_state = _unwrap(optimizer).state
            for leaf, key in (("adam.exp_avg", "exp_avg"), ("adam.exp_avg_sq", "exp_avg_sq")):
                if leaf in self.leaves:
                    found = [opt_state[p][key] for p in params if key in opt_state.get(p, {})]
                    if found:
                        self._late[leaf] = leaf_value(found)
        if "params.trainable" in self.leaves:
            self._late["params.trainable"] = leaf_value([p.detach() for p in params])

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        row = self.recorder.begin(int(state.global_step) - 1)  # twinrun's first step is 0
        model = kwargs.get("model")
        lora = model is not None and all(_is_lora(n) for n, _ in self._trainable(model))
        for leaf in self.leaves:
            name = leaf.replace(".trainable", ".lora") if lora else leaf
            if leaf in self._micro:
                if self._micro[leaf].n:
                    row.add(name, self._micro[leaf].value())
            elif leaf == "rng.state":
                row.add(leaf, leaf_value(rng_state_parts()))
            elif leaf in self._late:
                row.add(name, self._late[leaf])
        self.recorder.commit(row)
        self._reset()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.close()

    def close(self) -> None:
        """Remove the model hooks and close the diag file (also done at `on_train_end`)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.recorder.close()

    @staticmethod
    def _trainable(model: Any) -> list[tuple[str, Any]]:
        return [(n, p) for n, p in model.named_parameters() if p.requires_grad]
