"""The portable mode's bytes do not move when another CPU is emulated on this one: MKL's branches
(`MKL_CBWR`), an instruction limit (`MKL_ENABLE_INSTRUCTIONS`), MKL's AMD code path forced by a
preloaded library that answers MKL's vendor questions as an AMD CPU would, and two threads.

Each emulation is a fresh process (MKL reads its settings once). The same processes show that
the emulations are real: MKL's own results (a float32 product, exp, sqrt) move between them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
AMD_ANSWERS = """
int mkl_serv_intel_cpu_true(void) { return 0; }
int mkl_serv_intel_cpu(void) { return 0; }
int mkl_serv_cpuiszen(void) { return 1; }
"""
EMULATIONS: dict[str, dict[str, str]] = {
    "as-is": {},
    "MKL_CBWR=COMPATIBLE": {"MKL_CBWR": "COMPATIBLE"},
    "MKL_CBWR=AVX2,STRICT": {"MKL_CBWR": "AVX2,STRICT"},
    "MKL_CBWR=AVX512": {"MKL_CBWR": "AVX512"},
    "MKL_ENABLE_INSTRUCTIONS=AVX2, 2 threads": {
        "MKL_ENABLE_INSTRUCTIONS": "AVX2", "TWINRUN_EMULATED_THREADS": "2",
    },
    "MKL's AMD path, 2 threads": {"AMD": "1", "TWINRUN_EMULATED_THREADS": "2"},
}  # fmt: skip


def amd_library(folder: Path) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("the AMD-path emulation needs a C compiler (cc); install gcc")
    source, lib = folder / "amd.c", folder / "libamd_answers.so"
    source.write_text(AMD_ANSWERS)
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(lib), str(source)], check=True)
    return lib


def emulate(name: str, extra: dict[str, str], folder: Path, amd: Path) -> dict[str, dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MKL_", "TWINRUN_EMU"))}
    env.pop("LD_PRELOAD", None)
    for key, value in extra.items():
        if key == "AMD":
            env["LD_PRELOAD"] = str(amd)
        else:
            env[key] = value
    out = folder / f"{len(list(folder.glob('*.json')))}.json"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.integration.cpu_emulation", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, f"{name}: {proc.stderr[-2000:]}"
    return json.loads(out.read_text())


def test_emulated_cpus_write_the_same_portable_bytes(tmp_path: Path) -> None:
    amd = amd_library(tmp_path)
    results = {name: emulate(name, extra, tmp_path, amd) for name, extra in EMULATIONS.items()}
    reference = results["as-is"]["portable"]
    moved = {n: r["portable"] for n, r in results.items() if r["portable"] != reference}
    assert not moved, f"portable bytes moved under {sorted(moved)}: {moved} vs {reference}"
    for key in ("mm", "exp", "sqrt"):
        natives = {r["native"][key] for r in results.values()}
        assert len(natives) >= 2, f"no emulation moved MKL's {key}: the emulation is not real"
