"""Portable CPU kernels: a CPU run's bytes that do not depend on the CPU model or vendor.

torch's CPU results depend on which code path its libraries pick for the machine's instruction
set. Measured on torch 2.13 (toy and SmolLM2 training steps; docs/reproduce.md):

- **ATen** (torch's own kernels: elementwise maths, softmax, norms, reductions) dispatches by
  CPU capability — DEFAULT, AVX2 or AVX512 — and the three write other adapter bytes. Pinned by
  `ATEN_CPU_CAPABILITY=avx2`: every x86-64 CPU since 2013 runs the same AVX2 code.
- **MKL** (every float32 matrix multiply) picks its own branch per CPU; on a non-Intel CPU even
  `MKL_CBWR=AVX2` falls back to MKL's automatic branch (read back: 2, not 9), which wrote other
  bytes than MKL's default on an AMD EPYC. Only `MKL_CBWR=COMPATIBLE` is documented to give the
  same results on Intel and non-Intel CPUs, so that is what the portable mode pins.
- **oneDNN** runs no operation of an f32 training step (`ONEDNN_VERBOSE=1` prints nothing), but
  torch routes bf16 matrix multiplies to it on AVX-512 CPUs only; the portable mode turns it off
  (`torch.backends.mkldnn.enabled = False`) so bf16 takes ATen's AVX2 path everywhere.
- **Sleef** (ATen's vectorised transcendental functions) is compiled into each capability's
  kernels: pinning ATen's capability pins it too.

The thread count is not made irrelevant: MKL's COMPATIBLE branch and ATen's softmax backward
split their work by thread, so a training run on the CPU names `--threads` (no silent default).

Both variables must be in the environment before torch runs its first kernel (ATen reads its
capability once, MKL its branch at its first call). The CLI pins them at start-up
(`pin_environment`), before torch is imported; `establish_kernels` then reads every setting
back and refuses with one line when torch already chose another path in this process. `native`
pins nothing and records what is in effect.
"""

from __future__ import annotations

import ctypes
import os
import platform
from pathlib import Path
from typing import Any

from twinrun.core.errors import ConfigError, ContractError

MODES = ("portable", "native")
CAPABILITY = "AVX2"
PINNED_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE"}

# MKL's CNR branch numbers (mkl_cbwr_get(MKL_CBWR_BRANCH)), for the record.
_MKL_BRANCHES = {0: "OFF", 1: "OFF", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 6: "SSE4_2"}
_MKL_BRANCHES.update({7: "AVX", 9: "AVX2", 11: "AVX512_MIC", 12: "AVX512", 14: "AVX512_E1"})
_MKL_STRICT = 0x10000

_pinned_here: dict[str, str] = {}  # what pin_environment set (so `native` can take it back)


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ConfigError(
            "--cpu-kernels must be portable or native",  # the value is not shown: a secret?
            "use --cpu-kernels portable (the same bytes on every x86-64 CPU) or native",
        )


def pin_environment() -> None:
    """Put the portable mode's variables in the environment unless the user set them. Imports
    nothing; call it before torch is imported (the CLI does at start-up, tests in conftest)."""
    for name, value in PINNED_ENV.items():
        if name not in os.environ:
            os.environ[name] = value
            _pinned_here[name] = value


def unpin_environment() -> None:
    """Take back what `pin_environment` set (for a `native` run, before torch's first kernel)."""
    for name, value in list(_pinned_here.items()):
        if os.environ.get(name) == value:
            del os.environ[name]
        del _pinned_here[name]


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

    return {
        "aten_capability": str(torch.backends.cpu.get_cpu_capability()),
        "mkl_cbwr": mkl_branch(),
        "onednn": bool(torch.backends.mkldnn.enabled),
        "native_capability": native_capability(),
        "cpu_model": cpu_model(),
        "machine": platform.machine(),
    }


def is_portable(record: dict[str, Any]) -> bool:
    return (
        record.get("aten_capability") == CAPABILITY
        and record.get("mkl_cbwr") in ("COMPATIBLE", None)
        and record.get("onednn") is False
    )


def establish_kernels(mode: str) -> dict[str, Any]:
    """Pin (portable) or only record (native) the CPU kernels; read every setting back."""
    check_mode(mode)
    if mode == "native":
        unpin_environment()
        return {"mode": "native", **read_back()}
    if platform.machine().lower() not in ("x86_64", "amd64"):
        raise ContractError(
            f"portable CPU kernels are defined for x86-64; this machine is {platform.machine()}",
            "use --cpu-kernels native (its bytes then hold on this kind of machine only)",
        )
    pin_environment()
    import torch

    torch.backends.mkldnn.enabled = False  # type: ignore[assignment]  # a torch ContextProp
    record = {"mode": "portable", **read_back()}
    problems = []
    if record["aten_capability"] != CAPABILITY:
        problems.append(f"torch runs {record['aten_capability']} kernels, not {CAPABILITY}")
    if record["mkl_cbwr"] not in ("COMPATIBLE", None):
        problems.append(f"MKL runs its {record['mkl_cbwr']} branch, not COMPATIBLE")
    if problems:
        cause = (
            "this CPU lacks AVX2"
            if record["native_capability"] not in ("AVX2", "AVX512")
            else "torch chose its kernels before twinrun could pin them (or "
            + ", ".join(f"{k}={os.environ.get(k)}" for k in PINNED_ENV)
            + " is set)"
        )
        raise ContractError(
            f"portable CPU kernels did not take: {'; '.join(problems)} — {cause}",
            "run twinrun in a fresh process with "
            + " ".join(f"{k}={v}" for k, v in PINNED_ENV.items())
            + " (or those unset), or use --cpu-kernels native",
        )
    return record
