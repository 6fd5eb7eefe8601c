"""One process of the CPU-emulation test: `python -m tests.integration.cpu_emulation OUT.json`.

Run under an emulated other CPU (an MKL branch, an instruction limit, MKL's AMD or Intel code
path forced by a preloaded library, another thread count — set by the caller in the
environment), it writes

- `native`: digests of MKL-computed results (a float32 product, `exp`, `sqrt`) with torch's own
  kernels, and of oneDNN's int8 product of +-127 operands — these are expected to move between
  emulations, which shows the emulation is real;
- `portable`: the adapter and diag SHA256s of short portable-mode runs on a toy whose inner
  dimensions pass 512 (intermediate 640): SFT with accumulation, and GRPO whose rewards vary and
  whose replayed rollouts make the ratio go through `exp` — these must not move.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path


def digest(t: object) -> str:
    import torch

    assert isinstance(t, torch.Tensor)
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()[:16]


def native_digests() -> dict[str, str]:
    import torch

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(48, 1536, generator=g), torch.randn(1536, 40, generator=g)
    x = torch.rand(20_000, generator=g) * 20 - 10
    wide = (
        torch.full((16, 256), 127, dtype=torch.int8),
        torch.full((256, 16), 127, dtype=torch.int8),
    )
    return {
        "mm": digest(a @ b), "exp": digest(torch.exp(x)), "sqrt": digest(torch.sqrt(x.abs())),
        "int8": digest(torch._int_mm(*wide)),  # +-127 saturates on oneDNN's AVX2 path
    }  # fmt: skip


def portable_digests(root: Path, threads: str) -> dict[str, str]:
    from testkit.toy_runs import run_args, sha256_of, write_examples
    from twinrun.cli.main import run_cli
    from twinrun.model.toy import write_toy_checkpoint

    model = root / "toy"
    write_toy_checkpoint(model, seed=0, intermediate=640)
    data = write_examples(root / "data")
    out: dict[str, str] = {}
    for objective in ("sft", "grpo"):
        run = root / objective
        args = run_args(objective, model, data[objective], run, "--diag")
        args[args.index("--threads") + 1] = threads
        if run_cli(args) != 0:
            raise SystemExit(f"{objective} run failed")
        out[f"{objective}.adapter"] = sha256_of(run / "adapter_model.safetensors")
        out[f"{objective}.diag"] = sha256_of(run / "diag.jsonl")
    return out


def main() -> None:
    from twinrun.core.portable import pin_environment

    pin_environment()
    threads = os.environ.get("TWINRUN_EMULATED_THREADS", "1")
    import torch

    torch.set_num_threads(int(threads))
    result = {"native": native_digests()}
    with tempfile.TemporaryDirectory(prefix="twinrun-emulation-") as tmp:
        result["portable"] = portable_digests(Path(tmp), threads)
    Path(sys.argv[1]).write_text(json.dumps(result), encoding="utf-8")


if __name__ == "__main__":
    main()
