"""`twinrun.core.portable_math`: sqrt is correctly rounded; exp, log, log2, log10, tanh and erf
agree with a float64 reference rounded to float32; IEEE's special values are kept."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from twinrun.core import portable_math as pm


def every_kind_of_float32(n: int, seed: int) -> torch.Tensor:
    """Random bit patterns: positive normals and subnormals of every exponent."""
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(0, 0x7F800000, (n,), generator=g, dtype=torch.int64).to(torch.int32)
    return bits.view(torch.float32)


def test_sqrt_is_correctly_rounded_on_every_exponent() -> None:
    x = every_kind_of_float32(300_000, 0)
    assert torch.equal(pm.sqrt(x), torch.from_numpy(np.sqrt(x.numpy())))  # IEEE sqrtps


def test_sqrt_of_perfect_squares_and_near_midpoints() -> None:
    y = torch.arange(1, 4097, dtype=torch.float32)
    assert torch.equal(pm.sqrt(y * y), y)
    x = torch.nextafter(y * y, torch.full_like(y, math.inf))
    assert torch.equal(pm.sqrt(x), torch.from_numpy(np.sqrt(x.numpy())))


@pytest.mark.parametrize(
    ("name", "reference", "low", "high"),
    [
        ("exp", np.exp, -103.0, 88.0),
        ("log", np.log, 1e-38, 1e30),
        ("log2", np.log2, 1e-30, 1e30),
        ("log10", np.log10, 1e-30, 1e30),
        ("tanh", np.tanh, -12.0, 12.0),
    ],
)
def test_functions_match_float64_rounded_to_float32(
    name: str, reference: object, low: float, high: float
) -> None:
    g = torch.Generator().manual_seed(1)
    if name.startswith("log"):
        x = torch.exp(torch.rand(200_000, generator=g, dtype=torch.float64)
                      * (math.log(high) - math.log(low)) + math.log(low)).float()  # fmt: skip
    else:
        x = (torch.rand(200_000, generator=g, dtype=torch.float64) * (high - low) + low).float()
    got = pm.FUNCTIONS[name](x)
    ref = torch.from_numpy(reference(x.double().numpy())).float()  # type: ignore[operator]
    assert int((got != ref).sum()) <= 2  # within float64's rounding of the same value


def test_erf_matches_float64_rounded_to_float32() -> None:
    xs = [i / 997 - 4.0 for i in range(8000)] + [1e-30, -1e-8, 3e-7]
    x = torch.tensor(xs, dtype=torch.float32)
    ref = torch.tensor([math.erf(v) for v in x.double().tolist()], dtype=torch.float64).float()
    assert int((pm.erf(x) != ref).sum()) <= 2


def test_float64_forms_are_within_a_few_ulps() -> None:
    def rel(got: torch.Tensor, ref: np.ndarray) -> float:
        r = torch.from_numpy(ref)
        return float(((got - r) / r).abs().max())

    x = torch.linspace(-700, 700, 100_001, dtype=torch.float64)
    assert rel(pm.exp64(x), np.exp(x.numpy())) < 4 * 2.0**-52
    pos = torch.linspace(1e-300, 1e300, 10_001, dtype=torch.float64)
    assert rel(pm.log64(pos), np.log(pos.numpy())) < 4e-16
    assert rel(pm.sqrt64(pos), np.sqrt(pos.numpy())) < 4e-16


def test_special_values() -> None:
    inf, nan = math.inf, math.nan
    x = torch.tensor([0.0, -0.0, inf, -inf, nan, -1.0])
    s = pm.sqrt(x)
    assert s[:3].tolist() == [0.0, -0.0, inf] and math.copysign(1, s[1].item()) == -1
    assert math.isnan(s[3].item()) and math.isnan(s[4].item()) and math.isnan(s[5].item())
    e = pm.exp(x)
    assert e[:4].tolist() == [1.0, 1.0, inf, 0.0] and math.isnan(e[4].item())
    lg = pm.log(x)
    assert lg[:3].tolist() == [-inf, -inf, inf] and math.isnan(lg[3].item())
    assert math.isnan(lg[5].item())
    t = pm.tanh(x)
    assert t[:4].tolist() == [0.0, -0.0, 1.0, -1.0] and math.copysign(1, t[1].item()) == -1
    er = pm.erf(x)
    assert er[:4].tolist() == [0.0, -0.0, 1.0, -1.0] and math.isnan(er[4].item())
