"""The portable mode's bytes do not move when another CPU is emulated on this one: MKL's branches
(`MKL_CBWR`), an instruction limit (`MKL_ENABLE_INSTRUCTIONS`), MKL's AMD and Intel code paths
forced by a preloaded library that answers MKL's vendor questions as that vendor's CPU would,
oneDNN's instruction caps (`ONEDNN_MAX_CPU_ISA`: its AVX2 and AVX-512-without-VNNI integer
GEMMs), two and four threads, and each engine of the exact products (oneDNN's int8 GEMM or the
float64 BLAS; the digit passes in C or in torch).

Each emulation is a fresh process (MKL reads its settings once). The same processes show that
the emulations are real: MKL's own results (a float32 product, exp, sqrt) move between them, and
oneDNN's int8 product of +-127 operands (which saturates on its AVX2 path) moves under the caps. On
an Intel machine the AMD path moves them; on an AMD machine MKL already runs its AMD path (its
branches and instruction limits leave exp and sqrt alone there) and the Intel path moves them:
with both vendors' paths, the check holds on either kind of machine."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENDOR_ANSWERS = {  # what MKL asks of the CPU's vendor: intel, intel (true), zen
    "amd": (0, 0, 1),
    "intel": (1, 1, 0),
}
EMULATIONS: dict[str, dict[str, str]] = {
    "as-is": {},
    "MKL_CBWR=COMPATIBLE": {"MKL_CBWR": "COMPATIBLE"},
    "MKL_CBWR=AVX2,STRICT": {"MKL_CBWR": "AVX2,STRICT"},
    "MKL_CBWR=AVX512": {"MKL_CBWR": "AVX512"},
    "MKL_ENABLE_INSTRUCTIONS=AVX2, 2 threads": {
        "MKL_ENABLE_INSTRUCTIONS": "AVX2", "TWINRUN_EMULATED_THREADS": "2",
    },
    "MKL's AMD path, 2 threads": {"VENDOR": "amd", "TWINRUN_EMULATED_THREADS": "2"},
    "MKL's Intel path": {"VENDOR": "intel"},
    "oneDNN capped at AVX2, 4 threads": {
        "ONEDNN_MAX_CPU_ISA": "AVX2", "TWINRUN_EMULATED_THREADS": "4",
    },
    "oneDNN capped at AVX512_CORE (no VNNI), digit passes in torch": {
        "ONEDNN_MAX_CPU_ISA": "AVX512_CORE", "TWINRUN_DIGIT_KERNELS": "torch",
    },
    "float64 engine, 2 threads": {
        "TWINRUN_EXACT_ENGINE": "float64", "TWINRUN_EMULATED_THREADS": "2",
    },
}  # fmt: skip


def vendor_libraries(folder: Path) -> dict[str, Path]:
    """A preloadable library per vendor whose functions answer MKL's vendor questions."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("the vendor-path emulations need a C compiler (cc); install gcc")
    libraries = {}
    for vendor, (intel, intel_true, zen) in VENDOR_ANSWERS.items():
        source, lib = folder / f"{vendor}.c", folder / f"lib{vendor}_answers.so"
        source.write_text(
            f"int mkl_serv_intel_cpu_true(void) {{ return {intel_true}; }}\n"
            f"int mkl_serv_intel_cpu(void) {{ return {intel}; }}\n"
            f"int mkl_serv_cpuiszen(void) {{ return {zen}; }}\n"
        )
        subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(lib), str(source)], check=True)
        libraries[vendor] = lib
    return libraries


def emulate(
    name: str, extra: dict[str, str], folder: Path, vendors: dict[str, Path]
) -> dict[str, dict[str, str]]:
    settings = ("MKL_", "ONEDNN_", "TWINRUN_EMU", "TWINRUN_EXACT", "TWINRUN_DIGIT")
    env = {k: v for k, v in os.environ.items() if not k.startswith(settings)}
    env.pop("LD_PRELOAD", None)
    for key, value in extra.items():
        if key == "VENDOR":
            env["LD_PRELOAD"] = str(vendors[value])
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
    vendors = vendor_libraries(tmp_path)
    results = {name: emulate(name, extra, tmp_path, vendors) for name, extra in EMULATIONS.items()}
    reference = results["as-is"]["portable"]
    moved = {n: r["portable"] for n, r in results.items() if r["portable"] != reference}
    assert not moved, f"portable bytes moved under {sorted(moved)}: {moved} vs {reference}"
    for key in ("mm", "exp", "sqrt", "int8"):
        natives = {r["native"][key] for r in results.values()}
        assert len(natives) >= 2, f"no emulation moved MKL's {key}: the emulation is not real"
