"""`twinrun.core.exact_matmul`: the products are exact sums rounded once — the same bits whatever
computes the float64 product, within the stated bound of a float64 reference, with a defined
answer for NaN, inf, zeros and subnormals."""

from __future__ import annotations

import math

import pytest
import torch

from twinrun.core import exact_matmul as em


def wide(shape: tuple[int, ...], seed: int, spread: int = 40) -> torch.Tensor:
    """Values whose exponents span 2**-spread .. 2**spread, both signs."""
    g = torch.Generator().manual_seed(seed)
    mant = torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1
    exps = torch.randint(-spread, spread + 1, shape, generator=g).to(torch.float64)
    return (mant * torch.exp2(exps)).to(torch.float32)


def bound(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The stated error bound: within each piece of the inner dimension, each operand is rounded
    to w bits below its line's largest power of two there (half a unit: 2**(e - w - 1)); plus
    float64's rounding where the pieces are added and the final rounding to float32."""
    n, size = em.pieces(a.shape[-1])
    w = em.slice_bits(size)
    err = torch.zeros(a.shape[:-1] + b.shape[-1:], dtype=torch.float64)
    for p in range(n):
        pa, pb = (
            a[..., p * size : (p + 1) * size].double(),
            b[..., p * size : (p + 1) * size, :].double(),
        )
        ea = torch.frexp(pa.abs().amax(-1, keepdim=True))[1].double()
        eb = torch.frexp(pb.abs().amax(-2, keepdim=True))[1].double()
        da, db = torch.exp2(ea - w - 1), torch.exp2(eb - w - 1)
        err += da * pb.abs().sum(-2, keepdim=True) + pa.abs().sum(-1, keepdim=True) * db
        err += pa.shape[-1] * da * db
    ref = a.double() @ b.double()
    return err * (1 + 2.0**-40) + n * ref.abs() * 2.0**-52 + ref.abs() * 2.0**-24 + 2.0**-149


@pytest.mark.parametrize("k", [1, 7, 128, 129, 512, 513, 2048, 2049, 5000, 2**14])
def test_within_the_bound_of_a_float64_reference(k: int) -> None:
    a, b = wide((6, k), 1), wide((k, 5), 2)
    got = em.exact_matmul(a, b).double()
    ref = a.double() @ b.double()
    assert bool(((got - ref).abs() <= bound(a, b)).all())


def test_the_slice_width_keeps_every_partial_sum_below_2_to_the_53() -> None:
    for k in (1, 2, 3, 64, 127, 128, 129, 512, 513, 4096, 10**5):
        n, size = em.pieces(k)
        assert size <= em.PIECE and n * size >= k > (n - 1) * size
        assert size * 2 ** (2 * em.slice_bits(size)) <= 2**53
    assert [em.slice_bits(k) for k in (1, 64, 128, 129, 512)] == [24, 23, 23, 22, 22]
    assert em.pieces(129) == (2, 65) and em.pieces(576) == (5, 116)


def test_the_float64_product_is_exact_so_any_summation_order_gives_the_same_bits() -> None:
    """The integer slices' products summed in reversed and permuted inner order (what another
    BLAS blocking would do) give the identical float64 result."""
    a, b = wide((8, 128), 3), wide((128, 9), 4)
    w = em.slice_bits(128)
    qa, _ = em._integer_slices(a.double(), -1, w)
    qb, _ = em._integer_slices(b.double(), -2, w)
    assert float(qa.abs().max()) <= 2**w and float(qb.abs().max()) <= 2**w
    assert bool((qa == qa.round()).all())
    base = qa @ qb
    perm = torch.randperm(128, generator=torch.Generator().manual_seed(0))
    assert torch.equal(base, qa[:, perm] @ qb[perm, :])
    by_hand = torch.zeros_like(base)
    for i in reversed(range(128)):  # one product at a time, last first
        by_hand += qa[:, i : i + 1] * qb[i : i + 1, :]
    assert torch.equal(base, by_hand)


def test_a_rows_result_does_not_depend_on_the_other_rows() -> None:
    """Scales are per row (and per piece): a row computed alone, in a batch, or beside a row
    with an outlier 2**60 larger gets the same bits (the batch-invariant mode relies on it)."""
    a, b = wide((6, 300), 14), wide((300, 5), 15)
    alone = torch.cat([em.exact_matmul(a[i : i + 1], b) for i in range(6)])
    assert torch.equal(em.exact_matmul(a, b), alone)
    loud = torch.cat([a, a[:1] * 2.0**60])
    assert torch.equal(em.exact_matmul(loud, b)[:6], alone)


def test_threads_do_not_change_the_bits() -> None:
    a, b = wide((64, 3000), 5), wide((3000, 48), 6)
    before = torch.get_num_threads()
    try:
        results = []
        for n in (1, 2, 4):
            torch.set_num_threads(n)
            results.append(em.exact_matmul(a, b))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(results[0], results[1]) and torch.equal(results[0], results[2])


def test_transposed_strided_and_batched_operands() -> None:
    a, b = wide((5, 40), 7), wide((40, 6), 8)
    plain = em.exact_matmul(a, b)
    assert torch.equal(em.exact_matmul(a.t().contiguous().t(), b.t().contiguous().t()), plain)
    big = wide((5, 80), 9)
    strided = big[:, ::2]
    assert torch.equal(em.exact_matmul(strided, b), em.exact_matmul(strided.contiguous(), b))
    batch = torch.stack([a, a * 2])
    out = em.exact_matmul(batch, torch.stack([b, b]))
    assert torch.equal(out[0], plain) and torch.equal(out[1], em.exact_matmul(a * 2, b))


def test_exactly_representable_results_are_exact() -> None:
    """Small integers: the exact product is a float32, so it is the result."""
    g = torch.Generator().manual_seed(10)
    a = torch.randint(-50, 50, (7, 300), generator=g).float()
    b = torch.randint(-50, 50, (300, 4), generator=g).float()
    assert torch.equal(em.exact_matmul(a, b), (a.double() @ b.double()).float())


def test_zeros_subnormals_and_signed_zeros() -> None:
    """Subnormals are ordinary values: exact where the exact result is a float32, within the
    bound where they meet values 2**140 larger."""
    sub = 2.0**-140
    a = torch.tensor([[0.0, 0.0], [sub, sub], [-0.0, 0.0], [sub, -3 * sub]])
    b = torch.tensor([[1.0, -0.0], [2.0, 4.0]])
    got = em.exact_matmul(a, b)
    assert torch.equal(got, (a.double() @ b.double()).float())
    assert got[1, 0].item() == 3 * sub and got[3, 1].item() == -12 * sub
    mixed_a, mixed_b = torch.tensor([[sub, 1.0]]), torch.tensor([[1.0], [2.0]])
    err = (em.exact_matmul(mixed_a, mixed_b).double() - mixed_a.double() @ mixed_b.double()).abs()
    assert bool((err <= bound(mixed_a, mixed_b)).all())


def test_non_finite_values_take_the_ieee_answer_decided_by_counts() -> None:
    inf, nan = math.inf, math.nan
    a = torch.tensor([[1.0, inf], [1.0, -inf], [0.0, inf], [1.0, nan], [inf, -inf], [1.0, 2.0]])
    b = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    got = em.exact_matmul(a, b)
    expect = torch.tensor([[inf, nan], [-inf, nan], [inf, nan], [nan, nan], [nan, nan], [3.0, 1.0]])
    assert torch.equal(torch.isnan(got), torch.isnan(expect))
    finite_or_inf = ~torch.isnan(expect)
    assert torch.equal(got[finite_or_inf], expect[finite_or_inf])
    col_inf = torch.tensor([[1.0, -inf], [2.0, 1.0]])
    row = torch.tensor([[3.0, 0.0], [-1.0, 1.0]])
    out = em.exact_matmul(row, col_inf)
    assert out[0, 1].item() == -inf and out[1, 1].item() == inf and out[0, 0].item() == 3.0
