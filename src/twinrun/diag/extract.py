"""The correctly rounded sum of squares of float32/float16 data in a few vector passes.

`rounded_sumsq(a)` gives the same float as the exact path in `twinrun.diag.checksum` (the exact
sum of the squares, rounded once to nearest, ties to even) without building the exact sum: it
bounds the sum tightly enough to know how it rounds, and says so, or returns None when it cannot
tell (a sum within about 2^-130 of a rounding boundary), and the caller takes the exact path.

How (Rump–Ogita–Oishi extraction, with the rounding decided as in their NearSum):

* Each block of at most 2^16 values is widened to float64 and squared: exact, since a float32
  square has at most 48 significant bits. With the block maximum below 2^e and n <= 2^lg values,
  sigma = 1.5 * 2^(g+52) with g = e + lg - 53 splits every square v exactly into q = (v + sigma)
  - sigma, a multiple of 2^g, and the remainder r = v - q, |r| <= 2^(g-1). The sum of the q is
  exact in float64 in any order (it stays below 2^(g+53)). `levels` such splits are made, each
  on the remainders of the last, one level lower (e = g).
* The last remainders are summed in plain float64: whatever the order of the additions, that
  sum is within gamma(n-1) * n * 2^(g-1) < n^2 * 2^(g-54) of their exact sum (Higham's bound for
  any summation tree), so the exact total T lies within B = the sum of n^2 * 2^(g-53) over the
  blocks of the float sum of every term. `math.fsum` rounds (terms - B) and (terms + B)
  correctly; when both round to the same float, so does T (rounding is monotone), and that float
  is the answer. One level leaves B below about 2^-57 of T (n <= 2^16), so a sum is undecided
  only when it lies that close to the midpoint between two floats; three levels leave about
  2^-130, and a sum still undecided is a midpoint in all but name: the exact path decides it.

Every pass is a plain numpy ufunc or sum over a block that stays in cache: no binning, no
scatter, no Python per value. Non-finite inputs decide at once: NaN if any value is NaN, else
inf if any is infinite.
"""

from __future__ import annotations

import math
import threading
from typing import Any

__all__ = ["rounded_sumsq"]

_BLOCK = 1 << 16  # values per block: 512 KiB of float64 squares, within a core's L2
_scratch = threading.local()


def _buffers() -> tuple[Any, Any]:
    """Per-thread scratch: the block's squares and one temporary."""
    bufs = getattr(_scratch, "bufs", None)
    if bufs is None:
        import numpy as np

        bufs = (np.empty(_BLOCK, dtype=np.float64), np.empty(_BLOCK, dtype=np.float64))
        _scratch.bufs = bufs
    return bufs


def _block_terms(x: Any, levels: int, terms: list[float]) -> float:
    """Append one block's exact level sums and its remainders' float sum to `terms`; return the
    block's bound, or a non-finite maximum."""
    import numpy as np

    sq, tmp = _buffers()
    n = x.shape[0]
    s, t = sq[:n], tmp[:n]
    s[...] = x  # widen: exact
    np.multiply(s, s, out=s)  # exact: at most 48 significant bits
    m = float(s.max())
    if not math.isfinite(m):
        return m
    if m == 0.0:
        return 0.0
    lg = max(2, (n - 1).bit_length())  # n <= 2**lg
    e = g = math.frexp(m)[1]  # every term < 2**e
    for _ in range(levels):
        g = e + lg - 53
        sigma = math.ldexp(1.5, g + 52)
        np.add(s, sigma, out=t)
        np.subtract(t, sigma, out=t)  # every term rounded to a multiple of 2**g, exactly
        terms.append(float(t.sum()))  # exact: every partial sum stays below 2**(g+53)
        np.subtract(s, t, out=s)  # the remainders, |r| <= 2**(g-1)
        e = g
    terms.append(float(s.sum()))  # within gamma(n-1) * n * 2**(g-1) of their exact sum
    return math.ldexp(float(n * n), g - 1 - 52)  # at least that: gamma(n-1) < n * 2**-53


def _decide(terms: list[float], bounds: list[float]) -> float | None:
    """The float that every value within sum(bounds) of sum(terms) rounds to, or None."""
    low = math.fsum([*terms, *(-b for b in bounds)])
    high = math.fsum([*terms, *bounds])
    return low if low == high else None


def rounded_sumsq(a: Any, levels: int = 1) -> float | None:
    """The correctly rounded exact sum of squares of a 1-D float32/float16 numpy array, or None
    when `levels` extraction levels (1 or more) cannot decide its rounding (the caller then
    computes it exactly; see the module docstring). One thread: the passes are short, and
    numpy's hand-offs of the GIL between threads would cost more than a second core gains."""
    terms: list[float] = []
    bounds: list[float] = []
    nan = inf = False
    for off in range(0, a.shape[0], _BLOCK):
        b = _block_terms(a[off : off + _BLOCK], levels, terms)
        if math.isnan(b):
            nan = True
        elif math.isinf(b):
            inf = True
        elif b:
            bounds.append(b)
    if nan:
        return math.nan
    if inf:
        return math.inf
    value = _decide(terms, bounds)
    if value is None and levels < 3:
        return rounded_sumsq(a, 3)
    return value
