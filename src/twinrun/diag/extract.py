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

__all__ = ["rounded_sumsq", "rounded_sumsq_rows"]

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


class _Row:
    """One sum being bounded: its exact level sums and float remainder sums (`terms`), its
    blocks' bounds, and whether a value was NaN / infinite."""

    __slots__ = ("terms", "bounds", "nan", "inf")

    def __init__(self) -> None:
        self.terms: list[float] = []
        self.bounds: list[float] = []
        self.nan = False
        self.inf = False

    def value(self) -> float | None:
        """The float every value within the bounds of the terms rounds to, or None."""
        if self.nan:
            return math.nan
        if self.inf:
            return math.inf
        low = math.fsum([*self.terms, *(-b for b in self.bounds)])
        high = math.fsum([*self.terms, *self.bounds])
        return low if low == high else None


def _block(x: Any, levels: int, rows: list[_Row]) -> None:
    """Add one block (`x`: a rows x n array, or a list of rows of n values; at most _BLOCK
    values) to each row's terms and bounds."""
    import numpy as np

    sq, tmp = _buffers()
    r, n = len(x), len(x[0])
    s, t = sq[: r * n].reshape(r, n), tmp[: r * n].reshape(r, n)
    # widened (exact), then squared in float64 (exact: at most 48 significant bits)
    if isinstance(x, list):
        for i, xi in enumerate(x):
            np.square(xi, out=s[i], dtype=np.float64)
    else:
        np.square(x, out=s, dtype=np.float64)
    lg = max(2, (n - 1).bit_length())  # n <= 2**lg
    es: list[int | None] = []
    for row, m in zip(rows, s.max(axis=1).tolist(), strict=True):
        row.nan |= math.isnan(m)
        row.inf |= math.isinf(m)
        es.append(math.frexp(m)[1] if math.isfinite(m) and m > 0.0 else None)  # all < 2**e
    sigma = np.zeros((r, 1))  # 0 for a row of zeros (or a non-finite row: not used)
    with np.errstate(invalid="ignore"):
        for _ in range(levels):
            for i, e in enumerate(es):
                if e is not None:
                    sigma[i, 0] = math.ldexp(1.5, e + lg - 53 + 52)  # g = e + lg - 53
            np.add(s, sigma, out=t)
            np.subtract(t, sigma, out=t)  # every term rounded to a multiple of 2**g, exactly
            for row, q in zip(rows, t.sum(axis=1).tolist(), strict=True):
                row.terms.append(q)  # exact: every partial sum stays below 2**(g+53)
            np.subtract(s, t, out=s)  # the remainders, |r| <= 2**(g-1)
            es = [None if e is None else e + lg - 53 for e in es]  # the next level: e = g
        rests = s.sum(axis=1).tolist()  # within gamma(n-1) * n * 2**(g-1) of the exact sums
    for row, rest, g in zip(rows, rests, es, strict=True):
        if g is not None:
            row.terms.append(rest)
            row.bounds.append(math.ldexp(float(n * n), g - 53))  # > gamma(n-1) * n * 2**(g-1)


def rounded_sumsq_rows(a: Any, levels: int = 1) -> list[float | None]:
    """`rounded_sumsq` of each row of a 2-D float32/float16 numpy array, or of each of a list
    of 1-D arrays of one length, in the same passes (several leaves of one length cost the
    passes of one)."""
    r, n = len(a), len(a[0])
    rows = [_Row() for _ in range(r)]
    width = max(1, _BLOCK // max(r, 1))
    for off in range(0, n, width):
        x = [ai[off : off + width] for ai in a] if isinstance(a, list) else a[:, off : off + width]
        _block(x, levels, rows)
    out = [row.value() for row in rows]
    if levels < 3:
        for i, v in enumerate(out):
            if v is None:
                out[i] = rounded_sumsq_rows([a[i]], 3)[0]
    return out


def rounded_sumsq(a: Any, levels: int = 1) -> float | None:
    """The correctly rounded exact sum of squares of a 1-D float32/float16 numpy array, or None
    when `levels` extraction levels (1 or more; 3 are tried before giving up) cannot decide its
    rounding (the caller then computes it exactly; see the module docstring). One thread: the
    passes are short, and numpy's hand-offs of the GIL between threads would cost more than a
    second core gains."""
    return rounded_sumsq_rows(a.reshape(1, -1), levels)[0]
