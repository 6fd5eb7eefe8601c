"""Matrix products whose bytes cannot depend on the BLAS, the CPU or the thread count.

`exact_matmul(a, b)` computes `a @ b` (batched or not) for floating-point operands by a scheme
in which every partial sum is an exact integer, followed by a fixed sequence of IEEE operations:

1. **Slice** (`twinrun.core.digit_kernels`): each row of `a` and each column of `b` (a *line*) is
   scaled by `2**(W - e)`, where `2**e` is the smallest power of two above the line's largest
   magnitude, and rounded to the nearest integer `q` (|q| <= 2**26, W = 26); `q` is written as
   four balanced base-128 digits `q = d0*2**21 + d1*2**14 + d2*2**7 + d3`, each in [-64, 63].
   The rounding is the one approximation of the operands: an element keeps the bits of its line's
   range down to `2**(e - 27)`. A line's scale depends on that line alone, so a row's result does
   not depend on the other rows of its batch, nor on zeros a line is padded with. A row of `a`
   whose range is set by a few loud entries (at most 1 in 32 of its entries that are not zero
   within 2**5 of its largest: SmolLM2's massive activations) is computed
   as two rows, its quiet entries at their own scale and its loud ones at theirs, added in
   float64 (`outlier_rows`): its quiet entries keep their bits.
2. **Multiply** (exact): the digit planes are multiplied as int8 matrices with int32 sums
   (`torch._int_mm`: oneDNN's integer GEMM on every x86-64 CPU, AMX or VNNI or AVX2) — every
   product is an integer and every sum exact, in any order, on any code path: digits within
   [-64, 63] never meet the 16-bit saturation that +-127 meets on AVX2 and AVX-512 without VNNI
   (oneDNN shifts one operand by 128 to make it unsigned: 2 * 191 * 64 < 2**15; tested under
   every `ONEDNN_MAX_CPU_ISA` cap on all-extreme blocks). The
   anti-diagonals `P_t = sum over i + j = t of A_i @ B_j` for t = 0..3 are one GEMM each over the
   concatenated inner dimension (the digit planes lie side by side, so P_t's operands are views).
   The products below t = 3 (weights 2**-28 and smaller of the leading term) are left out: a
   truncation of the exact product, the same on every machine. Operands with at most 14
   significant bits below their line's range (small integers) lose nothing to it.
3. **Combine**: `H = ((P0*128 + P1)*128 + P2)*128 + P3` in int64 (exact), then
   `H * 2**(ea - 2W + 21) * 2**eb` in float64 — exact: the float64 value is the truncated sum.
   It is rounded once, to the caller's dtype (for float32, in the same pass).

`ENGINE` says who multiplies the digit planes: "int8" (oneDNN's integer GEMM) or "float64"
(torch's float64 BLAS on the same digits: every sum is an integer below 2**53, so exact too) —
the same bits either way; `TWINRUN_EXACT_ENGINE=float64` chooses the second.

Accuracy (`error_bound`, tested against a float64 reference): per result element, the operands'
rounding (half a unit of each line's last kept bit, times the other operand's absolute sums), the
left-out anti-diagonals (at most `K * 64**2 * (3*2**14 + 2*2**7 + 1)` units of `2**(ea + eb -
2W)`), and the rounding to the dtype. On random and outlier-row data the norm-relative
error against float64 is at or below float32's own BLAS (docs/reproducibility.md quotes it).

Non-finite inputs take a defined path: a result element is NaN when its row or column holds a
NaN or when the products it sums hold inf * 0 or both +inf and -inf, else +inf or -inf when a
product is infinite — decided by exact counts (integer-valued indicator products), so no BLAS
shortcut can change it. Zeros, signed zeros and float32 subnormals are ordinary values (a
result that is exactly zero is +0).
"""

from __future__ import annotations

import os
import weakref
from typing import Any

import torch

from twinrun.core import digit_kernels as dk
from twinrun.core.digit_kernels import DIGITS, W

KEEP = DIGITS  # anti-diagonals kept: t = 0 .. KEEP - 1
MAX_INNER = 2**17  # (KEEP * K) digit products of at most 64**2 stay below 2**31


def engine() -> str:
    """Who multiplies the digit planes: "int8" unless TWINRUN_EXACT_ENGINE=float64."""
    return "float64" if os.environ.get("TWINRUN_EXACT_ENGINE") == "float64" else "int8"


def _abs_max(x: torch.Tensor, dim: int) -> torch.Tensor:
    """The largest magnitude along dim (NaN when the line holds one), in one pass each way."""
    return torch.maximum(x.amax(dim=dim, keepdim=True), x.amin(dim=dim, keepdim=True).neg())


SMALL = 2**21  # integer multiply-adds below which a GEMM runs on one thread


def _int_product(lhs: torch.Tensor, rhs: torch.Tensor, how: str) -> torch.Tensor:
    if how == "int8":
        # the portable mode turns oneDNN off for torch's float ops; with it off, `_int_mm` takes
        # a reference loop over 100x slower. Its integer sums are exact on every path, so it is
        # switched on for this call alone
        if torch._C._get_mkldnn_enabled():
            return _onednn_int_mm(lhs, rhs)
        torch._C._set_mkldnn_enabled(True)
        try:
            return _onednn_int_mm(lhs, rhs)
        finally:
            torch._C._set_mkldnn_enabled(False)
    return _blas(lhs.to(torch.float64), rhs.to(torch.float64)).to(torch.int32)


def _onednn_int_mm(lhs: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    if lhs.shape[0] * lhs.shape[1] * rhs.shape[1] >= SMALL:
        return torch._int_mm(lhs, rhs)
    # oneDNN opens its thread team even for a tiny GEMM, and on a busy machine waiting for the
    # team costs milliseconds: small ones run alone (the sums are exact either way)
    threads = torch.get_num_threads()
    if threads == 1:
        return torch._int_mm(lhs, rhs)
    torch.set_num_threads(1)
    try:
        return torch._int_mm(lhs, rhs)
    finally:
        torch.set_num_threads(threads)


def _product2d(a: torch.Tensor, b: torch.Tensor, how: str, dtype: torch.dtype) -> torch.Tensor:
    """a @ b (2-D, finite float32) by the scheme above: float64, or rounded once to float32."""
    m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0 or k == 0:
        return torch.zeros(m, n, dtype=dtype)
    if k > MAX_INNER:  # int32 sums: cut K; each half is this scheme, added in float64
        half = k // 2
        f64 = torch.float64
        out = _product2d(a[:, :half], b[:half], how, f64)
        return out.add_(_product2d(a[:, half:], b[half:], how, f64)).to(dtype)
    bdig, eb = column_digits(b)  # per column of b: [B0 | B1 | B2 | B3]
    arev, ea = dk.slice_lines(a, reverse=True)  # [A3 | A2 | A1 | A0]
    loud = outlier_rows(a, ea)
    if loud is None:
        return _digit_product(arev, ea, bdig, eb, how, dtype)
    rows, outliers = loud  # a row whose few loud entries are carried by a row of their own
    part = a[rows]
    quiet, qe = dk.slice_lines(torch.where(outliers, 0.0, part), reverse=True)
    arev[rows], ea[rows] = quiet, qe
    out = _digit_product(arev, ea, bdig, eb, how, torch.float64)
    ld, le = dk.slice_lines(torch.where(outliers, part, 0.0), reverse=True)
    out[rows] += _digit_product(ld, le, bdig, eb, how, torch.float64)
    return out.to(dtype)


GAP = 5  # octaves between a row's loud entries and the rest
FEW = 32  # at most N / FEW loud entries in a row of N entries that are not zero


def outlier_rows(a: torch.Tensor, ea: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The rows of `a` whose range is set by a few loud entries (SmolLM2's massive activations:
    2.6e4 in a row of values near 1): (their indices, the mask of their entries of magnitude at
    least 2**(e - GAP), 2**e above the row's largest: `ea`), when a row has at most N / FEW such
    entries, N its entries that are not zero (at least one); None when no row has. Such a row is
    computed as two: its quiet entries at their own scale, and its loud ones — so a row's quiet
    entries keep their bits whatever one entry of the row holds. Decided by comparisons and
    counts in the row alone: the same on every machine, and a row's result still depends on that
    row alone — and not on zeros it is padded with (a batch-invariant forward's attention slots,
    a causal mask's probabilities): they change neither the scales nor the counts."""
    counts, nonzero = dk.loud_counts(a, ea, GAP)
    rows = torch.nonzero((counts > 0) & (counts <= torch.clamp(nonzero // FEW, min=1)))
    if rows.numel() == 0:
        return None
    rows = rows.squeeze(1)
    thr = dk.pow2(ea[rows].to(torch.int64) - GAP).to(torch.float32).unsqueeze(1)
    return rows, a[rows].abs() >= thr


def _digit_product(
    arev: torch.Tensor,
    ea: torch.Tensor,
    bdig: torch.Tensor,
    eb: torch.Tensor,
    how: str,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The scheme's product of the row digits `arev` and the column digits `bdig`."""
    k = arev.shape[1] // DIGITS
    parts = []
    for t in range(KEEP):  # P_t = [A_t .. A_0] @ [B_0 ; .. ; B_t]
        lhs = arev[:, (DIGITS - 1 - t) * k :]
        rhs = bdig[:, : (t + 1) * k].t()
        parts.append(_int_product(lhs, rhs, how))
    return dk.combine(parts, ea, eb, dtype)


# The digit planes of frozen parameters (a LoRA run's base weights), made once per view of the
# parameter that a product takes (the forward's W.t(), the backward's W) and kept while the
# parameter lives: held by the parameter object (a weak reference checked on every look-up; the
# entry goes when the parameter does), never by a memory address alone, and made again when
# the parameter's version counter moved (an in-place update) or its storage was replaced. Every
# run starts with none (`forget_frozen`, called where a run establishes its kernels). A run
# whose base is sharded keeps none (`keep_frozen(False)`): its whole parameters exist only while
# a unit is gathered, and kept planes would hold twice the whole base in every process.
_frozen: dict[int, tuple[weakref.ref[torch.Tensor], dict[tuple[Any, ...], Any]]] = {}
_keep = [True]


def _forms(owner: torch.Tensor) -> dict[tuple[Any, ...], Any]:
    held = _frozen.get(id(owner))
    if held is None or held[0]() is not owner:
        held = _frozen[id(owner)] = (weakref.ref(owner), {})
        weakref.finalize(owner, _frozen.pop, id(owner), None)
    return held[1]


def _kept(b: torch.Tensor) -> list[Any] | None:
    """[state, whether b's columns are finite, their digit planes, their exponents] from the
    frozen parameters' store, made now if missing or stale (the planes on first use, by
    `column_digits`: b may not be float32 yet here); None when b is not a parameter that takes
    no gradient, nor a view of one (or nothing is kept). A column with a NaN or an infinity gets
    no planes: such a product takes the non-finite path."""
    owner = b if isinstance(b, torch.nn.Parameter) else b._base
    if not _keep[0] or not isinstance(owner, torch.nn.Parameter) or owner.requires_grad:
        return None
    view = (tuple(b.shape), tuple(b.stride()), b.storage_offset())
    forms = _forms(owner)
    kept = forms.get(view)
    state = (owner._version, owner.data_ptr())
    if kept is None or kept[0] != state:
        kept = forms[view] = [state, _finite(b, -2), None, None]
    return kept


def _finite(x: torch.Tensor, dim: int) -> bool:
    return bool(torch.isfinite(_abs_max(x, dim)).all())


def columns_finite(b: torch.Tensor) -> bool:
    """Whether every column of b is finite (kept with the planes for a frozen parameter: its
    bytes are read once per run, not at every product)."""
    kept = _kept(b)
    return _finite(b, -2) if kept is None else kept[1]


def column_digits(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The digit planes and exponents of b's columns (`slice_lines` of b.t()), from the frozen
    parameters' store when b is a parameter that takes no gradient, or a view of one."""
    kept = _kept(b)
    if kept is None or not kept[1]:
        return dk.slice_lines(b.t(), reverse=False)
    if kept[2] is None:
        kept[2], kept[3] = dk.slice_lines(b.t(), reverse=False)
    return kept[2], kept[3]


def forget_frozen() -> None:
    """Drop every kept digit plane (each run starts with none: a change made through `.data`,
    which moves no version counter, cannot outlive a run), and keep them again from now on."""
    _frozen.clear()
    _keep[0] = True


def keep_frozen(keep: bool) -> None:
    """Whether frozen parameters' digit planes are kept (off for a sharded base; the planes
    already kept are dropped when it goes off). The bits are the same either way."""
    _keep[0] = keep
    if not keep:
        _frozen.clear()


def frozen_bytes() -> int:
    """The memory the frozen parameters' digit planes hold now."""
    held = [forms for _, forms in list(_frozen.values())]
    return sum(
        k[2].numel() + 4 * k[3].numel()
        for forms in held
        for k in forms.values()
        if k[2] is not None
    )


def _as_float32(x: torch.Tensor) -> torch.Tensor:
    """float32, float16 and bfloat16 values are all float32 values (exact)."""
    return x if x.dtype == torch.float32 else x.to(torch.float32)


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


def exact_product(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """a @ b (2-D, or 3-D batched) by the scheme above, as float64 or rounded once to float32
    (`dtype`). A small product runs on one thread (see `_int_product`)."""
    threads = torch.get_num_threads()
    if threads == 1 or a.numel() * b.shape[-1] >= SMALL:
        return _exact_product(a, b, dtype)
    torch.set_num_threads(1)
    try:
        return _exact_product(a, b, dtype)
    finally:
        torch.set_num_threads(threads)


def _exact_product(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    finite = _finite(a, -1) and columns_finite(b)
    clean_a = _as_float32(a if finite else torch.nan_to_num(a, nan=0.0, posinf=0.0, neginf=0.0))
    clean_b = _as_float32(b if finite else torch.nan_to_num(b, nan=0.0, posinf=0.0, neginf=0.0))
    how, inner = engine(), (dtype if finite else torch.float64)
    if a.dim() == 2:
        out = _product2d(clean_a, clean_b, how, inner)
    elif a.shape[0] == 0:
        out = torch.zeros(0, a.shape[1], b.shape[2], dtype=inner)
    else:
        out = _product3d(clean_a, clean_b, how, inner)
    return out if finite else _nonfinite(a, b, out).to(dtype)


def _product3d(a: torch.Tensor, b: torch.Tensor, how: str, dtype: torch.dtype) -> torch.Tensor:
    """The batched product: each batch element exactly as `_product2d` computes it (a row's
    scale, loud-row split and digits are its own), with the slicing and the loud rows done for
    the whole batch in one pass each, and per element only the integer GEMMs and the
    combination."""
    bt, m, k = a.shape
    n = b.shape[2]
    if m == 0 or n == 0 or k == 0 or k > MAX_INNER:
        pairs = zip(a, b, strict=True)
        return torch.stack([_product2d(x, y, how, dtype) for x, y in pairs])
    rows = a.reshape(bt * m, k)
    arev, ea = dk.slice_lines(rows, reverse=True)
    bdig, eb = dk.slice_lines(b.transpose(1, 2).reshape(bt * n, k), reverse=False)
    loud = outlier_rows(rows, ea)
    inner = dtype if loud is None else torch.float64
    out = torch.empty(bt, m, n, dtype=inner)
    if loud is not None:
        where, outliers = loud
        part = rows[where]
        quiet, qe = dk.slice_lines(torch.where(outliers, 0.0, part), reverse=True)
        arev[where], ea[where] = quiet, qe
        ld, le = dk.slice_lines(torch.where(outliers, part, 0.0), reverse=True)
    for i in range(bt):
        a_rows, b_cols = slice(i * m, (i + 1) * m), slice(i * n, (i + 1) * n)
        out[i] = _digit_product(arev[a_rows], ea[a_rows], bdig[b_cols], eb[b_cols], how, inner)
    if loud is not None:
        batch = where // m
        for i in torch.unique(batch).tolist():  # each element's loud rows in one product
            mine = torch.nonzero(batch == i).squeeze(1)
            b_cols = slice(i * n, (i + 1) * n)
            extra = _digit_product(ld[mine], le[mine], bdig[b_cols], eb[b_cols], how,
                                   torch.float64)  # fmt: skip
            out[i, where[mine] % m] += extra
    return out.to(dtype)


def exact_product64(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b (2-D, or 3-D batched) in float64 by the scheme above. The caller rounds once to its
    dtype."""
    return exact_product(a, b, torch.float64)


def exact_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for 2-D or 3-D (batched) operands, rounded once to a's dtype."""
    if a.dtype == torch.float32:
        return exact_product(a, b, torch.float32)
    return exact_product64(a, b).to(a.dtype)


def error_bound(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The stated bound on |exact_matmul(a, b) - a @ b| (2-D finite operands, computed in
    float64): the operands' rounding to their lines' last kept bit, the left-out anti-diagonals,
    the float64 addition of a loud row's two halves and the final rounding to float32 (a loud
    row's halves each have a smaller range than the row: the row's bound holds for them)."""
    a64, b64 = a.double(), b.double()
    ea = torch.frexp(_abs_max(a64, -1))[1].double()
    eb = torch.frexp(_abs_max(b64, -2))[1].double()
    da, db = torch.exp2(ea - W - 1), torch.exp2(eb - W - 1)  # half a unit of the last kept bit
    k = a.shape[-1]
    rounding = da * b64.abs().sum(-2, keepdim=True) + a64.abs().sum(-1, keepdim=True) * db
    rounding += k * da * db
    left_out = sum(  # |digit| <= 64, (DIGITS - 1 - j) pairs on the anti-diagonal DIGITS + j
        (DIGITS - 1 - j) * 64**2 * dk.BASE ** (DIGITS - 2 - j) for j in range(DIGITS - 1)
    )
    truncation = k * left_out * torch.exp2(ea + eb - 2 * W)
    ref = (a64 @ b64).abs()
    return (rounding + truncation) * (1 + 2.0**-40) + ref * (2.0**-24 + 2.0**-52) + 2.0**-149
