"""Exact, order-independent checksums and bitwise digests of tensors.

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

torch and numpy are imported lazily: importing this module costs nothing (`twinrun diff` needs
only JSON).
"""

from __future__ import annotations

import hashlib
import math
import sys
from collections.abc import Iterable
from typing import Any

__all__ = ["SumSq", "digest", "digest_many", "sumsq"]

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

    __slots__ = ("_n", "_nan", "_inf", "count")

    def __init__(self) -> None:
        self._n = 0  # exact sum in units of 2**-_Q
        self._nan = False
        self._inf = False
        self.count = 0  # number of elements added

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
        from concurrent.futures import ThreadPoolExecutor

        def work(start: int) -> SumSq:
            part = SumSq()
            part._add_flat(t[start : start + _CHUNK], name)
            return part

        with ThreadPoolExecutor(workers, thread_name_prefix="twinrun-sumsq") as pool:
            for part in pool.map(work, range(0, t.numel(), _CHUNK)):
                self._n += part._n
                self._nan |= part._nan
                self._inf |= part._inf
        return self

    def _add_flat(self, t: Any, name: str) -> None:
        if name in _FLOAT_NARROW:
            self._add_narrow(t)
        elif name == "float64":
            self._add_f64(t)
        elif name == "bool" or name.startswith(("int", "uint")):
            self._add_int(t, name)

    def merge(self, other: SumSq) -> SumSq:
        """Fold another accumulator into this one (exact); returns self."""
        self._n += other._n
        self._nan |= other._nan
        self._inf |= other._inf
        self.count += other.count
        return self

    def value(self) -> float:
        """The correctly rounded exact sum: NaN if any value was NaN, inf if any was infinite."""
        if self._nan:
            return math.nan
        if self._inf:
            return math.inf
        try:
            return self._n / (1 << _Q)  # int / int is correctly rounded in CPython
        except OverflowError:
            return math.inf

    def copy(self) -> SumSq:
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
    is infinite (or the exact sum exceeds the float64 range)."""
    return SumSq().add(x).value()


# -- digests -------------------------------------------------------------------------------


def _is_torch(x: Any) -> bool:
    torch = sys.modules.get("torch")  # a tensor cannot exist unless torch was imported
    return torch is not None and isinstance(x, torch.Tensor)


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

        t = x.detach().cpu().contiguous()
        name = str(t.dtype).removeprefix("torch.")
        try:
            arr = t.numpy()
        except TypeError:  # bfloat16 and other dtypes numpy lacks: the raw bits
            bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
            arr = t.view(bits[t.element_size()]).numpy()
        _frame_array(h, name, tuple(t.shape), arr)
        return
    else:
        arr = np.asarray(x)
        if arr.dtype == object:
            raise TypeError("digest: expected numbers, got Python objects")
    _frame_array(h, arr.dtype.name, arr.shape, arr)


def _frame_array(h: Any, name: str, shape: tuple[int, ...], arr: Any) -> None:
    import numpy as np

    le = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
    le = np.ascontiguousarray(le)
    enc = name.encode()
    h.update(len(enc).to_bytes(4, "big") + enc)
    h.update(len(shape).to_bytes(4, "big") + b"".join(d.to_bytes(8, "big") for d in shape))
    h.update(le.nbytes.to_bytes(8, "big"))
    h.update(le.reshape(-1).view(np.uint8).data)


def digest(x: Any) -> str:
    """SHA256 hex over `x`'s dtype name, shape and contiguous little-endian bytes (bfloat16:
    its raw 2-byte bits). Equal digests mean bitwise-equal tensors of one dtype and shape."""
    h = hashlib.sha256(b"twinrun.tensor.v1\0")
    _frame(h, x)
    return h.hexdigest()


def digest_many(xs: Iterable[Any]) -> str:
    """SHA256 hex over several tensors in the given order (a leaf made of parts): the number of
    parts, then each framed by dtype, shape and byte length. Not equal to `digest` of one."""
    parts = list(xs)
    h = hashlib.sha256(b"twinrun.tensors.v1\0")
    h.update(len(parts).to_bytes(8, "big"))
    for x in parts:
        _frame(h, x)
    return h.hexdigest()
