"""The two passes around the exact products' integer GEMMs, fused: slicing and combining.

`twinrun.core.exact_matmul` cuts each operand line (a row of the left operand, a column of the
right one) into `DIGITS` int8 planes and recombines the integer products. Written as torch
operations, each of those steps is several passes over its matrix (scale, round, three balanced
remainders and divisions, four conversions; three multiply-adds, a conversion and two scalings),
and at SmolLM2's shapes the passes cost more than the products. Here each is one pass of a small
C loop, compiled once per machine with the system's C compiler into the cache
(`$TWINRUN_CACHE/kernels`, default `~/.cache/twinrun/kernels`) and called through ctypes.

The bits do not depend on which path runs: both the C loops and the torch fallback (`slice_torch`,
`combine_torch`, used where no C compiler is found, and by the tests as the reference) compute
the same integers exactly, and the same fixed sequence of IEEE float64 operations after them
(`-ffp-contract=off`, no fast-math: nothing is fused or reassociated).

- `slice_lines(x, reverse)`: x is a 2-D float32 view whose lines are its rows. Each row's exponent
  `e` (its largest magnitude is below `2**e`; 0 for a zero row), `q = rint(x * 2**(W - e))`
  (exact: a power-of-two scaling of a float32 in float64, then round-half-even), and q's balanced
  base-128 digits `q = d0*2**21 + d1*2**14 + d2*2**7 + d3`, each in [-64, 63] (|d0| <= 32).
  Written as int8 planes side by side: `[d0 | d1 | d2 | d3]` along each row, or reversed.
- `combine(parts, ea, eb)`: the anti-diagonal sums `P_t` (int32), `H = ((P0*128 + P1)*128 +
  P2)*128 + P3` in int64 (exact), then `(double)H * 2**(ea_row - 2W + 21) * 2**(eb_col)` in
  float64: exact (H is below 2**53, the scalings are powers of two within float64's normal
  range), so the float64 result is the truncated sum itself; rounded to float32 in the same
  pass when asked (the one rounding).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from twinrun.core.pinning import user_environment

DIGITS = 4
BITS = 7
BASE = 2**BITS
LOW, HIGH = -64, 63  # balanced digits: exact under every int8 code path oneDNN has (+-127 is not)
W = 26  # |q| <= 2**26, so the top digit stays within [-32, 32]

C_SOURCE = r"""
#include <stdint.h>
#include <math.h>

#define W 26

static inline int32_t bal(int32_t q) { return ((q + 64) & 127) - 64; }

void twinrun_slice(const float *x, int64_t rows, int64_t cols, int64_t rs, int64_t cs,
                   int8_t *out, int32_t *exps, int reverse) {
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * rs;
        float m = 0.0f;
        for (int64_t c = 0; c < cols; c++) {
            float v = fabsf(row[c * cs]);
            m = v > m ? v : m;
        }
        int e = 0;
        frexpf(m, &e);
        exps[r] = e;
        double s = ldexp(1.0, W - e);
        int8_t *o = out + r * 4 * cols;
        int8_t *b0 = o + (reverse ? 3 : 0) * cols, *b1 = o + (reverse ? 2 : 1) * cols;
        int8_t *b2 = o + (reverse ? 1 : 2) * cols, *b3 = o + (reverse ? 0 : 3) * cols;
        for (int64_t c = 0; c < cols; c++) {
            int32_t q = (int32_t)rint((double)row[c * cs] * s);
            int32_t d3 = bal(q);
            q = (q - d3) >> 7;
            int32_t d2 = bal(q);
            q = (q - d2) >> 7;
            int32_t d1 = bal(q);
            int32_t d0 = (q - d1) >> 7;
            b0[c] = (int8_t)d0; b1[c] = (int8_t)d1; b2[c] = (int8_t)d2; b3[c] = (int8_t)d3;
        }
    }
}

void twinrun_loud_counts(const float *x, int64_t rows, int64_t cols, int64_t rs, int64_t cs,
                         const int32_t *exps, int gap, int64_t *counts, int64_t *nonzero) {
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * rs;
        const float thr = ldexpf(1.0f, exps[r] - gap);
        int64_t n = 0, z = 0;
        for (int64_t c = 0; c < cols; c++) {
            n += fabsf(row[c * cs]) >= thr;
            z += row[c * cs] == 0.0f;
        }
        counts[r] = n;
        nonzero[r] = cols - z;
    }
}

void twinrun_combine(const int32_t *p0, const int32_t *p1, const int32_t *p2,
                     const int32_t *p3, int64_t rows, int64_t cols, int64_t ld,
                     const int32_t *ea, const int32_t *eb, double *scratch, double *out,
                     float *out32) {
    for (int64_t c = 0; c < cols; c++) scratch[c] = ldexp(1.0, eb[c]);
    for (int64_t r = 0; r < rows; r++) {
        const double sa = ldexp(1.0, ea[r] - 2 * W + 21);
        const int64_t o = r * ld;
        for (int64_t c = 0; c < cols; c++) {
            int64_t h = (((int64_t)p0[o + c] * 128 + p1[o + c]) * 128 + p2[o + c]) * 128
                        + p3[o + c];
            double v = (double)h * sa;
            v = v * scratch[c];
            if (out32) out32[r * cols + c] = (float)v;
            else out[r * cols + c] = v;
        }
    }
}
"""

_FLAGS = ["-O3", "-mavx2", "-ffp-contract=off", "-fno-fast-math", "-shared", "-fPIC"]
_lib: ctypes.CDLL | None = None
_tried = False


def cache_dir() -> Path:
    return Path(os.environ.get("TWINRUN_CACHE") or Path.home() / ".cache" / "twinrun") / "kernels"


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _build(cc: str) -> Path:
    """The shared library for this source, flags and compiler, built once into the cache (in a
    temporary name, then renamed: a concurrent build is harmless)."""
    probe = [cc, "--version"]
    version = subprocess.run(probe, capture_output=True, text=True, env=user_environment()).stdout
    key = hashlib.sha256("\0".join([C_SOURCE, *_FLAGS, version]).encode()).hexdigest()[:16]
    lib = cache_dir() / f"digits-{key}.so"
    if lib.exists():
        return lib
    lib.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=lib.parent) as tmp:
        src = Path(tmp) / "digits.c"
        src.write_text(C_SOURCE)
        built = Path(tmp) / "digits.so"
        cmd = [cc, *_FLAGS, str(src), "-o", str(built), "-lm"]
        subprocess.run(cmd, check=True, capture_output=True, env=user_environment())
        os.replace(built, lib)
    return lib


def library() -> ctypes.CDLL | None:
    """The compiled kernels, or None where no C compiler works here (the torch fallback then
    computes the same bits) or `TWINRUN_DIGIT_KERNELS=torch` asks for the fallback."""
    global _lib, _tried
    if _tried:
        return _lib
    _tried = True
    cc = _compiler()
    if os.environ.get("TWINRUN_DIGIT_KERNELS") == "torch" or cc is None:
        return None
    try:
        lib = ctypes.CDLL(str(_build(cc)))
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"twinrun: compiling the digit kernels failed ({type(exc).__name__}); the slower "
              "torch path gives the same bits", file=sys.stderr)  # fmt: skip
        return None
    p, i64, i = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.twinrun_slice.argtypes = [p, i64, i64, i64, i64, p, p, i]
    lib.twinrun_slice.restype = None
    lib.twinrun_loud_counts.argtypes = [p, i64, i64, i64, i64, p, i, p, p]
    lib.twinrun_loud_counts.restype = None
    lib.twinrun_combine.argtypes = [p, p, p, p, i64, i64, i64, p, p, p, p, p]
    lib.twinrun_combine.restype = None
    _lib = lib
    return _lib


def pow2(exponent: torch.Tensor) -> torch.Tensor:
    """2**exponent as float64, exactly (built from the bits: no pow or exp kernel); exponent
    within float64's normal range [-1022, 1023]."""
    return ((exponent.to(torch.int64) + 1023) << 52).view(torch.float64)


def slice_torch(x: torch.Tensor, reverse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """`slice_lines` by torch operations (the same integers)."""
    m = torch.maximum(x.amax(dim=1, keepdim=True), x.amin(dim=1, keepdim=True).neg())
    e = torch.frexp(m.to(torch.float64))[1].to(torch.int32)
    q = torch.round(x.to(torch.float64) * pow2(W - e)).to(torch.int32)
    planes = []
    for _ in range(DIGITS - 1):
        d = ((q + 64) & (BASE - 1)) - 64
        planes.append(d)
        q = (q - d) >> BITS
    planes.append(q)
    planes.reverse()  # planes[0] is the top digit
    if reverse:
        planes.reverse()
    return torch.cat(planes, dim=1).to(torch.int8), e.squeeze(1)


def slice_lines(x: torch.Tensor, reverse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 [rows, DIGITS * cols] digit planes, int32 [rows] exponents) of a 2-D float32 x."""
    rows, cols = x.shape
    lib = library()
    if lib is None or rows == 0 or cols == 0:
        return slice_torch(x, reverse)
    out = torch.empty(rows, DIGITS * cols, dtype=torch.int8)
    exps = torch.empty(rows, dtype=torch.int32)
    rs, cs = x.stride()
    lib.twinrun_slice(x.data_ptr(), rows, cols, rs, cs, out.data_ptr(), exps.data_ptr(),
                      int(reverse))  # fmt: skip
    return out, exps


def loud_counts_torch(
    x: torch.Tensor, exps: torch.Tensor, gap: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`loud_counts` by torch operations (the same comparisons)."""
    thr = pow2(exps.to(torch.int64) - gap).to(torch.float32).unsqueeze(1)
    return (x.abs() >= thr).sum(1), (x != 0).sum(1)


def loud_counts(x: torch.Tensor, exps: torch.Tensor, gap: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two int64 [rows]: how many entries of each row of the 2-D float32 x have a magnitude of at
    least 2**(e - gap), e the row's exponent from `slice_lines` (2**(e - gap) rounded to float32;
    below float32's range it is 0, and every entry counts), and how many are not zero."""
    rows, cols = x.shape
    lib = library()
    if lib is None or rows == 0 or cols == 0:
        return loud_counts_torch(x, exps, gap)
    counts = torch.empty(rows, dtype=torch.int64)
    nonzero = torch.empty(rows, dtype=torch.int64)
    exps = exps.contiguous()
    rs, cs = x.stride()
    lib.twinrun_loud_counts(x.data_ptr(), rows, cols, rs, cs, exps.data_ptr(), gap,
                            counts.data_ptr(), nonzero.data_ptr())  # fmt: skip
    return counts, nonzero


def combine_torch(parts: list[torch.Tensor], ea: torch.Tensor, eb: torch.Tensor) -> torch.Tensor:
    """`combine` by torch operations (the same sequence of operations)."""
    acc = parts[0].to(torch.int64)
    for p in parts[1:]:
        acc = acc * BASE + p
    out = acc.to(torch.float64) * pow2(ea.to(torch.int64) - 2 * W + 21).unsqueeze(1)
    return out * pow2(eb.to(torch.int64)).unsqueeze(0)


def combine(
    parts: list[torch.Tensor],
    ea: torch.Tensor,
    eb: torch.Tensor,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """[rows, cols] from the DIGITS anti-diagonal sums (int32, one shape and stride): float64,
    or that float64 rounded once to float32 in the same pass (`dtype=torch.float32`)."""
    lib = library()
    rows, cols = parts[0].shape
    ld = parts[0].stride(0)
    if (
        lib is None
        or rows == 0
        or cols == 0
        or any(p.stride(1) != 1 or p.stride(0) != ld for p in parts)
    ):
        return combine_torch(parts, ea, eb).to(dtype)
    ea, eb = ea.contiguous(), eb.contiguous()
    scratch = torch.empty(cols, dtype=torch.float64)
    out = torch.empty(rows, cols, dtype=dtype)
    out64, out32 = (out.data_ptr(), None) if dtype == torch.float64 else (None, out.data_ptr())
    lib.twinrun_combine(*(p.data_ptr() for p in parts), rows, cols, ld, ea.data_ptr(),
                        eb.data_ptr(), scratch.data_ptr(), out64, out32)  # fmt: skip
    return out
