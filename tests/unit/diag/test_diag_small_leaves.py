"""Small leaves (a step's loss, learning rate, sampled indices, tokens) are checksummed and
hashed in Python: the same floats and digests as the numpy path gives the same values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from twinrun.diag.checksum import (
    SumSq,
    checksum_digest,
    checksum_digest_many,
    digest,
    digest_many,
    sumsq,
)

TINY = 5e-324
FLOATS = [0.0, -0.0, 1.5, -2.25, TINY, 1e-300, 1e300, 1.7976931348623157e308, 2.0**-537, 0.1]
INTS = [0, 1, -1, 2**31, -(2**40) + 3, 2**63 - 1, -(2**63), 259]


def general(values: np.ndarray) -> tuple[float, str]:
    """The numpy path's checksum and digest (neither takes the small path)."""
    return sumsq(values), digest(values)


def same(a: tuple[float, str], b: tuple[float, str]) -> bool:
    return a[1] == b[1] and (a[0] == b[0] or (math.isnan(a[0]) and math.isnan(b[0])))


SPECIAL = [[math.inf, 1.0], [math.nan, -math.inf], [-math.inf]]


@pytest.mark.parametrize("values", [[x] for x in FLOATS] + [FLOATS, *SPECIAL])
def test_floats(values: list[float]) -> None:
    want = general(np.asarray(values, dtype=np.float64))
    assert same(checksum_digest(values), want)
    assert same(checksum_digest(torch.tensor(values, dtype=torch.float64)), want)


@pytest.mark.parametrize("values", [[x] for x in INTS] + [INTS])
def test_ints(values: list[int]) -> None:
    want = general(np.asarray(values, dtype=np.int64))
    assert checksum_digest(values) == want
    assert checksum_digest(torch.tensor(values, dtype=torch.int64)) == want


def test_shape_is_part_of_the_digest() -> None:
    tokens = torch.arange(4 * 48, dtype=torch.int64).reshape(4, 48) % 259
    assert checksum_digest(tokens) == general(tokens.numpy())
    assert checksum_digest(tokens)[1] != checksum_digest(tokens.reshape(-1))[1]


def test_parts() -> None:
    parts = [
        torch.tensor([3, -4], dtype=torch.int64),
        torch.tensor([[0.5], [-0.0]], dtype=torch.float64),
    ]
    acc = SumSq()
    for p in parts:
        acc.add(p.numpy())
    assert checksum_digest_many(parts) == (acc.value(), digest_many([p.numpy() for p in parts]))
    assert checksum_digest_many(parts) == (25.25, checksum_digest_many(parts)[1])


@pytest.mark.parametrize(
    "values",
    [
        [True, False],  # bools: numpy's bool array
        [1, 2.5],  # mixed: float64
        [np.float32(1.5)],  # numpy scalars: numpy's dtype
        list(range(300)),  # past the small size
    ],
)
def test_what_the_small_path_leaves_goes_the_general_way(values: list[object]) -> None:
    assert checksum_digest(values) == general(np.asarray(values))


def test_ints_outside_int64_are_refused_as_before() -> None:
    with pytest.raises((TypeError, OverflowError)):
        checksum_digest([2**64])


def test_other_dtypes_and_sizes_are_unchanged() -> None:
    others = [
        torch.arange(5, dtype=torch.int32),
        torch.arange(300, dtype=torch.int64),
        torch.tensor([1.5], dtype=torch.float32),
        torch.empty(0, dtype=torch.int64),
    ]
    for t in others:
        assert checksum_digest(t) == general(t.numpy())
