"""Exact, order-independent checksums and bitwise digests of tensors.

A digest (`digest`, `digest_many`) is XXH3-128 over each tensor's dtype name, shape, byte
length and little-endian bytes (`leaf_hasher`): 128 bits, the same on every machine, and tens
of times faster than SHA256 on a step's logits. Leaves need equality, not secrecy: nothing
trusts a digest against an adversary (files keep their SHA256s, `twinrun.core.digest`).

`sumsq(x)` is the sum of the squares of the values of `x`, rounded once, correctly (round half
to even), from the *exact* sum: the same float that `math.fsum` over the exact squares gives.
Because nothing is rounded before the end, the result does not depend on element order,
chunking, thread count, microbatch split or number of processes, and `SumSq` accumulators built
from parts merge into exactly the one-pass value.

How it is exact and still fast (a blocked Rump–Ogita–Oishi / ReproBLAS-style extraction):

* float32/float16/bfloat16 squares are exact in float64 (at most 48 significant bits); float64
  values are scaled by a power of two into [2^-399, 2) and split (Veltkamp) into 26-bit halves,
  which gives x² = p + err exactly with p = fl(x²) (Dekker's TwoProduct, without FMA);
  integers are split into 22-bit limbs whose products are exact in float64.
* A block of such exact terms is cut at a grid 2^g derived from the block maximum: q = (v+σ)-σ
  with σ = 1.5·2^(g+52) rounds every term to a multiple of 2^g exactly, and the sum of the q is
  exact in float64 (in any order, on any number of threads) because it stays below 2^(g+53).
  The remainders v - q are exact too; the cut repeats on them until they are all zero.
* Every exact block sum is added to a Python integer in units of 2^-2148 (the quantum of the
  square of the smallest float64 subnormal); the final division is correctly rounded.

`sumsq` and the row checksums (`checksum_digest`, `checksum_digest_many`) first ask
`twinrun.diag.extract.rounded_sumsq` for a CPU float32/float16/bfloat16 value: a few vector
passes that bound the exact sum tightly enough to know how it rounds, which gives the same float
without building the exact sum (nearly always; otherwise the exact path below decides).
`SumSq`, which must merge, always keeps the exact sum.

On the CPU (torch CPU tensors and numpy arrays) float32/float16/bfloat16 take a faster,
data-independent path: each block of 8192 values is widened into one float64 buffer, squared
(exact), and every square s is split by bit masking into hi (its top 25 significant bits) and
lo = s - hi (at most 23 more bits, exact). `np.bincount` sums hi and lo per float64 exponent of s:
within one exponent every partial sum is a multiple of a fixed grid and stays below 2^53 of it,
so the bin sums are exact in any order; at the end, groups of W adjacent bins (W + log2(count)
<= 29) are summed exactly the same way and added to the integer. A leaf made of many float32
tensors (`checksum_digest_many`) is concatenated first, so each part costs one view. Small
float64 and integer inputs are summed exactly in Python / int64 arithmetic.

torch and numpy are imported lazily: importing this module costs nothing (`twinrun diff` needs
only JSON).
"""

from __future__ import annotations

import array
import math
import struct
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

import xxhash

from twinrun.diag.extract import rounded_sumsq

__all__ = [
    "SumSq",
    "checksum_digest",
    "checksum_digest_many",
    "digest",
    "digest_many",
    "leaf_hasher",
    "sumsq",
]


def leaf_hasher(prefix: bytes) -> Any:
    """A fresh leaf digest (XXH3-128, seed 0) fed with `prefix`: `update` it with bytes-like
    objects, read it with `hexdigest()` (32 hex digits)."""
    return xxhash.xxh3_128(prefix)


_Q = 2148  # fixed point: the accumulator holds N, the value is N * 2**-_Q
# Elements per block: at most torch's parallel grain size (32768), so every op on a block runs
# inline on the calling thread -- no OpenMP region per op, which stalls badly on a busy machine --
# and the working set stays in cache. Large tensors are instead split into chunks that Python
# threads take in parallel (torch ops release the GIL); exactness makes the split invisible.
_BLOCK = 1 << 15
_BLOCK_F64 = 1 << 14  # float64 folds p and err together: 2 * 2**14 terms
_CHUNK = 1 << 20  # elements per thread task
_BLOCK_DEVICE = 1 << 22  # on an accelerator: few large kernels (each .item() is a sync)


def _blocks(t: Any, block: int) -> range:
    """Block starts for `t`; on a non-CPU device, blocks are large."""
    return range(0, t.numel(), block if t.device.type == "cpu" else _BLOCK_DEVICE)


_FLOAT_NARROW = ("float32", "float16", "bfloat16")
_VELTKAMP = 134217729.0  # 2**27 + 1

# -- the CPU (numpy) path for float32/float16/bfloat16 ------------------------------------------
_HB = 1 << 14  # values per block: the float64 buffer and its scratch stay in L1/L2
_HB_FLUSH = 1 << 20  # values binned before the bins are folded into the integer
_HI_MASK = ~((1 << 28) - 1)  # clears the low 28 of a float64's 52 fraction bits
_NBINS = 2048  # float64 biased exponents; 2047 holds inf/NaN
_SQ_TOP = 1400  # above the biased exponent of any finite float32 square (at most 1279)
_SMALL_F64 = 64  # float64 inputs up to this size are summed in Python (exact, no torch ops)
_scratch = threading.local()


def _scratch_arrays() -> tuple[Any, Any, Any]:
    """Per-thread scratch for one block: the float64 squares, exponent indices, hi parts."""
    arrays = getattr(_scratch, "arrays", None)
    if arrays is None:
        import numpy as np

        arrays = (
            np.empty(_HB, dtype=np.float64),
            np.empty(_HB, dtype=np.int64),
            np.empty(_HB, dtype=np.float64),
        )
        _scratch.arrays = arrays
    return arrays


class _Bins:
    """Exact sums of float32-exact squares, binned by the float64 exponent of the square.

    `feed` widens each block of values into a per-thread float64 buffer, squares it, splits the
    squares into hi/lo and bins them (see the module docstring); only the bins (2 x 2048
    floats) are kept between calls. Every `_HB_FLUSH` values the bins are folded into the
    integer; `settle()` returns the exact total in units of 2**-_Q and the non-finite flags,
    and starts over."""

    __slots__ = ("bh", "bl", "count", "total", "nan", "inf")

    def __init__(self) -> None:
        import numpy as np

        self.bh = np.zeros(_NBINS, dtype=np.float64)
        self.bl = np.zeros(_NBINS, dtype=np.float64)
        self.count = 0  # values in the bins
        self.total = 0
        self.nan = False
        self.inf = False

    def feed(self, a: Any) -> None:
        """Add the squares of a 1-D float16/float32 numpy array (`a` is not kept)."""
        import numpy as np

        buf, k_all, h_all = _scratch_arrays()
        n = a.shape[0]
        for off in range(0, n, _HB):
            nb = min(_HB, n - off)
            if self.count + nb > _HB_FLUSH:
                self._fold()
            s, k, h = buf[:nb], k_all[:nb], h_all[:nb]
            s[...] = a[off : off + nb]  # widen: float32/16 -> float64, exact
            np.multiply(s, s, out=s)  # exact: a float32 square has at most 48 significant bits
            bits = s.view(np.int64)
            np.right_shift(bits, 52, out=k)  # the biased exponent (squares are >= 0)
            np.bitwise_and(bits, _HI_MASK, out=h.view(np.int64))  # hi: top 25 significant bits
            with np.errstate(invalid="ignore"):  # inf - inf = NaN in bin 2047: see _fold
                np.subtract(s, h, out=s)  # lo = s - hi, exact, 0 <= lo < 2**(exponent-24)
            self.bh += np.bincount(k, h, minlength=_NBINS)
            self.bl += np.bincount(k, s, minlength=_NBINS)
            self.count += nb

    def _fold(self) -> None:
        """Add the binned sums to `total` exactly and empty the bins."""
        top = _NBINS - 1
        if self.bh[top] != 0.0 or self.bl[top] != 0.0:
            if math.isnan(float(self.bh[top])):  # a NaN keeps its quiet bit in hi;
                self.nan = True  # an inf's lo is NaN
            else:
                self.inf = True
            self.bh[top] = self.bl[top] = 0.0
        if self.count == 0:
            return
        lg = max(1, (self.count - 1).bit_length())
        w = 29 - lg  # w adjacent bins still sum exactly (module docstring); lg <= 21 here
        used = (_SQ_TOP // w) * w  # bins above _SQ_TOP hold no finite square of a float32
        for bins in (self.bh, self.bl):
            groups = bins[:used].reshape(-1, w).sum(axis=1)
            for v in groups[groups != 0.0].tolist():
                self.total += _to_fixed(v, 0)
        self.bh.fill(0.0)
        self.bl.fill(0.0)
        self.count = 0

    def settle(self) -> tuple[int, bool, bool]:
        """(exact total in units of 2**-_Q, any NaN, any inf) of everything fed; starts over."""
        self._fold()
        out = (self.total, self.nan, self.inf)
        self.total, self.nan, self.inf = 0, False, False
        return out


def exact_value(n: int, nan: bool, inf: bool) -> float:
    """The float of an exact total `n` in units of 2**-_Q, correctly rounded: NaN if any value
    was NaN, inf if any was infinite (or the total exceeds the float64 range)."""
    if nan:
        return math.nan
    if inf:
        return math.inf
    try:
        return n / (1 << _Q)  # int / int is correctly rounded in CPython
    except OverflowError:
        return math.inf


def _to_fixed(p: float, sc: int) -> int:
    """The exact value p * 2**sc as an integer in units of 2**-_Q."""
    if p == 0.0:
        return 0
    num, den = p.as_integer_ratio()
    shift = sc + _Q - (den.bit_length() - 1)
    if shift >= 0:
        return num << shift
    q, r = divmod(num, 1 << -shift)
    if r:  # pragma: no cover - impossible for squares of IEEE values
        raise ArithmeticError("sumsq: a partial sum is finer than the fixed-point quantum")
    return q


def _scale(t: Any, a: int) -> Any:
    """t * 2**a in place, exact (two steps so that 2**a never overflows as a float)."""
    h = a // 2
    t.mul_(2.0**h)
    t.mul_(2.0 ** (a - h))
    return t


def _fold(v: Any, m: float, sc: int) -> int:
    """Exact sum of the float64 values in `v` (a 1-D tensor, modified in place), scaled by
    2**sc, in units of 2**-_Q. `m` is max |v|, finite."""
    import torch

    total = 0
    tmp = torch.empty_like(v)
    folds = 0
    while m != 0.0:
        folds += 1
        n = v.numel()
        lg = max(2, (n - 1).bit_length())  # n <= 2**lg
        e = math.frexp(m)[1]  # m < 2**e
        g = max(e + lg - 53, -1074)
        sigma = math.ldexp(1.5, g + 52)
        torch.add(v, sigma, out=tmp)
        tmp.sub_(sigma)  # every term rounded to a multiple of 2**g, exactly
        total += _to_fixed(float(tmp.sum()), sc)  # exact: |partial sums| <= 2**(g+53)
        v.sub_(tmp)  # the exact remainders, |r| <= 2**(g-1)
        if g == -1074:
            break  # the grid was the finest there is: nothing remains
        lo, hi = torch.aminmax(v)
        m = max(-float(lo), float(hi))
        if m != 0.0 and folds >= 2:  # after one fold nearly every term still has low bits
            nz = int(torch.count_nonzero(v))
            if nz * 8 < n:  # few terms left: work on those only
                v = v[v != 0]
                tmp = torch.empty_like(v)
    return total


class SumSq:
    """Mergeable exact accumulator of a sum of squares.

    `add` any number of tensors (or arrays, floats, ints, lists), `merge` accumulators built on
    other parts, and `value()` is the correctly rounded exact total: adding parts and merging
    equals one pass over the whole, bit for bit.
    """

    __slots__ = ("_n", "_nan", "_inf", "count", "_bins")

    def __init__(self) -> None:
        self._n = 0  # exact sum in units of 2**-_Q
        self._nan = False
        self._inf = False
        self.count = 0  # number of elements added
        self._bins: _Bins | None = None  # pending CPU float32/16 squares (see _Bins)

    def add(self, x: Any) -> SumSq:
        """Add the squares of the values of `x`; returns self."""
        if isinstance(x, bool):
            x = int(x)
        if isinstance(x, int):
            self._n += (x * x) << _Q
            self.count += 1
            return self
        if isinstance(x, float):
            self._add_float(x)
            return self
        host = _host_array(x)
        if host is not None and self._add_host(host):
            return self
        t = _as_tensor(x)
        self.count += t.numel()
        if t.numel() == 0:
            return self
        t = t.detach().reshape(-1)
        name = str(t.dtype).removeprefix("torch.")
        if not (name in _FLOAT_NARROW or name in ("float64", "bool") or name[:3] in ("int", "uin")):
            raise TypeError(f"sumsq: unsupported dtype {name}")
        import torch

        workers = min(torch.get_num_threads(), -(-t.numel() // _CHUNK))
        if workers < 2 or t.device.type != "cpu":
            self._add_flat(t, name)
            return self

        def work(start: int) -> SumSq:
            part = SumSq()
            part._add_flat(t[start : start + _CHUNK], name)
            return part

        self._add_parts(workers, t.numel(), work)
        return self

    def _add_parts(self, workers: int, n: int, work: Callable[[int], SumSq]) -> None:
        """Add the parts `work(start)` sums for each _CHUNK of `n` elements, `workers` threads
        at a time: their exact sums and non-finite flags (the caller counts the elements)."""
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(workers, thread_name_prefix="twinrun-sumsq") as pool:
            for part in pool.map(work, range(0, n, _CHUNK)):
                self._n += part._n
                self._nan |= part._nan
                self._inf |= part._inf

    def _add_flat(self, t: Any, name: str) -> None:
        if name in _FLOAT_NARROW:
            self._add_narrow(t)
        elif name == "float64":
            self._add_f64(t)
        elif name == "bool" or name.startswith(("int", "uint")):
            self._add_int(t, name)

    def _add_host(self, a: Any) -> bool:
        """The CPU fast paths for a numpy array (see the module docstring); False when the
        general path must take it."""
        kind, n = a.dtype.kind, a.size
        if kind == "f" and a.itemsize <= 4:
            self._add_narrow_host(a)
            return True
        if kind == "f" and a.itemsize == 8 and n <= _SMALL_F64:
            for v in a.reshape(-1).tolist():
                self._add_float(v)
            return True
        if kind in "iub" and a.itemsize <= 8:
            return self._add_int_host(a)
        return False

    def _add_narrow_host(self, a: Any) -> None:
        """A float16/float32 numpy array: binned, in threads past 2 * _CHUNK elements."""
        n = a.size
        self.count += n
        if n == 0:
            return
        flat = a.reshape(-1)
        workers = 1
        if n >= 2 * _CHUNK:
            import torch

            workers = min(torch.get_num_threads(), -(-n // _CHUNK))
        if workers < 2:
            self._feed(flat)
            return

        def work(start: int) -> SumSq:
            part = SumSq()
            part._feed(flat[start : start + _CHUNK])
            part._settle()
            return part

        self._add_parts(workers, n, work)

    def _add_int_host(self, a: Any) -> bool:
        """An integer or bool numpy array in one int64 dot product, when its products and sum
        are exact in int64; False (nothing added) when they might not be."""
        import numpy as np

        n = a.size
        if n == 0:
            return True
        if a.dtype.kind == "b" or a.itemsize == 1:
            m = 255
        else:
            lo, hi = int(a.min()), int(a.max())
            m = max(-lo, hi)
        if m < (1 << 31) and n * m * m < (1 << 63):  # int64 products and sum are exact
            flat = a.reshape(-1).astype(np.int64)
            self._n += int(np.dot(flat, flat)) << _Q
            self.count += n
            return True
        return False

    def _feed(self, flat: Any) -> None:
        """Bin a 1-D float16/float32 array (pending until `_settle`)."""
        if self._bins is None:
            self._bins = _Bins()
        self._bins.feed(flat)

    def _settle(self) -> None:
        """Fold pending binned squares into the exact integer."""
        if self._bins is not None:
            n, nan, inf = self._bins.settle()
            self._n += n
            self._nan |= nan
            self._inf |= inf

    def merge(self, other: SumSq) -> SumSq:
        """Fold another accumulator into this one (exact); returns self."""
        other._settle()
        self._n += other._n
        self._nan |= other._nan
        self._inf |= other._inf
        self.count += other.count
        return self

    def value(self) -> float:
        """The correctly rounded exact sum: NaN if any value was NaN, inf if any was infinite."""
        self._settle()
        return exact_value(self._n, self._nan, self._inf)

    def copy(self) -> SumSq:
        self._settle()
        other = SumSq()
        other.merge(self)
        return other

    def __repr__(self) -> str:
        return f"SumSq(value={self.value()!r}, count={self.count})"

    # -- per-dtype paths -------------------------------------------------------------------

    def _flag(self, m: float) -> bool:
        """Record a non-finite block maximum; True when the block is finite."""
        if math.isnan(m):
            self._nan = True
            return False
        if math.isinf(m):
            self._inf = True
            return False
        return True

    def _add_float(self, x: float) -> None:
        self.count += 1
        if not math.isfinite(x):
            self._flag(abs(x))
            return
        num, den = x.as_integer_ratio()
        self._n += (num * num) << (_Q - 2 * (den.bit_length() - 1))

    def _add_narrow(self, t: Any) -> None:
        """float32 / float16 / bfloat16: squares are exact in float64."""
        import torch

        starts = _blocks(t, _BLOCK)
        buf = torch.empty(min(t.numel(), starts.step), dtype=torch.float64, device=t.device)
        for start in starts:
            xb = t[start : start + starts.step]
            b = buf[: xb.numel()]
            b.copy_(xb)
            b.mul_(b)
            m = float(b.max())  # NaN propagates; inf stays inf
            if self._flag(m) and m != 0.0:
                self._n += _fold(b, m, 0)

    def _add_f64(self, t: Any) -> None:
        """float64: scale each group to [1, 2), TwoProduct (Veltkamp split), fold p and err."""
        import torch

        starts = _blocks(t, _BLOCK_F64)
        for start in starts:
            v = t[start : start + starts.step]
            lo, hi = torch.aminmax(v)
            m = max(-float(lo), float(hi))
            if not self._flag(m):
                continue
            while m != 0.0:
                e = math.frexp(m)[1]  # m < 2**e
                small = v.abs() < math.ldexp(1.0, e - 400)
                if bool(small.any()):
                    big, v = v[~small], v[small]
                else:
                    big, v = v, v[:0]
                x = _scale(big.clone(), 1 - e)  # exact; 2**-399 <= |x| < 2
                c = x * _VELTKAMP
                h = c - (c - x)
                low = x - h
                p = x * x  # Dekker's TwoProduct: p + err == x*x exactly (no underflow here)
                err = ((h * h - p) + 2.0 * h * low) + low * low
                terms = torch.cat([p, err])
                tl, th = torch.aminmax(terms)
                self._n += _fold(terms, max(-float(tl), float(th)), -2 * (1 - e))
                if v.numel() == 0:
                    break
                m = float(v.abs().max())

    def _add_int(self, t: Any, name: str) -> None:
        import torch

        if name == "bool" or name in ("int8", "uint8", "int16", "uint16"):
            t = t.to(torch.int32)
        elif name == "uint64":
            self._n += sum(int(v) ** 2 for v in t.cpu().tolist()) << _Q
            return
        starts = _blocks(t, _BLOCK_F64)
        for start in starts:
            v = t[start : start + starts.step].to(torch.int64)
            lo, hi = torch.aminmax(v)
            if -(1 << 26) < int(lo) and int(hi) < (1 << 26):  # squares exact in float64
                d = v.to(torch.float64)
                d.mul_(d)
                self._n += _fold(d, float(d.max()), 0)
                continue
            mask = (1 << 22) - 1
            c = (v & mask).to(torch.float64)
            b = ((v >> 22) & mask).to(torch.float64)
            a = (v >> 44).to(torch.float64)  # v = a*2**44 + b*2**22 + c, each term exact
            terms = torch.cat(
                [
                    a * a * 2.0**88,
                    2.0 * a * b * 2.0**66,
                    (2.0 * a * c + b * b) * 2.0**44,  # each < 2**45: the sum is exact
                    2.0 * b * c * 2.0**22,
                    c * c,
                ]
            )
            tl, th = torch.aminmax(terms)
            self._n += _fold(terms, max(-float(tl), float(th)), 0)


_NUMPY_OK = frozenset(
    ("float32", "float16", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")
)
_np_names: dict[Any, str] = {}  # native numpy dtype -> name (dtype.name is slow to compute)


def _np_name(dtype: Any) -> str | None:
    """The name of a native numpy dtype in _NUMPY_OK, else None."""
    if not _np_names:
        import numpy as np

        _np_names.update({np.dtype(n): n for n in _NUMPY_OK})
    return _np_names.get(dtype)


def _host_array(x: Any) -> Any:
    """A numpy view of `x` when it is a CPU tensor or a numpy array (bfloat16: widened to
    float32, exactly); None otherwise (other devices, Python lists, odd dtypes)."""
    np = sys.modules.get("numpy")
    if np is not None and isinstance(x, np.ndarray):
        return x if _np_name(x.dtype) is not None else None
    if not _is_torch(x) or x.device.type != "cpu":
        return None
    name = str(x.dtype)[6:]  # "torch.float32" -> "float32"
    if name == "bfloat16":
        return x.detach().float().numpy()
    if name not in _NUMPY_OK:
        return None
    return x.detach().numpy()


def _as_tensor(x: Any) -> Any:
    """A torch tensor viewing `x` (torch tensor, numpy array, list or scalar)."""
    import numpy as np
    import torch

    if isinstance(x, torch.Tensor):
        return x
    arr = np.asarray(x)
    if arr.dtype == object:
        raise TypeError("sumsq: expected numbers, got Python objects")
    if not arr.dtype.isnative:
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if arr.dtype == np.uint64 and (arr.size == 0 or int(arr.max()) < (1 << 63)):
        arr = arr.astype(np.int64)
    return torch.from_numpy(np.ascontiguousarray(arr))


def sumsq(x: Any) -> float:
    """The correctly rounded exact sum of squares of the values of `x` (see module docstring).

    Accepts torch tensors and numpy arrays of float32/float16/bfloat16/float64, integer and bool
    dtypes, and Python floats, ints and (nested) lists. NaN if any value is NaN, else inf if any
    is infinite (or the exact sum exceeds the float64 range).

    A CPU float32/float16/bfloat16 value (the usual leaf) is first tried by
    `twinrun.diag.extract.rounded_sumsq`, which finds the same float in a few vector passes
    without the exact sum whenever it can tell how that sum rounds (nearly always); the exact
    path takes the rest. An accumulator (`SumSq`) always keeps the exact sum, to merge."""
    host = _host_array(x)
    if host is not None and _narrow(host):
        value = rounded_sumsq(host.reshape(-1))
        if value is not None:
            return value
    return SumSq().add(x).value()


# -- digests -------------------------------------------------------------------------------


def _is_torch(x: Any) -> bool:
    torch = sys.modules.get("torch")  # a tensor cannot exist unless torch was imported
    return torch is not None and isinstance(x, torch.Tensor)


_torch_names: dict[Any, str] = {}  # torch dtype -> name, for the dtypes numpy has


def _cpu_view(x: Any) -> Any:
    """A numpy view of a CPU torch tensor whose dtype numpy has (same dtype name and shape, so
    its checksum and digest are the tensor's); `x` itself otherwise."""
    if not _is_torch(x) or not x.is_cpu:
        return x
    if not _torch_names:
        import torch

        _torch_names.update({getattr(torch, n): n for n in _NUMPY_OK})
    if x.dtype not in _torch_names:
        return x
    return x.detach().numpy() if x.requires_grad else x.numpy()


def _frame(h: Any, x: Any) -> None:
    """Feed one tensor into `h`: dtype name, shape, byte length, little-endian bytes."""
    import numpy as np

    if isinstance(x, bool):
        arr = np.asarray(x, dtype=np.bool_)
    elif isinstance(x, int):
        arr = np.asarray(x, dtype=np.int64)
    elif isinstance(x, float):
        arr = np.asarray(x, dtype=np.float64)
    elif _is_torch(x):
        import torch

        name = str(x.dtype)[6:]  # "torch.float32" -> "float32"
        if x.device.type == "cpu" and name in _NUMPY_OK:
            _frame_array(h, name, tuple(x.shape), x.detach().numpy())
            return
        t = x.detach().cpu().contiguous()
        try:
            arr = t.numpy()
        except TypeError:  # bfloat16 and other dtypes numpy lacks: the raw bits
            bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
            arr = t.view(bits[t.element_size()]).numpy()
        _frame_array(h, name, tuple(t.shape), arr)
        return
    else:
        arr = x if isinstance(x, np.ndarray) else np.asarray(x)
        if arr.dtype == object:
            raise TypeError("digest: expected numbers, got Python objects")
    _frame_array(h, _np_name(arr.dtype) or arr.dtype.name, arr.shape, arr)


_LITTLE = sys.byteorder == "little"


_headers: dict[tuple[str, tuple[int, ...], int], bytes] = {}


def _header(name: str, shape: tuple[int, ...], nbytes: int) -> bytes:
    """The frame header: name length and name, rank and dims, byte length (big-endian)."""
    key = (name, shape, nbytes)
    head = _headers.get(key)
    if head is None:
        enc = name.encode()
        head = struct.pack(
            f">I{len(enc)}sI{len(shape)}QQ", len(enc), enc, len(shape), *shape, nbytes
        )
        if len(_headers) < 4096:
            _headers[key] = head
    return head


def _frame_array(h: Any, name: str, shape: tuple[int, ...], arr: Any) -> None:
    import numpy as np

    if not (_LITTLE and arr.dtype.isnative):
        arr = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    h.update(_header(name, shape, arr.nbytes))
    h.update(arr)  # the C-contiguous bytes (the buffer protocol ignores the element format)


def digest(x: Any) -> str:
    """XXH3-128 hex over `x`'s dtype name, shape and contiguous little-endian bytes (bfloat16:
    its raw 2-byte bits). Equal digests mean bitwise-equal tensors of one dtype and shape."""
    h = leaf_hasher(b"twinrun.tensor.v1\0")
    _frame(h, x)
    return h.hexdigest()


def digest_many(xs: Iterable[Any]) -> str:
    """XXH3-128 hex over several tensors in the given order (a leaf made of parts): the number of
    parts, then each framed by dtype, shape and byte length. Not equal to `digest` of one."""
    parts = list(xs)
    h = leaf_hasher(b"twinrun.tensors.v1\0")
    h.update(len(parts).to_bytes(8, "big"))
    np = sys.modules.get("numpy")
    for x in parts:
        name = _np_name(x.dtype) if np is not None and type(x) is np.ndarray else None
        if name is not None:
            _frame_array(h, name, x.shape, x)
        else:
            _frame(h, x)
    return h.hexdigest()


def checksum_digest(x: Any) -> tuple[float, str]:
    """(`sumsq(x)`, `digest(x)`), converting a CPU tensor once for both. A list of numbers is
    taken as `numpy.asarray` of it."""
    small = _small_values(x)
    if small is not None:
        return _small_checksum_digest(*small)
    if isinstance(x, list | tuple):
        import numpy as np

        x = np.asarray(x)
    v = _cpu_view(x)
    return sumsq(v), digest(v)


_ARRAYS_OK = (
    sys.byteorder == "little" and array.array("q").itemsize == 8 == array.array("d").itemsize
)
_SMALL = 256  # values: below this a leaf is cheaper in Python than through numpy
_INT64 = (-(1 << 63), 1 << 63)


def _small_values(x: Any) -> tuple[str, tuple[int, ...], list[Any]] | None:
    """(dtype name, shape, values) of a small CPU int64/float64 tensor or flat list of Python
    ints (int64 range) or floats — a step's loss, learning rate, sampled indices, tokens; None
    for anything else (the general path takes it)."""
    if not _ARRAYS_OK:  # pragma: no cover - big-endian hosts take the general path
        return None
    if type(x) is list and 0 < len(x) <= _SMALL:
        kind = type(x[0])
        if kind is float and all(type(v) is float for v in x):
            return "float64", (len(x),), x
        if kind is int and all(type(v) is int and _INT64[0] <= v < _INT64[1] for v in x):
            return "int64", (len(x),), x
        return None
    torch = sys.modules.get("torch")
    if torch is None or type(x) is not torch.Tensor or x.numel() > _SMALL or x.numel() == 0:
        return None
    name = {torch.int64: "int64", torch.float64: "float64"}.get(x.dtype)
    if name is None or not x.is_cpu:
        return None
    return name, tuple(x.shape), x.detach().reshape(-1).tolist()


def _small_checksum_digest(
    name: str, shape: tuple[int, ...], values: list[Any]
) -> tuple[float, str]:
    """`checksum_digest` of a small leaf (see `_small_values`), in Python: the same float (the
    exact sum rounded once) and the same digest bytes."""
    acc = SumSq()
    h = leaf_hasher(b"twinrun.tensor.v1\0")
    _small_part(acc, h, name, shape, values)
    return acc.value(), h.hexdigest()


def _small_part(acc: SumSq, h: Any, name: str, shape: tuple[int, ...], values: list[Any]) -> None:
    """Add a small part's squares to `acc` and its frame (header, bytes) to `h`."""
    if name == "int64":
        acc._n += sum(v * v for v in values) << _Q
        data = array.array("q", values).tobytes()
    else:
        for v in values:
            acc._add_float(v)
        data = array.array("d", values).tobytes()
    h.update(_header(name, shape, len(data)))
    h.update(data)


def _small_many(xs: list[Any]) -> tuple[float, str] | None:
    """`checksum_digest_many` of parts that are all small (see `_small_values`, at most _SMALL
    values in all), in Python; None otherwise."""
    parts = []
    for x in xs:
        small = _small_values(x)
        if small is None:
            return None
        parts.append(small)
    if sum(len(values) for _, _, values in parts) > _SMALL:
        return None
    acc = SumSq()
    h = leaf_hasher(b"twinrun.tensors.v1\0")
    h.update(len(parts).to_bytes(8, "big"))
    for name, shape, values in parts:
        _small_part(acc, h, name, shape, values)
    return acc.value(), h.hexdigest()


def checksum_digest_many(xs: Iterable[Any]) -> tuple[float, str]:
    """(the merged exact sum of squares of the parts, `digest_many(parts)`), converting each
    CPU tensor once for both. Float32 parts (the usual multi-part leaf: LoRA gradients, Adam
    moments, parameters) are checksummed as one concatenated array and framed in one tight
    loop: the per-part cost is a view and two hash updates."""
    parts = list(xs)
    small = _small_many(parts) if 0 < len(parts) <= 8 else None
    if small is not None:
        return small
    torch = sys.modules.get("torch")
    if torch is not None and len(parts) > 1:
        f32 = torch.float32
        if all(type(x) is torch.Tensor and x.dtype is f32 and x.is_cpu for x in parts):
            import numpy as np

            views = [x.detach().numpy() if x.requires_grad else x.numpy() for x in parts]
            h = leaf_hasher(b"twinrun.tensors.v1\0")
            h.update(len(views).to_bytes(8, "big"))
            for v in views:
                if not v.flags.c_contiguous:
                    v = np.ascontiguousarray(v)
                h.update(_header("float32", v.shape, v.nbytes))
                h.update(v)
            if not _LITTLE:  # pragma: no cover - big-endian hosts take the general path
                return checksum_digest_many(views)
            return sumsq(np.concatenate(views, axis=None)), h.hexdigest()
    views = [_cpu_view(x) for x in parts]
    numpy = sys.modules.get("numpy")
    if numpy is not None and views and all(type(v) is numpy.ndarray and _narrow(v) for v in views):
        flat = numpy.concatenate([v.reshape(-1) for v in views]) if len(views) > 1 else views[0]
        return sumsq(flat), digest_many(views)
    acc = SumSq()
    for part in views:
        acc.add(part)
    return acc.value(), digest_many(views)


def _narrow(a: Any) -> bool:
    """Whether numpy array `a` holds float32/float16 (what `sumsq` tries first by extraction)."""
    return a.dtype.kind == "f" and a.itemsize <= 4
