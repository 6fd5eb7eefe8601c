"""Portable CPU kernels: a CPU run's bytes that do not depend on the CPU model or vendor.

Pinning a library's dispatch does not carry bytes across vendors (measured on torch 2.13: MKL's
compatible branch wrote other bytes on an Intel Xeon than on an AMD EPYC, and MKL's vector-math
functions choose their code per CPU under every branch). So the portable mode does not pin
libraries; it computes what would depend on them from arithmetic with one possible result:

- **Matrix products** (`mm`, `addmm`, `bmm`, `baddbmm`, `mv`, `addmv`, `dot`, forward and
  backward, base, LoRA and attention): each operand line cut into four int8 digit planes, the
  planes multiplied by the CPU's integer GEMM (int32 sums: exact), combined exactly and rounded
  once (`twinrun.core.exact_matmul`). Whatever kernel, CPU or thread count runs the integer
  product, every partial sum is an exact integer, so the bits cannot change.
- **sqrt and the transcendental functions torch sends to MKL's vector math** (`sqrt`, `exp`,
  `log`, `log2`, `log10`, `tanh`, `erf`, `pow(x, 0.5)`): correctly rounded or a fixed sequence of
  IEEE operations (`twinrun.core.portable_math`).
- Both are registered as torch's CPU kernels for those ops while the mode is on
  (`twinrun.core.portable_ops`), so transformers' model code runs unchanged.
- **ATen's own kernels** (elementwise maths, softmax, norms, reductions, Sleef's vectorised
  functions) dispatch by CPU capability; pinned by `ATEN_CPU_CAPABILITY=avx2`, every x86-64 CPU
  since 2013 runs the same AVX2 code — fixed instruction sequences of IEEE operations.
- **oneDNN** would run bf16 matrix products on AVX-512 CPUs only: off. **SDPA's** fused CPU
  kernel calls the BLAS directly: off, so `--attention sdpa` takes torch's math path (the
  products above and ATen's softmax).

MKL's branch (`MKL_CBWR`) no longer matters and is left to the user; it is recorded. The
capability variable must be in the environment before torch runs its first kernel. The CLI pins
it at start-up (`pin_environment`), before torch is imported; `establish_kernels` reads every
setting back and refuses with one line when torch already chose another path in this process.
The processes twinrun starts get the user's environment (`user_environment`), not the pin.
`native` pins nothing, gives torch its own kernels back and records what is in effect.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
from pathlib import Path
from typing import Any

from twinrun.core.errors import ConfigError, ContractError
from twinrun.core.pinning import (  # noqa: F401 (the portable mode's pin, used from here)
    PINNED_ENV,
    pin_environment,
    unpin_environment,
    user_environment,
)

MODES = ("portable", "native")
DEFAULT_ENV = "TWINRUN_CPU_KERNELS"  # a machine's or CI's default mode; unset: native
CAPABILITY = "AVX2"

# MKL's CNR branch numbers as mkl_cbwr_get reads them back (MKL_CBWR=AVX2 reads 10), for the
# record: the portable mode's bytes do not depend on the branch.
_MKL_BRANCHES = {0: "OFF", 1: "OFF", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 6: "SSSE3"}
_MKL_BRANCHES.update({7: "SSE4_1", 8: "SSE4_2", 9: "AVX", 10: "AVX2", 11: "AVX512_MIC"})
_MKL_BRANCHES.update({12: "AVX512", 13: "AVX512_MIC_E1", 14: "AVX512_E1"})
_MKL_STRICT = 0x10000

_switched_off: list[str] = []  # torch switches the portable mode turned off in this process


def default_mode() -> str:
    """The mode a run takes when none is given: `TWINRUN_CPU_KERNELS` if set, else native (the
    portable mode's exact products cost several times native per step: docs/benchmarks.md)."""
    return os.environ.get(DEFAULT_ENV) or "native"


def check_mode(mode: str) -> None:
    if mode not in MODES:
        source = DEFAULT_ENV if mode == os.environ.get(DEFAULT_ENV) else "--cpu-kernels"
        raise ConfigError(
            f"{source} must be portable or native",  # the value is not shown: a secret?
            "use --cpu-kernels portable (the same bytes on every x86-64 CPU) or native",
        )


def promise(record: dict[str, Any]) -> str:
    """What a run's bytes promise, in words, for the sidecar."""
    if record.get("mode") == "portable":
        return "the same bytes on every x86-64 CPU with AVX2, at any thread count"
    return (
        f"the same bytes on this kind of CPU ({record.get('cpu_model')}, "
        f"{record.get('aten_capability')} kernels) at this thread count only; "
        "--cpu-kernels portable for bytes every x86-64 CPU writes"
    )


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def native_capability() -> str:
    """The widest capability this CPU offers torch (from the CPU's flags, not torch's choice)."""
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        return "unknown"
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        return "AVX512"
    if {"avx2", "fma"} <= flags:
        return "AVX2"
    return "DEFAULT" if flags else "unknown"


def mkl_branch() -> str | None:
    """MKL's reproducibility branch as MKL reports it (None when torch has no MKL or the query
    is not exported). Querying fixes nothing: MKL reads MKL_CBWR once, at its first call."""
    import torch

    if not torch.backends.mkl.is_available():
        return None
    lib = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        query = ctypes.CDLL(str(lib)).mkl_serv_cbwr_get
    except (OSError, AttributeError):
        return None
    query.restype = ctypes.c_int
    query.argtypes = [ctypes.c_int]
    value = int(query(-1)) & 0xFFFFFFFF  # MKL_CBWR_ALL: the branch and the STRICT bit
    name = _MKL_BRANCHES.get(value & 0xFFFF, str(value & 0xFFFF))
    return name + (",STRICT" if value & _MKL_STRICT else "")


def read_back() -> dict[str, Any]:
    """What is in effect now: the record the sidecar keeps under `determinism.cpu_kernels`."""
    import torch

    from twinrun.core import portable_ops

    return {
        "aten_capability": str(torch.backends.cpu.get_cpu_capability()),
        "exact_products": portable_ops.installed(),
        "exact_engine": exact_engine() if portable_ops.installed() else None,
        "portable_functions": portable_ops.installed(),
        "onednn": bool(torch.backends.mkldnn.enabled),
        "sdpa_fused": bool(torch.backends.cuda.flash_sdp_enabled()),
        "mkl_cbwr": mkl_branch(),
        "native_capability": native_capability(),
        "cpu_model": cpu_model(),
        "machine": platform.machine(),
    }


def exact_engine() -> str:
    """Who computes the exact products' digit planes and passes, for the record: the integer
    GEMM's engine and whether the fused C passes or their torch twins run (the same bits)."""
    from twinrun.core import digit_kernels
    from twinrun.core.exact_matmul import engine

    return f"{engine()}+{'c' if digit_kernels.library() is not None else 'torch'}-passes"


def is_portable(record: dict[str, Any]) -> bool:
    return (
        record.get("aten_capability") == CAPABILITY
        and record.get("exact_products") is True
        and record.get("portable_functions") is True
        and record.get("onednn") is False
    )


def _switch_back() -> None:
    """Turn back on what the portable mode turned off (a `native` run after a portable one)."""
    import torch

    if "onednn" in _switched_off:
        torch.backends.mkldnn.enabled = True  # type: ignore[assignment]  # a torch ContextProp
    if "sdpa_fused" in _switched_off:
        torch.backends.cuda.enable_flash_sdp(True)
    _switched_off.clear()


def establish_kernels(mode: str, device: str = "cpu") -> dict[str, Any]:
    """Put in place (portable) or take back (native) the portable kernels; read back. SDPA's
    fused kernel is switched off for a CPU run only (the switch is torch's, for every device)."""
    check_mode(mode)
    products = sys.modules.get("twinrun.core.exact_matmul")  # imports torch: only if it ran
    if products is not None:
        products.forget_frozen()  # each run starts with no kept digit planes
    if mode == "native":
        unpin_environment()
        from twinrun.core import portable_ops

        portable_ops.uninstall()
        _switch_back()
        native = {"mode": "native", **read_back()}
        return native | {"promise": promise(native)}
    if platform.machine().lower() not in ("x86_64", "amd64"):
        raise ContractError(
            f"portable CPU kernels are defined for x86-64; this machine is {platform.machine()}",
            "use --cpu-kernels native (its bytes then hold on this kind of machine only)",
        )
    pin_environment()
    import torch

    from twinrun.core import portable_ops

    if torch.backends.mkldnn.enabled:
        torch.backends.mkldnn.enabled = False  # type: ignore[assignment]  # a ContextProp
        _switched_off.append("onednn")
    if device == "cpu" and torch.backends.cuda.flash_sdp_enabled():
        torch.backends.cuda.enable_flash_sdp(False)  # CPU SDPA then takes the math path
        _switched_off.append("sdpa_fused")
    elif device != "cpu" and "sdpa_fused" in _switched_off:
        torch.backends.cuda.enable_flash_sdp(True)  # a GPU run after a CPU one: its fused SDPA
        _switched_off.remove("sdpa_fused")
    portable_ops.install()
    record = {"mode": "portable", **read_back()}
    if record["aten_capability"] != CAPABILITY:
        cause = (
            "this CPU lacks AVX2"
            if record["native_capability"] not in ("AVX2", "AVX512")
            else "torch chose its kernels before twinrun could pin them (or "
            + ", ".join(f"{k}={os.environ.get(k)}" for k in PINNED_ENV)
            + " is set)"
        )
        raise ContractError(
            f"portable CPU kernels did not take: torch runs {record['aten_capability']} "
            f"kernels, not {CAPABILITY} — {cause}",
            "run twinrun in a fresh process with "
            + " ".join(f"{k}={v}" for k, v in PINNED_ENV.items())
            + " (or it unset), or use --cpu-kernels native",
        )
    return record | {"promise": promise(record)}
