"""`twinrun.core.portable_ops`: while installed, torch's own calls (F.linear, matmul, autograd's
derivatives, in-place forms) reach the exact products and the portable functions; other dtypes
reach torch's kernels unchanged; uninstalling gives torch its kernels back."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from twinrun.core import portable_math, portable_ops
from twinrun.core.exact_matmul import exact_matmul, exact_product64


def rand(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def test_linear_matmul_and_their_derivatives_use_the_exact_products(portable: None) -> None:
    x = rand(5, 7, seed=1).requires_grad_()
    w = rand(3, 7, seed=2).requires_grad_()
    bias = rand(3, seed=3)
    y = torch.nn.functional.linear(x, w, bias)  # addmm: product and bias rounded once
    product = exact_product64(x.detach(), w.detach().t())
    assert torch.equal(y.detach(), (product + bias.double()).float())
    g = rand(5, 3, seed=4)
    y.backward(g)
    assert torch.equal(x.grad, exact_matmul(g, w.detach()))  # type: ignore[arg-type]
    assert torch.equal(w.grad, exact_matmul(g.t(), x.detach()))  # type: ignore[arg-type]
    q, k = rand(2, 4, 6, seed=5), rand(2, 6, 3, seed=6)
    assert torch.equal(torch.matmul(q, k), exact_matmul(q, k))
    v = rand(6, seed=7)
    assert torch.equal(torch.mv(q[0], v), exact_matmul(q[0], v.unsqueeze(1)).squeeze(1))
    assert torch.equal(torch.dot(v, v), exact_matmul(v.unsqueeze(0), v.unsqueeze(1)).reshape(()))


def test_addmm_and_baddbmm_round_once_with_alpha_and_beta(portable: None) -> None:
    a, b, c = rand(4, 5, seed=1), rand(5, 3, seed=2), rand(4, 3, seed=3)
    got = torch.addmm(c, a, b, beta=0.5, alpha=2.0)
    want = (exact_product64(a, b) * 2.0 + c.double() * 0.5).float()
    assert torch.equal(got, want)
    nan = torch.full_like(c, float("nan"))
    assert not torch.isnan(torch.addmm(nan, a, b, beta=0)).any()  # beta 0 ignores self
    batch = torch.baddbmm(c.expand(2, 4, 3), a.expand(2, 4, 5), b.expand(2, 5, 3))
    assert torch.equal(batch[1], (exact_product64(a, b) + c.double()).float())


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64])
def test_other_dtypes_reach_torchs_own_kernels(portable: None, dtype: torch.dtype) -> None:
    a = torch.arange(12, dtype=dtype).reshape(3, 4)
    b = torch.arange(8, dtype=dtype).reshape(4, 2)
    v = torch.arange(4, dtype=dtype)
    expect = torch.from_numpy(a.numpy() @ b.numpy())
    assert torch.equal(torch.mm(a, b), expect)
    assert torch.equal(torch.addmm(expect, a, b), expect * 2)
    assert torch.equal(torch.bmm(a[None], b[None])[0], expect)
    assert torch.equal(torch.baddbmm(expect[None], a[None], b[None])[0], expect * 2)
    assert torch.equal(torch.mv(a, v), torch.from_numpy(a.numpy() @ v.numpy()))
    assert torch.equal(torch.addmv(v[:3], a, v), torch.from_numpy(a.numpy() @ v.numpy()) + v[:3])
    assert torch.equal(torch.dot(v, v), torch.tensor(int(v @ v), dtype=dtype))


def test_functions_in_place_and_pow_half(portable: None) -> None:
    x = rand(1000, seed=9).abs() * 10
    root = torch.from_numpy(np.sqrt(x.numpy()))
    assert torch.equal(torch.sqrt(x), root) and torch.equal(x.pow(0.5), root)
    y = x.clone()
    y.sqrt_()
    assert torch.equal(y, root)
    for name, fn in portable_math.FUNCTIONS.items():
        assert torch.equal(getattr(torch, name)(x), fn(x)), name
        z = x.clone()
        getattr(z, f"{name}_")()
        assert torch.equal(z, fn(x)), name
    assert torch.equal(x.pow(2), x * x)
    assert torch.sqrt(torch.tensor([4, 9])).tolist() == [2.0, 3.0]  # integers: float result
    half = torch.tensor([4.0, 2.0], dtype=torch.float16)
    assert torch.sqrt(half).dtype == torch.float16


def test_softmax_backward_is_the_per_row_formula(portable: None) -> None:
    x = rand(3, 4, 50, seed=10).requires_grad_()
    g = rand(3, 4, 50, seed=11)
    out = torch.softmax(x, dim=-1)
    out.backward(g)
    o = out.detach()
    assert torch.equal(x.grad, o * (g - (g * o).sum(-1, keepdim=True)))  # type: ignore[arg-type]


def test_uninstall_gives_torch_its_kernels_back() -> None:
    was = portable_ops.installed()
    portable_ops.install()
    portable_ops.install()  # idempotent
    portable_ops.uninstall()
    try:
        assert not portable_ops.installed()
        a, b = rand(8, 600, seed=12), rand(600, 8, seed=13)
        assert not torch.equal(torch.mm(a, b), exact_matmul(a, b))  # torch's own BLAS sums
    finally:
        if was:
            portable_ops.install()
