"""The portable mode's CPU kernels, registered with torch once (`install`) and taken back
(`uninstall`): transformers' and twinrun's code call torch as usual and get them.

For CPU tensors of float32, bfloat16 and float16 (float32 and float64 for the functions):

- `mm`, `addmm`, `bmm`, `baddbmm`, `mv`, `addmv`, `dot` — exact products
  (`twinrun.core.exact_matmul`), then `beta * self + alpha * product` in float64, rounded once;
- `sqrt`, `exp`, `log`, `log2`, `log10`, `tanh`, `erf` and their in-place forms, and `pow(x, 0.5)`
  (which torch computes as a square root) — `twinrun.core.portable_math`.

Any other dtype goes to torch's own kernel through the op's `out=` overload, which this module
leaves alone (so are the `out=` overloads of the ops above: nothing in a training step calls
them). Autograd is untouched: the derivative formulas call these same ops.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from twinrun.core import portable_math
from twinrun.core.exact_matmul import exact_matmul, exact_product64

PRODUCT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
FUNCTION_DTYPES = (torch.float32, torch.float64)
OPS = ("mm", "addmm", "bmm", "baddbmm", "mv", "addmv", "dot", *portable_math.FUNCTIONS, "pow")
OPS += ("_softmax_backward_data",)

_library: Any = None


def installed() -> bool:
    return _library is not None


def _empty(shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    return torch.empty(shape, dtype=like.dtype, device=like.device)


def _combine(
    product: torch.Tensor, self: torch.Tensor, beta: Any, alpha: Any, dtype: torch.dtype
) -> torch.Tensor:
    """beta * self + alpha * product in float64 (torch's rule: beta == 0 ignores self), one
    rounding to dtype."""
    if alpha != 1:
        product = product * float(alpha)
    if beta != 0:
        base = self.to(torch.float64)
        product = product + (base if beta == 1 else base * float(beta))
    return product.to(dtype)


def _mm(self: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    if self.dtype not in PRODUCT_DTYPES or mat2.dtype != self.dtype:
        return torch.mm(self, mat2, out=_empty((self.shape[0], mat2.shape[1]), self))
    return exact_matmul(self, mat2)


def _bmm(self: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    if self.dtype not in PRODUCT_DTYPES or mat2.dtype != self.dtype:
        shape = (self.shape[0], self.shape[1], mat2.shape[2])
        return torch.bmm(self, mat2, out=_empty(shape, self))
    return exact_matmul(self, mat2)


def _addmm(
    self: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, *, beta: Any = 1, alpha: Any = 1
) -> torch.Tensor:
    if mat1.dtype not in PRODUCT_DTYPES or mat2.dtype != mat1.dtype:
        out = _empty((mat1.shape[0], mat2.shape[1]), mat1)
        return torch.addmm(self, mat1, mat2, beta=beta, alpha=alpha, out=out)
    return _combine(exact_product64(mat1, mat2), self, beta, alpha, mat1.dtype)


def _baddbmm(
    self: torch.Tensor, b1: torch.Tensor, b2: torch.Tensor, *, beta: Any = 1, alpha: Any = 1
) -> torch.Tensor:
    if b1.dtype not in PRODUCT_DTYPES or b2.dtype != b1.dtype:
        out = _empty((b1.shape[0], b1.shape[1], b2.shape[2]), b1)
        return torch.baddbmm(self, b1, b2, beta=beta, alpha=alpha, out=out)
    return _combine(exact_product64(b1, b2), self, beta, alpha, b1.dtype)


def _mv(self: torch.Tensor, vec: torch.Tensor) -> torch.Tensor:
    if self.dtype not in PRODUCT_DTYPES or vec.dtype != self.dtype:
        return torch.mv(self, vec, out=_empty((self.shape[0],), self))
    return exact_product64(self, vec.unsqueeze(1)).squeeze(1).to(self.dtype)


def _addmv(
    self: torch.Tensor, mat: torch.Tensor, vec: torch.Tensor, *, beta: Any = 1, alpha: Any = 1
) -> torch.Tensor:
    if mat.dtype not in PRODUCT_DTYPES or vec.dtype != mat.dtype:
        out = _empty((mat.shape[0],), mat)
        return torch.addmv(self, mat, vec, beta=beta, alpha=alpha, out=out)
    product = exact_product64(mat, vec.unsqueeze(1)).squeeze(1)
    return _combine(product, self, beta, alpha, mat.dtype)


def _dot(self: torch.Tensor, tensor: torch.Tensor) -> torch.Tensor:
    if self.dtype not in PRODUCT_DTYPES or tensor.dtype != self.dtype:
        out = _empty((1, 1), self)  # dot's own out= kernel calls back into dot
        return torch.mm(self.unsqueeze(0), tensor.unsqueeze(1), out=out).reshape(())
    return exact_product64(self.unsqueeze(0), tensor.unsqueeze(1)).reshape(()).to(self.dtype)


def _function(name: str) -> tuple[Callable[..., torch.Tensor], Callable[..., torch.Tensor]]:
    fn = portable_math.FUNCTIONS[name]
    out_overload = getattr(torch.ops.aten, name).out

    def functional(x: torch.Tensor) -> torch.Tensor:
        if x.dtype in FUNCTION_DTYPES:
            return fn(x)
        if not (x.is_floating_point() or x.is_complex()):
            return fn(x.to(torch.get_default_dtype()))
        return out_overload(x, out=torch.empty_like(x))

    def in_place(x: torch.Tensor) -> torch.Tensor:
        if x.dtype in FUNCTION_DTYPES:
            return x.copy_(fn(x))
        return out_overload(x, out=x)

    return functional, in_place


def _pow(x: torch.Tensor, exponent: Any) -> torch.Tensor:
    if exponent == 0.5 and x.dtype in FUNCTION_DTYPES:
        return portable_math.sqrt(x)
    dtype = torch.result_type(x, exponent)
    return torch.pow(x, exponent, out=torch.empty(x.shape, dtype=dtype, device=x.device))


def _softmax_backward(
    grad_output: torch.Tensor, output: torch.Tensor, dim: int, input_dtype: torch.dtype
) -> torch.Tensor:
    """output * (grad - sum(grad * output)) along dim: ATen's kernel splits its rows by thread
    count; this sum is one per row (a reduction over one dimension runs whole in one thread)."""
    if output.dtype not in FUNCTION_DTYPES:
        out = torch.empty(output.shape, dtype=input_dtype, device=output.device)
        return torch.ops.aten._softmax_backward_data.out(
            grad_output, output, dim, input_dtype, grad_input=out
        )
    total = (grad_output * output).sum(dim, keepdim=True)
    return (output * (grad_output - total)).to(input_dtype)


def install() -> None:
    """Register the portable kernels for the CPU (idempotent)."""
    global _library
    if _library is not None:
        return
    lib = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Oo]verrid.*")
        for name, impl in (
            ("mm", _mm), ("bmm", _bmm), ("addmm", _addmm), ("baddbmm", _baddbmm),
            ("mv", _mv), ("addmv", _addmv), ("dot", _dot),
        ):  # fmt: skip
            lib.impl(name, impl, "CPU")
        for name in portable_math.FUNCTIONS:
            functional, in_place = _function(name)
            lib.impl(name, functional, "CPU")
            lib.impl(f"{name}_", in_place, "CPU")
        lib.impl("pow.Tensor_Scalar", _pow, "CPU")
        lib.impl("_softmax_backward_data", _softmax_backward, "CPU")
    _library = lib


def uninstall() -> None:
    """Give torch its own CPU kernels back (idempotent)."""
    global _library
    if _library is None:
        return
    _library._destroy()
    _library = None
