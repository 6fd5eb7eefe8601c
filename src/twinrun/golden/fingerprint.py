"""The platform fingerprint a golden file or a pinned value belongs to: the torch version, where
it ran and the precision. On the CPU "where" is the kernels in effect, not the machine: under
the portable mode every x86-64 CPU with AVX2 computes the same bits (`cpu:x86_64-portable-digits`:
matrix products from int8 digit planes summed exactly, own transcendental functions, ATen's AVX2
kernels), so one file serves an Intel AVX-512 and an AMD AVX2 machine alike (the scheme before
it, float64 products of 23-bit slices, was `cpu:x86_64-portable-exact`; the mode before exact
products, whose bytes did not carry across vendors, `cpu:x86_64-portable-AVX2`); native kernels
are keyed by
the capability torch chose (`cpu:x86_64-AVX512`). On CUDA it is the GPU model. Runs on one
fingerprint are expected to agree bit for bit; across fingerprints they may not."""

from __future__ import annotations

import platform
import re
from typing import Any

PORTABLE = "portable-digits"


def fingerprint(
    device: str = "cpu", precision: str = "f32", cpu_kernels: str = "portable"
) -> dict[str, Any]:
    """The fingerprint of a run in `cpu_kernels` mode (portable: what the mode pins, which a run
    reads back and enforces; native: the capability torch chose)."""
    import torch

    if device.startswith("cuda"):
        where = f"cuda:{torch.cuda.get_device_name(device)}"
    elif cpu_kernels == "portable":
        where = f"cpu:{platform.machine()}-{PORTABLE}"
    else:
        where = f"cpu:{platform.machine()}-{torch.backends.cpu.get_cpu_capability()}"
    return {"torch": torch.__version__, "device": where, "precision": precision}


def written_on(device: str = "cpu") -> dict[str, Any]:
    """The machine a file was written on (kept beside the fingerprint it serves)."""
    import torch

    from twinrun.core.portable import cpu_model, native_capability

    if device.startswith("cuda"):
        return {"device_name": torch.cuda.get_device_name(device)}
    return {"cpu_model": cpu_model(), "native_capability": native_capability()}


def slug(fp: dict[str, Any]) -> str:
    """A file-name-safe form: `torch-2.13.0+cpu_cpu-x86_64-portable-digits_f32`."""
    text = f"torch-{fp['torch']}_{fp['device']}_{fp['precision']}"
    return re.sub(r"[^A-Za-z0-9.+_-]+", "-", text)
