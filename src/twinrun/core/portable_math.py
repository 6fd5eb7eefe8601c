"""Transcendental functions and `sqrt` with one result on every x86-64 CPU, by construction.

torch sends float32 and float64 `sqrt`, `exp`, `log`, `log2`, `log10`, `tanh`, `erf` and
`pow(x, 0.5)` (and a few others no supported model trains through) to MKL's vector-math
library, which picks its code per CPU and is not correctly rounded. Each function here is built
from operations whose result is fixed: IEEE additions, multiplications, divisions and
comparisons (correctly rounded, one answer), `frexp` and power-of-two scaling (exact), and ATen's
own vectorised `rsqrt`, `exp2`, `expm1`, `log1p` and `gelu` — fixed instruction sequences (Sleef's
and ATen's polynomials) compiled per capability, which the portable mode pins to AVX2, so every
CPU runs the same ones (tests/unit/core/test_portable_math.py shows that no MKL branch moves them).

- `sqrt` (float32) is correctly rounded: a candidate within one unit in the last place, then the
  two neighbouring midpoints squared exactly in float64 decide the rounding — the one IEEE answer.
  float64: `x * rsqrt(x)` and one Newton correction, a fixed sequence (within an ulp or two).
- `exp`: `n = round(x / ln 2)`, `r = x - n*ln2_hi - n*ln2_lo` (Cody–Waite: `n*ln2_hi` is exact),
  `exp(x) = 2**n * exp2(r / ln 2)` in float64, scaled by two exact powers of two.
- `log`: `x = m * 2**e` with `m` in [sqrt(1/2), sqrt(2)) (exact), `log(x) = log1p(m - 1) +
  e*ln2_hi + e*ln2_lo` in float64 (`m - 1` is exact); `log2`, `log10` scale it in float64.
- `tanh`: `t = expm1(2|x|)`, `tanh = sign(x) * t / (t + 2)` in float64 (±1 beyond |x| = 20).
- `erf`: from ATen's exact GELU in float64, `erf(y) = 2*gelu(y*sqrt2)/(y*sqrt2) - 1`; `2y/sqrt(pi)`
  below |y| = 2**-20, where that is erf to float64's precision.

float32 inputs are computed in float64 and rounded once; the functions keep IEEE's special
values (±0, ±inf, NaN, negative arguments of sqrt and log).
"""

from __future__ import annotations

import math

import torch

from twinrun.core.digit_kernels import pow2

F64 = torch.float64
LN2_HI = 6.93147180369123816490e-01  # ln 2 rounded to 32 significant bits: n * LN2_HI is exact
LN2_LO = 1.90821492927058770002e-10  # ln 2 - LN2_HI
INV_LN2 = 1.0 / math.log(2.0)
SQRT_HALF = math.sqrt(0.5)
SQRT2 = math.sqrt(2.0)
TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def _scale2(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """x * 2**n for integer-valued float64 n in [-2200, 2200], as two exact power-of-two
    factors (each within float64's normal range)."""
    n = n.clamp(-2200, 2200).to(torch.int64)
    half = torch.div(n, 2, rounding_mode="floor")
    return x * pow2(half.clamp(-1022, 1023)) * pow2((n - half).clamp(-1022, 1023))


def exp64(x: torch.Tensor) -> torch.Tensor:
    x = x.to(F64)
    n = torch.round(x * INV_LN2).clamp(-2200, 2200)
    r = (x - n * LN2_HI) - n * LN2_LO
    y = _scale2(torch.exp2(r * INV_LN2), n)
    y = torch.where(x == float("inf"), x, y)  # inf - n*ln2 is NaN
    return torch.where(x == float("-inf"), torch.zeros_like(x), y)


def log64(x: torch.Tensor) -> torch.Tensor:
    x = x.to(F64)
    m, e = torch.frexp(x)
    low = m.abs() < SQRT_HALF
    m = torch.where(low, m * 2.0, m)
    e = (e - low.to(e.dtype)).to(F64)
    y = torch.log1p(m - 1.0) + e * LN2_HI + e * LN2_LO
    y = torch.where(x == float("inf"), x, y)
    return torch.where(x == 0, torch.full_like(x, float("-inf")), y)


def tanh64(x: torch.Tensor) -> torch.Tensor:
    x = x.to(F64)
    a = x.abs()
    t = torch.expm1(torch.clamp(a, max=20.0) * 2.0)
    y = torch.where(a > 20.0, torch.ones_like(a), t / (t + 2.0))
    return torch.copysign(y, x)


def erf64(x: torch.Tensor) -> torch.Tensor:
    x = x.to(F64)
    z = x * SQRT2
    y = 2.0 * torch.nn.functional.gelu(z) / z - 1.0
    y = torch.where(x.abs() < 2.0**-20, x * TWO_OVER_SQRT_PI, y)
    y = torch.where(x == float("inf"), torch.ones_like(x), y)
    return torch.where(x == float("-inf"), -torch.ones_like(x), y)


def sqrt64(x: torch.Tensor) -> torch.Tensor:
    x = x.to(F64)
    r = torch.rsqrt(x)
    y = x * r
    y = y + (x - y * y) * (r * 0.5)  # one Newton correction
    return torch.where((x == 0) | (x == float("inf")), x, y)  # sqrt(-0) = -0


def sqrt32(x: torch.Tensor) -> torch.Tensor:
    """Correctly rounded float32 sqrt: every candidate's midpoints squared exactly in float64."""
    x64 = x.to(F64)
    y = sqrt64(x64).to(torch.float32)
    finite = torch.isfinite(y) & (y > 0)
    y64 = y.to(F64)
    ulp = _ulp32(y64)
    hi = y64 + ulp * 0.5  # 25 significant bits: its square (50 bits) is exact in float64
    lo = y64 - _ulp32_below(y64) * 0.5
    up = finite & (hi * hi < x64)
    down = finite & (lo * lo > x64)
    y = torch.where(up, torch.nextafter(y, torch.full_like(y, float("inf"))), y)
    return torch.where(down, torch.nextafter(y, torch.zeros_like(y)), y)


def _ulp32(y64: torch.Tensor) -> torch.Tensor:
    """The gap from a positive float32 value (held in float64) to the next float32 above it."""
    y = y64.to(torch.float32)
    return torch.nextafter(y, torch.full_like(y, float("inf"))).to(F64) - y64


def _ulp32_below(y64: torch.Tensor) -> torch.Tensor:
    y = y64.to(torch.float32)
    return y64 - torch.nextafter(y, torch.zeros_like(y)).to(F64)


def sqrt(x: torch.Tensor) -> torch.Tensor:
    return sqrt32(x) if x.dtype == torch.float32 else sqrt64(x).to(x.dtype)


def exp(x: torch.Tensor) -> torch.Tensor:
    return exp64(x).to(x.dtype)


def log(x: torch.Tensor) -> torch.Tensor:
    return log64(x).to(x.dtype)


def log2(x: torch.Tensor) -> torch.Tensor:
    return (log64(x) * INV_LN2).to(x.dtype)


def log10(x: torch.Tensor) -> torch.Tensor:
    return (log64(x) * (1.0 / math.log(10.0))).to(x.dtype)


def tanh(x: torch.Tensor) -> torch.Tensor:
    return tanh64(x).to(x.dtype)


def erf(x: torch.Tensor) -> torch.Tensor:
    return erf64(x).to(x.dtype)


FUNCTIONS = {
    "sqrt": sqrt,
    "exp": exp,
    "log": log,
    "log2": log2,
    "log10": log10,
    "tanh": tanh,
    "erf": erf,
}
