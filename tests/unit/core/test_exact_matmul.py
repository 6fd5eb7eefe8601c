"""`twinrun.core.exact_matmul`: the products are exact integer sums of digit planes, combined by a
fixed sequence of IEEE operations — the same bits whichever engine multiplies the digits, within
the stated bound of a float64 reference, at or below float32's own BLAS error on random and
outlier-row data, with a defined answer for NaN, inf, zeros and subnormals."""

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
    return em.error_bound(a, b)


@pytest.mark.parametrize("k", [1, 7, 128, 129, 512, 513, 2048, 2049, 5000, 2**14])
def test_within_the_bound_of_a_float64_reference(k: int) -> None:
    a, b = wide((6, k), 1), wide((k, 5), 2)
    got = em.exact_matmul(a, b).double()
    ref = a.double() @ b.double()
    assert bool(((got - ref).abs() <= bound(a, b)).all())


def test_the_bound_is_not_loose() -> None:
    """The bound is within a few hundred times the error it bounds (a check that cannot fail
    would be a defect): on random data the largest ratio of error to bound is above 1e-3."""
    g = torch.Generator().manual_seed(11)
    a, b = torch.randn(64, 600, generator=g), torch.randn(600, 48, generator=g)
    err = (em.exact_product64(a, b) - a.double() @ b.double()).abs()
    assert 1e-3 < float((err / bound(a, b)).max()) <= 1.0


def norm_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.double() - ref).norm() / ref.norm())


@pytest.mark.parametrize("outliers", [False, True])
def test_as_accurate_as_float32s_own_blas(outliers: bool) -> None:
    """The stated accuracy: against a float64 reference, the norm-relative error is within 4x of
    float32's BLAS on the same operands — on Gaussian data, and with massive activations
    (every 16th row holds 2.6e4 in one channel, as SmolLM2's hidden states do)."""
    g = torch.Generator().manual_seed(12)
    a, b = torch.randn(256, 576, generator=g), torch.randn(576, 384, generator=g) * 0.05
    if outliers:
        a[::16, 7] = 2.6e4
    ref = a.double() @ b.double()
    ours, blas = norm_error(em.exact_matmul(a, b), ref), norm_error(a @ b, ref)
    assert ours <= 4 * blas, (ours, blas)
    worst = lambda x: float(((x.double() - ref).norm(dim=1) / ref.norm(dim=1)).max())  # noqa: E731
    assert worst(em.exact_matmul(a, b)) <= 4 * worst(a @ b)


def test_every_engine_gives_the_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The int8 engine (oneDNN) and the float64 engine (the BLAS on the same digits) agree."""
    a, b = wide((33, 700), 3), wide((700, 17), 4)
    batch_a, batch_b = torch.stack([a, a * 3]), torch.stack([b, -b])
    results = []
    for engine in ("int8", "float64"):
        monkeypatch.setenv("TWINRUN_EXACT_ENGINE", engine)
        assert em.engine() == engine
        results.append((em.exact_product64(a, b), em.exact_matmul(batch_a, batch_b)))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])


def test_the_product_is_the_truncated_integer_sum() -> None:
    """By hand: the digits recombine to q exactly, and the result is (sum over i + j <= 3 of
    A_i B_j 128**(3 - i - j)) * 2**(ea + eb - 2W + 21), exactly."""
    from twinrun.core import digit_kernels as dk

    a, b = wide((4, 50), 5), wide((50, 3), 6)
    arev, ea = dk.slice_torch(a, reverse=True)
    bdig, eb = dk.slice_torch(b.t(), reverse=False)
    k, base = 50, dk.BASE
    A = [arev[:, (3 - i) * k : (4 - i) * k].long() for i in range(4)]  # noqa: N806
    B = [bdig[:, j * k : (j + 1) * k].long() for j in range(4)]  # noqa: N806
    qa = sum(A[i] * base ** (3 - i) for i in range(4))
    scale_a = dk.pow2(dk.W - ea.long()).unsqueeze(1)
    assert torch.equal(qa.double(), torch.round(a.double() * scale_a))
    assert -64 <= int(min(x.min() for x in A + B)) and int(max(x.max() for x in A + B)) <= 63
    h = sum(A[i] @ B[j].t() * base ** (3 - i - j) for i in range(4) for j in range(4) if i + j < 4)
    expect = h.double() * dk.pow2(ea.long() - 2 * dk.W + 21).unsqueeze(1)
    expect = expect * dk.pow2(eb.long()).unsqueeze(0)
    assert torch.equal(em.exact_product64(a, b), expect)


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


def test_small_integer_products_round_to_the_exact_result() -> None:
    """Small integers whose exact products are float32 values: the left-out digits are far
    below half a unit of the result, so the rounding lands on it."""
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


def dk_exponents(a: torch.Tensor) -> torch.Tensor:
    from twinrun.core import digit_kernels as dk

    return dk.slice_lines(a, reverse=True)[1]


def test_a_row_with_a_few_loud_entries_is_computed_as_two() -> None:
    """The loud-row rule: at most 1 in 32 of the row's entries that are not zero within 2**5 of its
    largest. A Gaussian row
    is not split; a row with one 2.6e4 among values near 1 is; so is one with 18 loud entries of
    576, not one with 19. The split row's quiet entries keep their bits: its error is within the
    bounds of its two halves, a tenth of what the row's own range would allow."""
    g = torch.Generator().manual_seed(13)
    a = torch.randn(4, 576, generator=g)
    a[1, 7] = 2.6e4
    a[2, :18] = 1e3
    a[3, :19] = 1e3
    loud = em.outlier_rows(a, dk_exponents(a))
    assert loud is not None and loud[0].tolist() == [1, 2]
    assert loud[1][0].sum() == 1 and loud[1][1].sum() == 18
    b = torch.randn(576, 40, generator=g) * 0.05
    ref = a.double() @ b.double()
    err = (em.exact_product64(a, b) - ref).abs()[1]
    quiet = a[1:2].clone()
    quiet[0, 7] = 0.0
    alone = torch.zeros_like(quiet)
    alone[0, 7] = a[1, 7]
    halves = em.error_bound(quiet, b)[0] + em.error_bound(alone, b)[0]
    assert bool((err <= halves + ref[1].abs() * 2.0**-52).all())
    assert float(err.max()) < 0.1 * float(em.error_bound(a[1:2], b)[0].max())  # unsplit: 10x+


def test_zeros_a_row_is_padded_with_change_no_bit() -> None:
    """A batch-invariant forward pads each row's attention to a slot width with zeros, and a
    causal mask's probabilities are zeros: neither may move a bit. The padded row below has 2
    loud entries among 40 (1 in 20): not split, padded to 96 entries or not."""
    g = torch.Generator().manual_seed(5)
    a = torch.randn(3, 40, generator=g)
    a[1, :2] = 3e3
    b = torch.randn(40, 24, generator=g)
    pad_a = torch.cat([a, torch.zeros(3, 56)], dim=1)
    pad_b = torch.cat([b, torch.randn(56, 24, generator=g)], dim=0)  # meets only zeros of a
    pad_b[40:] *= torch.zeros(56, 1)  # ... and zeros of its own
    assert torch.equal(em.exact_matmul(pad_a, pad_b), em.exact_matmul(a, b))
    assert em.outlier_rows(a, dk_exponents(a)) is None
    assert em.outlier_rows(pad_a, dk_exponents(pad_a)) is None


def test_frozen_parameters_digit_planes_are_kept_and_made_again_when_they_change() -> None:
    g = torch.Generator().manual_seed(8)
    w = torch.nn.Parameter(torch.randn(24, 40, generator=g), requires_grad=False)
    x = torch.randn(5, 40, generator=g)
    em.forget_frozen()
    try:
        first = em.exact_matmul(x, w.t())
        assert torch.equal(first, em.exact_matmul(x, w.detach().clone().t()))
        assert em.frozen_bytes() == 4 * w.numel() + 4 * 24  # four int8 planes, one exponent a line
        assert torch.equal(em.exact_matmul(x, w.t()), first)  # from the kept planes
        with torch.no_grad():
            w.mul_(2.0)  # in place: the version counter moves
        assert torch.equal(em.exact_matmul(x, w.t()), em.exact_matmul(x, w.detach().clone().t()))
        w.data = torch.randn(24, 40, generator=g)  # new storage, no version moved
        assert torch.equal(em.exact_matmul(x, w.t()), em.exact_matmul(x, w.detach().clone().t()))
        trained = torch.nn.Parameter(torch.randn(24, 40, generator=g))  # takes a gradient
        em.exact_matmul(x, trained.detach().t())
        em.exact_matmul(x, trained.t().detach())
        assert em.frozen_bytes() == 4 * w.numel() + 4 * 24  # kept for w alone

        with torch.no_grad():
            w[3, 5] = float("inf")  # a non-finite column: no planes, the non-finite path
        assert em.frozen_bytes() == 4 * w.numel() + 4 * 24  # (stale until the next product)
        got, want = em.exact_matmul(x, w.t()), em.exact_matmul(x, w.detach().clone().t())
        assert torch.equal(got.isnan(), want.isnan()) and bool(got[:, 3].isinf().any())
        assert torch.equal(got.nan_to_num(), want.nan_to_num())
        assert em.frozen_bytes() == 0  # the one kept view holds no planes now
        with torch.no_grad():
            w[3, 5] = 1.0
        em.exact_matmul(x, w.t())

        half = torch.nn.Parameter(w.detach().bfloat16(), requires_grad=False)  # a bf16 base
        got = em.exact_matmul(x.bfloat16(), half.t())  # (its planes come from a float32 copy)
        assert torch.equal(got, em.exact_matmul(x.bfloat16(), half.detach().clone().t()))
        assert em.frozen_bytes() == 4 * w.numel() + 4 * 24  # the bf16 view holds no planes

        em.keep_frozen(False)  # a sharded base: nothing kept, the same bits
        assert em.frozen_bytes() == 0
        assert torch.equal(em.exact_matmul(x, w.t()), em.exact_matmul(x, w.detach().clone().t()))
        assert em.frozen_bytes() == 0
        em.forget_frozen()  # the next run keeps them again
        em.exact_matmul(x, w.t())
        assert em.frozen_bytes() > 0
        del w
        assert em.frozen_bytes() == 0  # the planes go with their parameter
    finally:
        em.forget_frozen()
