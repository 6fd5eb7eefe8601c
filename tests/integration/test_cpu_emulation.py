"""The portable mode's bytes do not move when another CPU is emulated on this one: MKL's branches
(`MKL_CBWR`), an instruction limit (`MKL_ENABLE_INSTRUCTIONS`), MKL's AMD and Intel code paths
forced by a preloaded library that answers MKL's vendor questions as that vendor's CPU would,
and two threads.

Each emulation is a fresh process (MKL reads its settings once). The same processes show that
the emulations are real: MKL's own results (a float32 product, exp, sqrt) move between them. On
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
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MKL_", "TWINRUN_EMU"))}
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
    for key in ("mm", "exp", "sqrt"):
        natives = {r["native"][key] for r in results.values()}
        assert len(natives) >= 2, f"no emulation moved MKL's {key}: the emulation is not real"
