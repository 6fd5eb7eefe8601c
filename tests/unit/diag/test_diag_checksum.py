"""Exact sum-of-squares checksums and digests (twinrun.diag.checksum)."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import numpy as np
import pytest
import torch
import xxhash

from twinrun.diag.checksum import SumSq, digest, digest_many, sumsq

# decimal exponent ranges that stay finite (and reach subnormals) in each dtype
RANGES = {
    torch.float32: (-45.0, 18.0),
    torch.float16: (-7.5, 2.0),
    torch.bfloat16: (-40.0, 18.0),
    torch.float64: (-320.0, 150.0),
}


def exact_ref(x: torch.Tensor) -> float:
    """The correctly rounded exact sum of squares (math.fsum where the squares are exact)."""
    vals = x.double().tolist()
    if x.dtype == torch.float64:
        return float(sum(Fraction(v) ** 2 for v in vals))
    return math.fsum(v * v for v in vals)


def wide(dtype: torch.dtype, n: int, seed: int) -> torch.Tensor:
    rnd = random.Random(seed)
    lo, hi = RANGES[dtype]
    vals = [rnd.choice((-1.0, 1.0)) * 10.0 ** rnd.uniform(lo, hi) for _ in range(n)]
    return torch.tensor(vals, dtype=torch.float64).to(dtype)


@pytest.mark.parametrize("dtype", list(RANGES))
@pytest.mark.parametrize("n", [1, 5, 1000, 40000])
def test_matches_exact_sum_over_wide_exponent_range(dtype: torch.dtype, n: int) -> None:
    x = wide(dtype, n, seed=n)
    assert sumsq(x) == exact_ref(x)


@pytest.mark.parametrize("dtype", list(RANGES))
def test_rounding_ties_need_every_bit(dtype: torch.dtype) -> None:
    # B**2 + y**2 + y**2 is an exact tie (rounds to even: B**2); a tiny t**2 more tips it up
    b, y, t = (2.0**13, 2.0**-14, 2.0**-24) if dtype == torch.float16 else (1.0, 2.0**-27, 2.0**-60)
    x = torch.tensor([b, y, y], dtype=dtype)
    assert sumsq(x) == b * b
    x = torch.tensor([y, b, t, y], dtype=dtype)
    assert sumsq(x) == math.nextafter(b * b, math.inf)


def test_float64_subnormals_and_extremes() -> None:
    x = torch.tensor([5e-324, 1e-310, -3.3e-160, 1e-200, 2.2e-308], dtype=torch.float64)
    assert sumsq(x) == exact_ref(x)
    x = torch.tensor([1.0, 2.0**-27, 2.0**-27, 2.0**-600], dtype=torch.float64)
    assert sumsq(x) == 1.0 + 2.0**-52
    assert sumsq(torch.tensor([1e170], dtype=torch.float64)) == math.inf


@pytest.mark.parametrize("dtype", list(RANGES))
def test_order_split_merge_and_threads_do_not_change_a_bit(dtype: torch.dtype) -> None:
    x = wide(dtype, 140_001, seed=7)  # more than one internal block (2**17)
    ref = sumsq(x)
    perm = torch.randperm(x.numel(), generator=torch.Generator().manual_seed(1))
    assert sumsq(x[perm]) == ref
    assert sumsq(x.flip(0)) == ref
    parts = [x[:1], x[1:1000], x[1000:100_000], x[100_000:]]
    acc = SumSq()
    for p in parts:
        acc.merge(SumSq().add(p))
    assert acc.value() == ref
    one = SumSq()
    for p in reversed(parts):
        one.add(p)
    assert one.value() == ref and one.count == x.numel()
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        r1 = sumsq(x)
        torch.set_num_threads(2)
        r2 = sumsq(x)
    finally:
        torch.set_num_threads(old)
    assert r1 == r2 == ref


def test_large_tensor_threaded_chunks_equal_fsum() -> None:
    # more than one 2**20-element chunk: the Python-thread path runs when torch has >1 thread
    x = torch.randn((1 << 21) + 12345, generator=torch.Generator().manual_seed(0))
    ref = math.fsum((x.double() ** 2).tolist())
    old = torch.get_num_threads()
    try:
        results = set()
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            results.add(sumsq(x))
    finally:
        torch.set_num_threads(old)
    assert results == {ref}
    assert sumsq(x[: 1 << 20].reshape(1024, 1024).t()) == sumsq(x[: 1 << 20])  # non-contiguous
    assert sumsq(x.double()) == ref and sumsq(x.to(torch.bfloat16)) == exact_ref(
        x.to(torch.bfloat16)
    )


@pytest.mark.parametrize(
    "dtype", [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool]
)
def test_integers_exact(dtype: torch.dtype) -> None:
    info = torch.iinfo(dtype) if dtype != torch.bool else None
    lo, hi = (0, 1) if info is None else (info.min, info.max)
    rnd = random.Random(3)
    vals = [rnd.randint(lo, hi) for _ in range(5000)] + [lo, hi]
    x = torch.tensor(vals, dtype=dtype)
    exact = sum(int(v) ** 2 for v in vals)
    assert sumsq(x) == float(exact)  # int -> float conversion is correctly rounded
    assert sumsq(x.flip(0)) == sumsq(x)


def test_numpy_lists_and_scalars() -> None:
    a = np.array([1.5, -2.0, 3.25], dtype=np.float32)
    assert sumsq(a) == sumsq(torch.from_numpy(a)) == 1.5**2 + 4.0 + 3.25**2
    assert sumsq(a.astype(">f4")) == sumsq(a)  # big-endian arrays read correctly
    assert sumsq([1, 2, 3]) == 14.0
    assert sumsq(3.0) == 9.0 and sumsq(-7) == 49.0 and sumsq(True) == 1.0
    assert sumsq(np.array([2**64 - 1], dtype=np.uint64)) == float((2**64 - 1) ** 2)
    assert sumsq([]) == 0.0 and sumsq(torch.zeros(0)) == 0.0
    assert sumsq(0.1) == float(Fraction(0.1) ** 2)


def test_nan_and_inf() -> None:
    assert math.isnan(sumsq(torch.tensor([1.0, float("nan"), float("inf")])))
    assert sumsq(torch.tensor([1.0, float("-inf")])) == math.inf
    assert math.isnan(sumsq(float("nan")))
    acc = SumSq().add(torch.ones(3))
    acc.merge(SumSq().add(torch.tensor([float("nan")], dtype=torch.float64)))
    assert math.isnan(acc.value())


def test_digest_is_xxh3_128_over_the_frame() -> None:
    """A digest is XXH3-128 (seed 0) of the domain, then each tensor's frame written out here
    by hand: name length and name, rank and dims, byte length (big-endian), little-endian bytes."""
    x = torch.tensor([[1.5, -2.0, 0.0], [3.25, 1e-40, -0.0]], dtype=torch.float32)
    frame = (
        (7).to_bytes(4, "big") + b"float32" + (2).to_bytes(4, "big")
        + (2).to_bytes(8, "big") + (3).to_bytes(8, "big") + (24).to_bytes(8, "big")
        + np.asarray(x.numpy(), dtype="<f4").tobytes()
    )  # fmt: skip
    assert digest(x) == xxhash.xxh3_128(b"twinrun.tensor.v1\0" + frame).hexdigest()
    many = b"twinrun.tensors.v1\0" + (2).to_bytes(8, "big") + frame + frame
    assert digest_many([x, x]) == xxhash.xxh3_128(many).hexdigest()
    # the published XXH3-128 of the empty input (seed 0): the hash is the one its spec defines
    assert xxhash.xxh3_128(b"").hexdigest() == "99aa06d3014798d86001c324468d497f"


def test_digest_framing() -> None:
    x = torch.arange(6, dtype=torch.float32)
    assert digest(x) == digest(x.clone()) == digest(x.numpy())
    assert digest(x) != digest(x.reshape(2, 3))  # shape is framed
    assert digest(x) != digest(x.double())  # dtype is framed
    assert digest(x.reshape(2, 3).t()) == digest(x.reshape(2, 3).t().contiguous())
    b = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    assert digest(b) == digest(b.clone()) and digest(b) != digest(b.float())
    y = x.clone()
    y[3] = torch.nextafter(y[3], torch.tensor(10.0))
    assert digest(y) != digest(x) and len(digest(x)) == 32
    assert digest_many([x, y]) != digest_many([y, x])
    assert digest_many([x[:3], x[3:]]) != digest_many([x[:2], x[2:]])
    assert digest_many([x]) != digest(x)
