"""Row gradients handed over a forward's rows at once (`row_gradients.collect_rows`, what the
packed forward's LoRA factors use): added in row order, a row's forwards summed first, the same
bits as one row at a time — and the packed forward leaves no linear layer unchunked."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from twinrun.model.row_gradients import add_rows_into_grad, collect, collect_rows, new_forward

EPS = 2.0**-24  # 1 + EPS rounds back to 1 in float32; 1 + 2 * EPS does not


class _Hand(torch.autograd.Function):
    """Forward: a scalar that requires grad; backward hands `rows` over for `leaf` as given
    (stacked, or one row at a time), as the packed forward's backward does."""

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, leaf: torch.Tensor, rows: torch.Tensor,
                stacked: bool) -> torch.Tensor:  # fmt: skip
        ctx.leaf, ctx.rows, ctx.stacked, ctx.order = leaf, rows, stacked, new_forward()
        return anchor * 1.0

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        if ctx.stacked:
            collect_rows(ctx.order, ctx.leaf, ctx.rows)
        else:
            for row, g in enumerate(ctx.rows.unbind(0)):
                collect(row, ctx.order, (ctx.leaf,), (g,))
        return None, None, None, None


def handed(leaf: torch.Tensor, *forwards: tuple[list[float], bool]) -> torch.Tensor:
    """One backward over forwards that hand over these rows of `leaf`'s gradient; `.grad`."""
    anchor = torch.zeros((), requires_grad=True)
    outs = [_Hand.apply(anchor, leaf, torch.tensor(r).view(-1, 1), s) for r, s in forwards]
    sum(outs).backward()  # type: ignore[union-attr]  # a sum of tensors
    assert leaf.grad is not None
    return leaf.grad


def test_stacked_rows_add_in_row_order() -> None:
    p = torch.zeros(1)
    assert handed(p, ([1.0, EPS, EPS], True)).item() == 1.0  # in row order: 1, then 1 again


def test_stacked_rows_sum_a_rows_forwards_first_and_mix_with_single_rows() -> None:
    expected = torch.tensor([0.0]) + (torch.tensor([1.0]) + torch.tensor([EPS]))
    expected = expected + (torch.tensor([EPS]) + torch.tensor([EPS]))
    for kinds in ((True, True), (True, False), (False, True), (False, False)):
        p = torch.zeros(1)
        got = handed(p, ([1.0, EPS], kinds[0]), ([EPS, EPS], kinds[1]))
        assert torch.equal(got, expected), kinds


def test_index_add_of_rows_is_one_add_per_row() -> None:
    g = torch.Generator().manual_seed(0)
    for trial in range(300):
        n = 1 + trial % 17
        scale = torch.logspace(-20, 20, 41)[torch.randint(0, 41, (n, 1, 1), generator=g)]
        rows = torch.randn(n, 8, 5, generator=g) * scale
        rows[torch.rand(rows.shape, generator=g) < 0.2] = 0.0
        rows[torch.rand(rows.shape, generator=g) < 0.2] *= -1.0  # signed zeros too
        start = None if trial % 2 else torch.randn(8, 5, generator=g)
        p = torch.zeros(8, 5)
        p.grad = None if start is None else start.clone()
        add_rows_into_grad(p, rows)
        ref = rows[0].clone() if start is None else start.clone() + rows[0]
        for r in rows[1:]:
            ref.add_(r)
        assert p.grad is not None and torch.equal(p.grad.view(torch.int32), ref.view(torch.int32))


class _Linears(TorchFunctionMode):
    """Counts the `F.linear` calls made under it."""

    calls = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is F.linear:
            _Linears.calls += 1
        return func(*args, **(kwargs or {}))


def test_the_packed_forward_runs_every_linear_layer_chunked(tmp_path: Any) -> None:
    from twinrun.model.build import load_causal_lm
    from twinrun.model.lora import apply_lora
    from twinrun.model.toy import write_toy_checkpoint

    write_toy_checkpoint(tmp_path / "m", seed=0, hidden=64, intermediate=128, heads=4, kv_heads=2)
    model = load_causal_lm(tmp_path / "m")
    apply_lora(model, 4, 8.0, seed=3, targets=("q_proj", "v_proj"))
    ids = torch.randint(3, 250, (3, 20))
    attn = torch.ones_like(ids)
    attn[1, 12:] = 0
    with _Linears():
        model(ids, attn)  # ordinary: every layer through F.linear
    assert _Linears.calls > 0
    model.batch_invariant = True
    for grad in (False, True):
        _Linears.calls = 0
        with _Linears(), torch.set_grad_enabled(grad):
            model(ids, attn)
        assert _Linears.calls == 0, grad
