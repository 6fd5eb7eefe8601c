"""Golden files: `DIR/golden-<fingerprint>.json` holds the suite's items for one platform.

    {"format": "twinrun.golden.v1", "fingerprint": {"torch": ..., "device": ..., "precision":
     ...}, "written_on": {"cpu_model": ..., "native_capability": ...},
     "items": {"sft.adapter_sha256": "...", ..., "extract.hidden": [512 floats]}}

On the CPU the suite runs with the portable kernels, so one file serves every x86-64 machine;
`written_on` says which machine wrote it. A check that fails on another kind of CPU names both
machines and never advises rewriting the file (that would break the machine that wrote it): it
is a portability bug, and `twinrun golden trace` names the first op that moved.

`write_golden` computes the suite and writes the file atomically (refusing to replace one
without `overwrite`). `check_golden` computes the suite and compares it with the file of this
platform, item by item in the suite's order, exactly (floats are stored with `repr`, so they read
back bit for bit). A platform without a file is a `GoldenMissing` error (exit 2) naming the
files DIR has.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twinrun.core import reading
from twinrun.core.errors import DataError, OutputError
from twinrun.core.fileio import atomic_write_json
from twinrun.golden.fingerprint import fingerprint, slug, written_on
from twinrun.golden.suite import run_suite

FORMAT = "twinrun.golden.v1"


class GoldenMissing(DataError):
    """DIR holds no golden file for this platform's fingerprint."""


def golden_path(folder: Path, fp: dict[str, Any]) -> Path:
    return folder / f"golden-{slug(fp)}.json"


def refuse_existing(path: Path, overwrite: bool, fmt: str = "") -> None:
    """A golden or trace file is replaced only with --overwrite, and only when it is one (its
    "format" is `fmt`, this file's by default): never a link, a folder or another file."""
    from twinrun.core.owned import claim_file, json_format

    if os.path.lexists(path) and not overwrite:
        raise OutputError(f"{path} exists", "pass --overwrite to replace it (after review)")
    claim_file(path, overwrite, "twinrun golden", json_format(fmt or FORMAT), what="golden file")


def write_golden(folder: str | Path, device: str = "cpu", overwrite: bool = False) -> Path:
    """Compute the suite and write this platform's golden file into `folder`."""
    fp = fingerprint(device)
    path = golden_path(Path(folder), fp)
    refuse_existing(path, overwrite)
    items = run_suite(device)
    Path(folder).mkdir(parents=True, exist_ok=True)
    doc = {"format": FORMAT, "fingerprint": fp, "written_on": written_on(device), "items": items}
    atomic_write_json(path, doc)
    return path


@dataclass
class Moved:
    """An item whose value moved: where (`item`, or `item[i]` for a list), expected and got."""

    item: str
    expected: Any
    got: Any


def machine_line(wrote: Any) -> str:
    """`written on <CPU> (<capability>); this machine: <CPU> (<capability>)`."""
    here = written_on("cpu")

    def name(w: Any) -> str:
        if not isinstance(w, dict):
            return "an unrecorded machine"
        if "device_name" in w:
            return str(w["device_name"])
        return f"{w.get('cpu_model', '?')} ({w.get('native_capability', '?')})"

    return f"written on {name(wrote)}; this machine: {name(here)}"


def same_machine_kind(wrote: Any) -> bool:
    return isinstance(wrote, dict) and wrote == written_on("cpu")


@dataclass
class GoldenResult:
    path: Path
    fingerprint: dict[str, Any]
    items: int
    moved: list[Moved]
    written_on: Any = None

    @property
    def ok(self) -> bool:
        return not self.moved

    def lines(self) -> list[str]:
        fp = self.fingerprint
        where = f"torch {fp['torch']}, {fp['device']}, {fp['precision']}"
        if self.ok:
            return [f"golden: PASS — {self.items} items equal {self.path} ({where})"]
        first = self.moved[0]
        names = ", ".join(m.item for m in self.moved[:8]) + (" ..." if len(self.moved) > 8 else "")
        lines = [
            f"golden: FAIL — first moved item {first.item}: expected {show(first.expected)}, "
            f"got {show(first.got)}",
            f"  {len(self.moved)} of {self.items} items moved: {names}",
            f"  {self.path} ({where})",
            f"  {machine_line(self.written_on)}",
        ]
        if not same_machine_kind(self.written_on):
            return lines + [
                "  the portable kernels promise these bytes on every x86-64 CPU, so this is a "
                "portability bug, not a file to rewrite here (that would break the machine that "
                f"wrote it): run `twinrun golden trace {self.path.parent}` to name the first op "
                "that moved, and report it",
            ]
        return lines + [
            "  if the change is intended (it moves every run alike: say why in the commit), run "
            f"`twinrun golden write {self.path.parent} --overwrite` on this platform and commit "
            f"{self.path.name}",
        ]


def show(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def compare_items(expected: dict[str, Any], got: dict[str, Any]) -> list[Moved]:
    """Every moved item, in the suite's order (`got`'s), then items only the file has."""
    moved = []
    for name, value in got.items():
        want = expected.get(name)
        if name not in expected:
            moved.append(Moved(name, None, value))
        elif isinstance(value, list) and isinstance(want, list) and len(value) == len(want):
            at = next((i for i, (a, b) in enumerate(zip(want, value, strict=True)) if a != b), None)
            if at is not None:
                moved.append(Moved(f"{name}[{at}]", want[at], value[at]))
        elif want != value:
            moved.append(Moved(name, want, value))
    moved += [Moved(name, expected[name], None) for name in expected if name not in got]
    return moved


def read_golden(path: Path) -> dict[str, Any]:
    try:
        text = reading.read_text(path, "golden file", 64 << 20, DataError,
                                 "rewrite it with twinrun golden write")  # fmt: skip
        doc = json.loads(text)
    except DataError:
        raise
    except (OSError, ValueError, RecursionError) as exc:
        raise DataError(
            f"cannot read {path}: {exc}", "rewrite it with twinrun golden write"
        ) from exc
    if (
        not isinstance(doc, dict)
        or doc.get("format") != FORMAT
        or not isinstance(doc.get("items"), dict)
    ):
        raise DataError(f"{path} is not a {FORMAT} file", "rewrite it with twinrun golden write")
    return doc


def check_golden(folder: str | Path, device: str = "cpu") -> GoldenResult:
    """Compute the suite and compare it with this platform's golden file in `folder`."""
    if not Path(folder).is_dir():  # said before torch loads (the fingerprint names torch)
        raise GoldenMissing(
            f"golden folder {folder} does not exist", "give the folder that holds the golden files"
        )
    fp = fingerprint(device)
    path = golden_path(Path(folder), fp)
    if not path.is_file():
        have = sorted(p.name for p in Path(folder).glob("golden-*.json"))
        raise GoldenMissing(
            f"no golden file for this platform ({path.name}) in {folder}; it has: "
            f"{', '.join(have) or 'none'}",
            f"run `twinrun golden write {folder}` on this platform and commit the file",
        )
    doc = read_golden(path)
    moved = compare_items(doc["items"], run_suite(device))
    return GoldenResult(path, fp, len(doc["items"]), moved, doc.get("written_on"))
