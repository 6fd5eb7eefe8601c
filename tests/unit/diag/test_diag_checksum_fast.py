"""The CPU fast paths of twinrun.diag.checksum (binned float32/16/bf16, small float64, int64
dot) agree bit for bit with the general torch path and with exact references."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from twinrun.diag.checksum import (
    _HB,
    _HB_FLUSH,
    SumSq,
    checksum_digest,
    checksum_digest_many,
    digest,
    digest_many,
    sumsq,
)


def general_path(x: torch.Tensor) -> float:
    """The torch (device) path, forced on a CPU tensor."""
    acc = SumSq()
    acc.count += x.numel()
    acc._add_flat(x.reshape(-1), str(x.dtype).removeprefix("torch."))
    return acc.value()


def spread(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64) * torch.exp(
        torch.randn(n, generator=g, dtype=torch.float64) * 6
    )
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", [1, _HB - 1, _HB, _HB + 1, 3 * _HB + 17])
def test_binned_path_equals_general_path(dtype: torch.dtype, n: int) -> None:
    x = spread(n, dtype, seed=n)
    assert sumsq(x) == general_path(x)
    assert sumsq(x.numpy() if dtype != torch.bfloat16 else x.float().numpy()) == sumsq(x)


def test_past_the_flush_and_across_threads() -> None:
    x = spread(_HB_FLUSH + 3 * _HB + 5, torch.float32, seed=1)
    ref = general_path(x)
    old = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            assert sumsq(x) == ref
    finally:
        torch.set_num_threads(old)
    acc = SumSq()
    for part in x.split(4099):  # many small parts share one buffer
        acc.add(part)
    assert acc.value() == ref and acc.count == x.numel()


def test_extremes_and_non_finite() -> None:
    x = torch.tensor([3.4028235e38, -3.4028235e38, 1e-45, 1.17e-38, 0.0, -0.0])
    assert sumsq(x) == float(sum(Fraction(v) ** 2 for v in x.double().tolist()))
    assert sumsq(torch.tensor([1.0, math.inf, 2.0])) == math.inf
    assert math.isnan(sumsq(torch.tensor([1.0, math.nan, -math.inf])))
    assert math.isnan(sumsq(torch.full((_HB + 3,), math.nan, dtype=torch.float16)))
    assert sumsq(torch.tensor([-math.inf], dtype=torch.bfloat16)) == math.inf
    acc = SumSq().add(torch.tensor([math.inf]))
    acc.add(torch.ones(3))
    assert acc.value() == math.inf


def test_small_float64_and_integers() -> None:
    x = torch.tensor([1e-300, -3.5, 2.0**-1074, 1e150], dtype=torch.float64)
    assert sumsq(x) == float(sum(Fraction(v) ** 2 for v in x.tolist()))
    for dtype in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool):
        hi = 2 if dtype == torch.bool else (100 if dtype != torch.int64 else 2**31 - 1)
        lo = 0 if dtype in (torch.bool, torch.uint8) else -hi
        v = torch.randint(lo, hi, (5000,), generator=torch.Generator().manual_seed(0)).to(dtype)
        assert sumsq(v) == float(sum(int(i) ** 2 for i in v.tolist())), dtype
    big = torch.tensor([2**62, -(2**62), 3], dtype=torch.int64)  # past the int64-dot bound
    assert sumsq(big) == float(2 * 2**124 + 9)
    assert sumsq(np.array([2**63 + 5], dtype=np.uint64)) == float((2**63 + 5) ** 2)


def test_checksum_digest_helpers_match_the_separate_functions() -> None:
    g = torch.Generator().manual_seed(3)
    parts = [
        torch.randn(3, 4, generator=g, requires_grad=True),
        torch.randn(5, generator=g),
        torch.randn(2, 3, generator=g).t(),  # not contiguous
    ]
    c, d = checksum_digest_many(parts)
    acc = SumSq()
    for p in parts:
        acc.add(p)
    assert c == acc.value()
    assert d == digest_many(parts) == digest_many([p.detach().contiguous() for p in parts])
    mixed = [torch.arange(4), torch.ones(2, dtype=torch.float64), np.ones(3, dtype=np.float32)]
    c, d = checksum_digest_many(mixed)
    assert c == 14.0 + 2.0 + 3.0 and d == digest_many(mixed)
    t = torch.randn(7, generator=g, dtype=torch.bfloat16)
    assert checksum_digest(t) == (sumsq(t), digest(t))
    assert digest(t) != digest(t.float())  # bfloat16 is hashed as its own bits


def test_flat_leaves_same_checksums_and_digests_as_each_leaf_part_by_part() -> None:
    from twinrun.diag.checksum import checksum_digest_many
    from twinrun.diag.flat import FlatLeaves

    g = torch.Generator().manual_seed(3)
    parts = [torch.randn(8, 64, generator=g), torch.randn(64, 8, generator=g).t(),  # strided
             torch.randn(3, generator=g) * 1e30, torch.tensor([0.0, -0.0, 1e-45])]  # fmt: skip
    parts.append(torch.randn(5, 7, generator=g, requires_grad=True))
    leaves = [
        parts,
        [p.detach() * 1e-20 for p in parts],  # the same shapes, other exponents
        [torch.nn.Parameter(torch.randn(4, 4, generator=g))],  # one part, a Parameter
        [torch.tensor([1.0, float("inf")]), torch.tensor([2.0])],  # inf only in this leaf
        [torch.tensor([float("nan")]), torch.ones(3)],  # NaN only in this leaf
        [torch.tensor([3.0]), torch.tensor([4.0])],  # 9 + 16, after the non-finite leaves
    ]
    assert all(FlatLeaves.fits(leaf) for leaf in leaves)
    group = FlatLeaves(leaves)
    before = [checksum_digest_many(leaf) for leaf in leaves]
    for leaf in leaves:  # a copy: later in-place updates do not reach it
        for p in leaf:
            p.data.add_(1.0)
    got = [group.leaf(i).checksum_digest() for i in range(len(leaves))]
    assert got[:4] + got[5:] == before[:4] + before[5:]
    assert math.isnan(got[4][0]) and got[4][1] == before[4][1]
    assert got[3][0] == math.inf and got[5][0] == 25.0
    assert got[0] != checksum_digest_many(leaves[0])


def test_flat_leaves_one_pass_matches_fsum_on_many_values() -> None:
    """Leaves large enough to fold more than once (2**20 values a fold) keep their own sums."""
    from twinrun.diag.flat import FlatLeaves

    g = torch.Generator().manual_seed(4)
    a = torch.randn(700_000, generator=g) * torch.exp(torch.randn(700_000, generator=g) * 8)
    b = torch.randn(600_000, generator=g)
    group = FlatLeaves([[a[:300_000], a[300_000:]], [b]])
    for i, t in enumerate((a, b)):
        want = math.fsum(float(x) ** 2 for x in t.double().tolist())
        assert group.leaf(i).checksum_digest()[0] == want


def test_flat_leaves_only_for_float32_cpu_tensors() -> None:
    from twinrun.diag.flat import FlatLeaves

    assert not FlatLeaves.fits([])
    assert not FlatLeaves.fits([torch.zeros(3), torch.zeros(3, dtype=torch.float64)])
    assert not FlatLeaves.fits([torch.zeros(3), np.zeros(3, dtype=np.float32)])
    assert FlatLeaves.fits([torch.zeros(3)])
