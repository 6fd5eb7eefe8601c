"""The platform fingerprint a golden file belongs to: the torch version, the CPU's instruction
set (torch's dispatch capability, e.g. AVX512) and machine, or the GPU model, and the precision.
Runs on one fingerprint are expected to agree bit for bit; across fingerprints they may not."""

from __future__ import annotations

import platform
import re
from typing import Any


def fingerprint(device: str = "cpu", precision: str = "f32") -> dict[str, Any]:
    import torch

    if device.startswith("cuda"):
        where = f"cuda:{torch.cuda.get_device_name(device)}"
    else:
        where = f"cpu:{platform.machine()}-{torch.backends.cpu.get_cpu_capability()}"
    return {"torch": torch.__version__, "device": where, "precision": precision}


def slug(fp: dict[str, Any]) -> str:
    """A file-name-safe form: `torch-2.13.0+cpu_cpu-x86_64-AVX512_f32`."""
    text = f"torch-{fp['torch']}_{fp['device']}_{fp['precision']}"
    return re.sub(r"[^A-Za-z0-9.+_-]+", "-", text)
