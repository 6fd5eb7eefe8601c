"""`rounded_sumsq` (the extraction path `sumsq` tries first for float32/float16) gives exactly the
float of the exact path whenever it decides, says so when it cannot, and `sumsq` is then still
exact."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from twinrun.diag import extract
from twinrun.diag.checksum import SumSq, checksum_digest, checksum_digest_many, sumsq
from twinrun.diag.extract import rounded_sumsq, rounded_sumsq_rows
from twinrun.diag.flat import FlatLeaves


def exact(a: np.ndarray) -> float:
    """The exact sum of squares, rounded once (Fraction: no float arithmetic at all)."""
    total = sum((Fraction(float(v)) ** 2 for v in a.astype(np.float64).tolist()), Fraction(0))
    return float(total)  # Fraction -> float rounds correctly, ties to even


def accumulator(a: np.ndarray) -> float:
    """The binned exact path, which an accumulator always takes."""
    return SumSq().add(a).value()


def wide(n: int, seed: int, dtype: type = np.float32) -> np.ndarray:
    """Values spread over many binades (fewer for float16: all finite), signs mixed."""
    rng = np.random.default_rng(seed)
    spread = 6 if dtype == np.float32 else 1.5
    return (rng.standard_normal(n) * np.exp(rng.standard_normal(n) * spread)).astype(dtype)


@pytest.mark.parametrize("n", [1, 2, 3, 100, 4097])
@pytest.mark.parametrize("seed", range(4))
def test_equals_the_exact_sum_rounded_once(n: int, seed: int) -> None:
    a = wide(n, seed)
    assert rounded_sumsq(a) == exact(a)


B = extract._BLOCK


@pytest.mark.parametrize("n", [B - 1, B, B + 1, 3 * B + 17])
def test_across_block_edges_equals_the_binned_exact_path(n: int) -> None:
    one_binade = np.random.default_rng(n).uniform(1.0, 2.0, n).astype(np.float32)  # 24-bit
    for a in (wide(n, n), wide(n, n + 1, np.float16), np.full(n, 0.1, np.float32), one_binade):
        value = rounded_sumsq(a)
        assert value is not None
        assert value == accumulator(a)


def test_scales_subnormals_and_extremes() -> None:
    rng = np.random.default_rng(7)
    tiny = np.array([1.4e-45, 2.8e-45, 1e-40, 1.1754942e-38], np.float32)  # float32 subnormals
    cases = [
        tiny,
        np.concatenate([tiny, np.float32([1e30, -3.4e38])]),
        np.full(1000, 3.4e38, np.float32),
        (rng.standard_normal(5000) * 1e-30).astype(np.float32),
        (rng.standard_normal(5000) * 1e30).astype(np.float32),
        np.zeros(10, np.float32),
        np.zeros(0, np.float32),
        -np.ones(7, np.float32),
    ]
    for a in cases:
        assert rounded_sumsq(a) == exact(a), a[:4]


def test_random_integers_times_powers_of_two_match_the_binned_path() -> None:
    rng = np.random.default_rng(3)
    decided = 0
    for _ in range(400):
        n = int(rng.integers(1, 60))
        a = (rng.integers(-(2**24), 2**24, n) * 2.0 ** rng.integers(-60, 20, n)).astype(np.float32)
        value = rounded_sumsq(a)
        if value is not None:
            decided += 1
            assert value == accumulator(a)
        assert sumsq(a) == accumulator(a)
    assert decided >= 380  # undecided only near a midpoint between two floats


def test_a_midpoint_is_left_undecided_and_sumsq_still_rounds_it_to_even() -> None:
    # 1 + 2**-54 + 2**-54 = 1 + 2**-53: exactly halfway between 1 and the next float
    a = np.array([1.0, 2.0**-27, 2.0**-27], np.float32)
    assert rounded_sumsq(a) is None
    assert sumsq(a) == 1.0 == exact(a)  # ties to even
    above = np.array([1.0, 2.0**-27, 2.0**-27, 2.0**-60], np.float32)
    assert rounded_sumsq(above) == exact(above) == 1.0 + 2.0**-52


def test_non_finite_values() -> None:
    assert math.isnan(rounded_sumsq(np.array([1.0, np.nan, np.inf], np.float32)))
    assert math.isnan(rounded_sumsq(np.concatenate([np.ones(B, np.float32), [np.nan]])))
    assert rounded_sumsq(np.array([np.inf, 2.0], np.float32)) == math.inf
    assert rounded_sumsq(np.concatenate([np.float32([-np.inf]), np.ones(B)])) == math.inf


def test_sumsq_and_row_checksums_take_it_for_cpu_float_tensors(monkeypatch) -> None:
    x = torch.from_numpy(wide(3000, 11))
    calls: list[int] = []
    real = extract.rounded_sumsq

    def spy(a, levels=1):
        calls.append(a.shape[0])
        return real(a, levels)

    monkeypatch.setattr("twinrun.diag.checksum.rounded_sumsq", spy)
    ref = accumulator(x.numpy())
    assert sumsq(x) == ref
    assert checksum_digest(x)[0] == ref
    assert checksum_digest_many([x])[0] == ref
    assert checksum_digest_many([x[:1000], x[1000:]])[0] == ref
    assert sumsq(x.to(torch.bfloat16)) == accumulator(x.to(torch.bfloat16).float().numpy())
    assert calls == [3000, 3000, 3000, 3000, 3000]


def test_an_undecided_sum_goes_to_the_exact_path(monkeypatch) -> None:
    monkeypatch.setattr("twinrun.diag.checksum.rounded_sumsq", lambda a, levels=1: None)
    a = wide(500, 5)
    assert sumsq(a) == exact(a)
    assert checksum_digest_many([torch.from_numpy(a)])[0] == exact(a)


def test_rows_are_summed_apart_in_one_set_of_passes() -> None:
    rows = np.stack([wide(5000, 1), np.zeros(5000, np.float32), wide(5000, 2) * 1e-20,
                     np.full(5000, np.inf, np.float32)])  # fmt: skip
    got = rounded_sumsq_rows(rows)
    assert got[:3] == [accumulator(rows[0]), 0.0, accumulator(rows[2])]
    assert got[3] == math.inf
    wide_rows = np.stack([wide(3 * B + 5, 3), wide(3 * B + 5, 4)])  # blocks narrower than a row
    assert rounded_sumsq_rows(wide_rows) == [accumulator(r) for r in wide_rows]


def test_flat_leaves_of_one_length_with_a_midpoint_among_them() -> None:
    midpoint = torch.tensor([1.0, 2.0**-27, 2.0**-27])  # rounds to even: left undecided
    other = torch.tensor([3.0, 4.0, 5.0])
    leaves = [[midpoint], [other], [-midpoint]]
    results = FlatLeaves(leaves, copy=False).results()
    assert [c for c, _ in results] == [1.0, 50.0, 1.0]
    assert results == [checksum_digest_many(parts) for parts in leaves]
