"""LoRA dropout (model/dropout.py): PEFT's computation `lora_B(lora_A(dropout(x))) * scaling`
with each mask read from `stream(seed, "lora_dropout", step, module, *row)` row-major over
[position, feature] — checked against draws taken one at a time from the stream; a row's mask
depends on its key alone (not on its place in the batch, the padded width or the packing); the
dropout acts only inside its context; a checkpointed layer's recompute draws the forward's
masks (and would not without `recompute_contexts`); in batch-invariant mode a row has its own
masks whether it runs packed or alone."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from twinrun.core.rng import stream
from twinrun.model.build import CausalLM, FreshLora, build_model
from twinrun.model.dropout import (
    RowDropout,
    in_effect,
    lora_dropout,
    one_row,
    packed_rows,
    recompute_contexts,
)
from twinrun.model.lora import LoRALinear, lora_disabled, lora_parameters

NAME = "model.layers.0.self_attn.q_proj"


def layer() -> LoRALinear:
    """A 6 -> 5 LoRA layer of rank 2, every weight drawn from the stream (B not zero)."""
    base = nn.Linear(6, 5, bias=False)
    lora = LoRALinear(base, rank=2, alpha=4.0, module_name=NAME)
    with torch.no_grad():
        for i, w in enumerate((base.weight, lora.lora_A.weight, lora.lora_B.weight)):
            w.copy_(torch.from_numpy(stream(3, "test", i).uniform_fill(tuple(w.shape), 1.0)))
    return lora


def keep_by_hand(
    seed: int, step: int, row: tuple[int, ...], module: str, n: int, p: float
) -> list[bool]:
    """Draw after draw from the stream, read as uniforms: kept where u >= p."""
    s = stream(seed, "lora_dropout", step, module, *row)
    return [s.uniform() >= p for _ in range(n)]


def test_the_layer_computes_peft_s_dropout_from_the_hand_drawn_masks() -> None:
    lora = layer()
    x = torch.from_numpy(stream(3, "x").uniform_fill((2, 3, 6), 2.0)).float()
    draw = RowDropout(0.25, seed=7, step=3, keys=((4,), (9,)))
    with lora_dropout(draw):
        got = lora(x)
    kept = [keep_by_hand(7, 3, key, NAME, 3 * 6, 0.25) for key in ((4,), (9,))]
    keep = torch.tensor(kept).view(2, 3, 6)
    assert 0 < int(keep.sum()) < keep.numel()  # some dropped, some kept
    scale = torch.tensor(1 / (1 - 0.25), dtype=torch.float32)  # 4/3 rounded to float32 once
    xd = torch.where(keep, x * scale, torch.zeros(()))
    with torch.no_grad():
        want = lora.base_layer(x) + lora.lora_B(lora.lora_A(xd)) * lora.scaling
    assert torch.equal(got.detach(), want)
    assert not torch.equal(want, lora(x).detach())  # outside the context: no dropout


def test_the_gradient_flows_through_the_kept_elements_only() -> None:
    lora = layer()
    x = torch.from_numpy(stream(4, "x").uniform_fill((1, 4, 6), 1.0)).float().requires_grad_()
    draw = RowDropout(0.5, seed=1, step=0, keys=((0,),))
    with lora_dropout(draw):
        lora(x).sum().backward()
    keep = torch.tensor(keep_by_hand(1, 0, (0,), NAME, 24, 0.5)).view(1, 4, 6)
    through_base = lora.base_layer.weight.sum(0).expand(1, 4, 6)
    through_lora = (lora.lora_B.weight @ lora.lora_A.weight).sum(0) * lora.scaling * 2.0
    assert x.grad is not None
    want = through_base + torch.where(keep, through_lora.expand(1, 4, 6), torch.zeros(()))
    torch.testing.assert_close(x.grad, want, rtol=1e-6, atol=1e-6)
    assert lora.lora_A.weight.grad is not None


def test_the_kept_fraction_is_one_minus_p() -> None:
    draw = RowDropout(0.3, seed=11, step=5, keys=((0,), (1,)))
    mask = draw.mask(torch.Size((2, 500, 100)), NAME)
    assert abs(mask.mean() - 0.7) < 0.005


def test_a_row_s_mask_depends_on_its_key_alone() -> None:
    batch = RowDropout(0.5, seed=2, step=1, keys=((0,), (1,), (2,)))
    wide = batch.mask(torch.Size((3, 7, 6)), NAME)
    narrow = RowDropout(0.5, seed=2, step=1, keys=((1,),)).mask(torch.Size((1, 4, 6)), NAME)
    assert np.array_equal(wide[1, :4], narrow[0])  # a wider padded batch only appends draws
    assert not np.array_equal(wide[0], wide[1])  # rows differ
    other = RowDropout(0.5, seed=2, step=2, keys=((0,), (1,), (2,))).mask(wide.shape, NAME)
    assert not np.array_equal(wide, other)  # the step is in the key
    assert not np.array_equal(wide, batch.mask(wide.shape, NAME + "x"))  # and the module


def test_packed_rows_read_each_row_s_draws_at_its_span() -> None:
    batch = RowDropout(0.4, seed=9, step=0, keys=((0,), (5,)))
    packed = batch.packed((0, 3), (3, 2)).mask(torch.Size((1, 8, 6)), NAME)
    alone = [batch.only(r).mask(torch.Size((1, n, 6)), NAME)[0] for r, n in ((0, 3), (1, 2))]
    assert np.array_equal(packed[0, :3], alone[0])
    assert np.array_equal(packed[0, 3:5], alone[1])
    assert not packed[0, 5:].any()  # the padding after the rows keeps nothing


def test_contexts_nest_and_narrow() -> None:
    draw = RowDropout(0.1, seed=0, step=0, keys=((3,), (4,)))
    assert in_effect() is None
    with lora_dropout(draw):
        assert in_effect() is draw
        with one_row(1):
            assert in_effect() == draw.only(1) and draw.only(1).keys == ((4,),)
        with packed_rows((0, 5), (5, 2)):
            assert in_effect() == draw.packed((0, 5), (5, 2))
        with lora_dropout(None):
            assert in_effect() is None
        assert in_effect() is draw
    assert in_effect() is None
    with one_row(0):
        assert in_effect() is None  # nothing to narrow


def test_a_disabled_adapter_drops_nothing() -> None:
    lora = layer()
    x = torch.ones(1, 2, 6)
    with lora_dropout(RowDropout(0.9, seed=0, step=0, keys=((0,),))), lora_disabled(lora):
        assert torch.equal(lora(x), lora.base_layer(x))


@pytest.mark.parametrize("p", [-0.1, 1.0, math.inf, math.nan])
def test_a_probability_outside_0_1_is_refused(p: float) -> None:
    with pytest.raises(ValueError, match="in \\[0, 1\\)"):
        RowDropout(p, seed=0, step=0, keys=())


def test_the_recompute_context_is_the_forward_s() -> None:
    draw = RowDropout(0.2, seed=0, step=0, keys=((0,),))
    with lora_dropout(draw):
        forward, recompute = recompute_contexts()
    with forward:
        assert in_effect() is None
    with recompute:
        assert in_effect() is draw


def grads_of(model: CausalLM, ids: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    """The LoRA gradients of one forward under dropout, its backward outside the context."""
    draw = RowDropout(0.3, seed=4, step=2, keys=((0,), (1,)))
    with lora_dropout(draw):
        loss = model(ids, mask).sum()
    loss.backward()
    grads = [p.grad for _, p in lora_parameters(model)]
    assert all(g is not None for g in grads)
    return [g for g in grads if g is not None]


def fresh(toy_model_dir: Path, checkpointing: bool) -> CausalLM:
    m = build_model(
        toy_model_dir, precision="f32", device="cpu", lora=FreshLora(4, 8.0, 0),
        gradient_checkpointing=checkpointing,
    )  # fmt: skip
    with torch.no_grad():  # B not zero, so A's gradient and the masks' effect are not zero
        for i, (name, p) in enumerate(lora_parameters(m)):
            if name.endswith("lora_B.weight"):
                p.copy_(torch.from_numpy(stream(6, "B", i).uniform_fill(tuple(p.shape), 0.1)))
    return m


def test_gradient_checkpointing_recomputes_the_same_masks(toy_model_dir: Path) -> None:
    ids = torch.tensor([[256, 104, 101, 108, 108, 111, 32], [256, 50, 43, 50, 61, 258, 258]])
    mask = (ids != 258).long()
    plain = grads_of(fresh(toy_model_dir, False), ids, mask)
    checkpointed = fresh(toy_model_dir, True)
    assert checkpointed.gradient_checkpointing
    again = grads_of(checkpointed, ids, mask)
    assert all(torch.equal(a, b) for a, b in zip(plain, again, strict=True))
    # without the recompute context the recomputed layers would drop nothing (and save fewer
    # tensors than their forward did: torch's checkpoint refuses that)
    bare = fresh(toy_model_dir, False)
    bare.hf.activation_checkpointing_enable(
        activation_checkpointing_kwargs={"use_reentrant": False}
    )
    bare.train(True)
    with pytest.raises(torch.utils.checkpoint.CheckpointError, match="number of tensors"):
        grads_of(bare, ids, mask)


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "row-by-row"])
def test_a_row_has_its_masks_in_either_batch_invariant_path(
    toy_model_dir: Path, packed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In batch-invariant mode a row's logits under dropout are the same bits in a batch of
    three and alone (its key, not its place, picks its masks) — in the packed forward and in the
    one that runs each row alone (taken when the packed one cannot run)."""
    from twinrun.model import invariant

    if not packed:
        monkeypatch.setattr(invariant, "packable", lambda *args: False)
    model = fresh(toy_model_dir, False)
    model.batch_invariant = True
    rows = [[256, 104, 101, 108, 108], [256, 50, 43, 50, 61, 7, 9, 11], [256, 3, 4]]
    width = max(map(len, rows))
    ids = torch.tensor([r + [258] * (width - len(r)) for r in rows])
    attn = (torch.arange(width)[None, :] < torch.tensor([len(r) for r in rows])[:, None]).long()
    keys = ((4,), (5,), (6,))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the mode's promise holds at one thread under portable kernels
    try:
        with lora_dropout(RowDropout(0.3, seed=1, step=0, keys=keys)):
            together = model(ids, attn)
        for b, row in enumerate(rows):
            with lora_dropout(RowDropout(0.3, seed=1, step=0, keys=(keys[b],))):
                alone = model(torch.tensor([row]))
            assert torch.equal(together[b, : len(row)], alone[0]), b
    finally:
        torch.set_num_threads(threads)
    with torch.no_grad():
        undropped = model(ids, attn)
    assert not torch.equal(together, undropped)
