"""Tensors tiled in one buffer: the same values as separate tensors, and `span` finds the
buffer only when the parts cover it exactly, in order."""

from __future__ import annotations

import torch

from twinrun.core.tiles import span, tile_parameters, tiled, tiled_zeros
from twinrun.train.step.loop import sum_in_forward_order


def shapes() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return [torch.randn(8, 37, generator=g), torch.randn(41, 8, generator=g), torch.randn(5)]


def test_tiled_zeros_are_views_of_one_buffer() -> None:
    like = shapes()
    zeros = tiled_zeros(like)
    assert [z.shape for z in zeros] == [t.shape for t in like]
    assert all(z.dtype == torch.float32 and not z.any() for z in zeros)
    buf = span(zeros)
    assert buf is not None and buf.numel() == sum(t.numel() for t in like)
    buf[8 * 37] = 7.0  # the buffer is the views' memory
    assert zeros[1][0, 0] == 7.0 and zeros[0].count_nonzero() == 0


def test_tiled_copies_values_and_leaves_the_originals_alone() -> None:
    src = shapes()
    copies = tiled(src)
    assert all(torch.equal(a, b) for a, b in zip(copies, src, strict=True))
    src[0].add_(1.0)
    assert not torch.equal(copies[0], src[0])
    buf = span(copies)
    assert buf is not None
    assert torch.equal(buf, torch.cat([t.reshape(-1) for t in copies]))


def test_mixed_dtypes_or_layouts_are_not_tiled() -> None:
    like = [torch.ones(3), torch.ones(2, dtype=torch.float64)]
    zeros = tiled_zeros(like)
    assert [z.dtype for z in zeros] == [torch.float32, torch.float64]
    assert span(zeros) is None
    strided = torch.ones(4, 6).t()  # not contiguous: zeros_like keeps its strides
    (z,) = tiled_zeros([strided])
    assert z.stride() == strided.stride() and span([z]) is None


def test_span_refuses_parts_that_do_not_cover_one_buffer_in_order() -> None:
    views = tiled(shapes())
    assert span(views) is not None
    assert span(views[::-1]) is None  # out of order
    assert span([views[0], views[2]]) is None  # a gap
    assert span(views[:2]) is not None  # a prefix covers its own memory
    assert span([]) is None
    assert span(shapes()) is None  # separate tensors
    square = tiled([torch.randn(6, 6), torch.randn(3)])
    assert span([square[0].t(), square[1]]) is None  # same memory, transposed
    assert span([square[0].view(torch.int32), square[1]]) is None  # another dtype


def test_span_is_detached() -> None:
    params = [torch.nn.Parameter(t) for t in shapes()]
    tile_parameters(params)
    buf = span(params)
    assert buf is not None and not buf.requires_grad


def test_tiled_parameters_keep_values_identity_and_gradients() -> None:
    init = shapes()
    params = [torch.nn.Parameter(t.clone()) for t in init]
    ids = [id(p) for p in params]
    tile_parameters(params)
    assert [id(p) for p in params] == ids
    assert all(isinstance(p, torch.nn.Parameter) and p.requires_grad for p in params)
    assert all(torch.equal(p, t) for p, t in zip(params, init, strict=True))
    assert span(params) is not None
    loss = sum((p * p).sum() for p in params)
    loss.backward()  # type: ignore[union-attr]
    for p, t in zip(params, init, strict=True):
        assert torch.equal(p.grad, 2 * t)  # type: ignore[arg-type]


def test_summed_gradients_are_tiled_with_the_bits_of_separate_zeros() -> None:
    params = [(f"p{i}", torch.nn.Parameter(t)) for i, t in enumerate(shapes())]
    g = torch.Generator().manual_seed(9)
    forwards = [[[torch.randn(p.shape, generator=g) for _, p in params]] for _ in range(3)]
    forwards[0][0][0][0, 0] = -0.0  # 0 + -0 is +0, as with `.grad +=`
    total = sum_in_forward_order(params, forwards)
    assert span(total) is not None
    for i, (_, p) in enumerate(params):
        want = torch.zeros_like(p)
        for parts in forwards:
            want += parts[0][i]
        assert torch.equal(total[i], want)
        assert torch.equal(total[i].view(torch.int32), want.view(torch.int32))  # signs of zero
