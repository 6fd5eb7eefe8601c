"""Matrix products whose bytes cannot depend on the BLAS, the CPU or the thread count.

`exact_matmul(a, b)` computes `a @ b` (batched or not) for floating-point operands by a scheme
in which every partial sum is exact, followed by one deterministic rounding:

1. **Slice** (exact): the inner dimension is cut into equal pieces of at most `PIECE` indices.
   Within each piece, each row of `a` (each column of `b`) is scaled by `2**(w - e)`, where
   `2**e` is the smallest power of two above that piece of the line's largest magnitude, and
   rounded to the nearest integer (ties to even): an integer-valued slice with `|q| <= 2**w`.
   This is the one approximation: an element keeps the bits of its piece's range down to
   `2**(e - w - 1)`. A row's scales depend on that row alone, so a row's result does not depend
   on the other rows of its batch; an outlier channel of the activations costs only the other
   entries of its own piece their low bits.
2. **Multiply** (exact): each piece's slices are multiplied in float64 by whatever BLAS torch
   has (MKL, OpenBLAS, any blocking, any vector width, any thread count, with or without FMA):
   every product is an integer below `2**(2w)` and every partial sum of a piece is an integer
   below `2**53`, so each is exact and the same in every order.
3. **Scale, add, round**: each piece's integer result is scaled back by its two powers of two
   (exact), the pieces are added one after another in float64 (a fixed sequence of IEEE
   additions), and the sum is rounded once to the operands' dtype.

`w = (53 - log2(piece)) // 2`: 23 bits for pieces of up to 128 indices. On SmolLM2's forward
(massive activations up to 2.6e4 at layer 15) the hidden states stay within 1.5e-6 of a float64
reference (norm-relative) where float32's own BLAS is within 9.4e-7 (and within 6.4e-7 vs
7.0e-7 at layer 15); tests/unit/test_exact_matmul.py checks the bound against float64.

Non-finite inputs take a defined path: a result element is NaN when its row or column holds a
NaN or when the products it sums hold inf * 0 or both +inf and -inf, else +inf or -inf when a
product is infinite — decided by exact counts (integer-valued indicator products), so no BLAS
shortcut can change it. Zeros, signed zeros and float32 subnormals are ordinary values in
float64 (a result that is exactly zero is +0).
"""

from __future__ import annotations

import torch

PIECE = 128  # inner indices per exact float64 product: 23-bit slices


def slice_bits(k: int) -> int:
    """The slice width for a piece of `k` inner indices: the largest w with
    `k * 2**(2w) <= 2**53` (|q| <= 2**w after rounding)."""
    return min(24, (53 - (max(1, k) - 1).bit_length()) // 2)


def pieces(k: int) -> tuple[int, int]:
    """(number of pieces, piece size): the inner dimension cut into pieces of `size` indices
    (the last one shorter), at most PIECE, as equal as that allows."""
    n = -(-k // PIECE)
    return n, -(-k // n)


def pow2(exponent: torch.Tensor) -> torch.Tensor:
    """2**exponent as float64, exactly (built from the bits: no pow or exp kernel); exponent
    within float64's normal range [-1022, 1023]."""
    return ((exponent.to(torch.int64) + 1023) << 52).view(torch.float64)


def _abs_max(x: torch.Tensor, dim: int) -> torch.Tensor:
    """The largest magnitude along dim (NaN when the line holds one), in one pass each way."""
    return torch.maximum(x.amax(dim=dim, keepdim=True), x.amin(dim=dim, keepdim=True).neg())


def _integer_slices(x: torch.Tensor, dim: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Integer-valued float64 slices of x along `dim` and each line's exponent e as int64 (the
    line's largest magnitude is below 2**e): x ≈ q * 2**(e - w), |q| <= 2**w. The maximum is
    taken in x's own dtype (exact), the scaling promotes to float64 (exact)."""
    e = torch.frexp(_abs_max(x, dim).to(torch.float64))[1].to(torch.int64)  # m * 2**e, m < 1
    return torch.round_(x * pow2(w - e)), e


def _nonfinite(a: torch.Tensor, b: torch.Tensor, prod: torch.Tensor) -> torch.Tensor:
    """Overwrite the elements of `prod` whose sums meet a NaN or an infinity, by exact counts."""

    pinf_a, ninf_a = a == float("inf"), a == float("-inf")
    pinf_b, ninf_b = b == float("inf"), b == float("-inf")
    fin_a, fin_b = torch.isfinite(a), torch.isfinite(b)
    pos = (
        _counts(pinf_a, b > 0)
        + _counts(ninf_a, b < 0)
        + _counts(fin_a & (a > 0), pinf_b)
        + _counts(fin_a & (a < 0), ninf_b)
    )
    neg = (
        _counts(pinf_a, b < 0)
        + _counts(ninf_a, b > 0)
        + _counts(fin_a & (a > 0), ninf_b)
        + _counts(fin_a & (a < 0), pinf_b)
    )
    nan = (
        _counts(torch.isnan(a), torch.ones_like(fin_b))
        + _counts(torch.ones_like(fin_a), torch.isnan(b))
        + _counts(pinf_a | ninf_a, b == 0)
        + _counts(a == 0, pinf_b | ninf_b)
        + (pos > 0).to(torch.float64) * (neg > 0).to(torch.float64)
    )
    out = torch.where(pos > 0, torch.full_like(prod, float("inf")), prod)
    out = torch.where(neg > 0, torch.full_like(prod, float("-inf")), out)
    return torch.where(nan > 0, torch.full_like(prod, float("nan")), out)


def _counts(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x @ y of 0/1 indicators in float64: exact counts below 2**53 in any order."""
    x64, y64 = x.to(torch.float64), y.to(torch.float64)
    return _blas(x64, y64)


def _blas(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The float64 product by torch's own BLAS kernel (the out= overload, which twinrun's
    portable registration leaves alone)."""
    if x.dim() == 2:
        out = torch.empty(x.shape[0], y.shape[1], dtype=torch.float64)
        return torch.mm(x, y, out=out)
    out = torch.empty(x.shape[0], x.shape[1], y.shape[2], dtype=torch.float64)
    return torch.bmm(x, y, out=out)


def exact_product64(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b (2-D, or 3-D batched) in float64: exact sums of the integer slices, scaled back.
    The caller rounds once to its dtype."""
    k = a.shape[-1]
    finite = bool(torch.isfinite(_abs_max(a, -1)).all() and torch.isfinite(_abs_max(b, -2)).all())
    clean_a = a if finite else torch.nan_to_num(a, nan=0.0, posinf=0.0, neginf=0.0)
    clean_b = b if finite else torch.nan_to_num(b, nan=0.0, posinf=0.0, neginf=0.0)
    n, size = pieces(k)
    w = slice_bits(size)
    acc = None
    for start in range(0, k, size):  # each piece exact, scaled back exactly; added in order
        stop = min(start + size, k)
        qa, ea = _integer_slices(clean_a[..., start:stop], -1, w)  # per row of a
        qb, eb = _integer_slices(clean_b[..., start:stop, :], -2, w)  # per column of b
        part = _blas(qa, qb).mul_(pow2((ea - w).clamp(-1022, 1023)))
        part.mul_(pow2((eb - w).clamp(-1022, 1023)))
        acc = part if acc is None else acc.add_(part)
    assert acc is not None
    return acc if finite else _nonfinite(a, b, acc)


def exact_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for 2-D or 3-D (batched) operands, rounded once to a's dtype."""
    return exact_product64(a, b).to(a.dtype)
