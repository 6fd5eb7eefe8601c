"""Reading diag.jsonl rows for `twinrun diff`, and the checksum codec.

Rows of format `twinrun.diag.v2` (what twinrun writes: XXH3-128 digests) and of the older
`twinrun.diag.v1` (SHA256 digests, the same checksums) are both read; each row keeps its format,
and `twinrun diff` compares digests only between rows of one format.

`parse_row` reads one line. A line in the exact layout the recorder writes (`json.dumps` with
its default separators, keys `format`, `step`, `phase`, `checksums`, `digests` in that order,
ASCII strings without escapes, checksums as JSON numbers) is taken apart with a few string
splits and one regular expression over the checksum texts, without building floats: the row
keeps each checksum's JSON number text (`DiagRow.text`), and `twinrun diff` converts only the
texts that differ between two runs (equal texts are equal values). Every other line — another
layout, escapes, non-ASCII, string checksums, anything malformed — goes through the full JSON
reader (`twinrun.core.jsonlimits`, bounded digits, depth and size), so a malformed line raises
the same DataError, naming the file and line, whichever way it would have been read. The fast
reader accepts a line only when that line is valid JSON with exactly the row it returns.

Checksums are written as JSON numbers, or as the strings "NaN", "Infinity", "-Infinity"
(`encode_float`); `decode_float` reads those back, and also the bare `NaN`/`Infinity`
literals Python's json module emits.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from twinrun.core import reading
from twinrun.core.errors import DataError
from twinrun.core.jsonlimits import DIAG, parse_json

__all__ = [
    "DIAG_FORMAT",
    "DIAG_FORMATS",
    "DiagRow",
    "decode_float",
    "encode_float",
    "iter_lines",
    "parse_row",
    "resolve_diag_path",
    "text_number",
]

DIAG_FORMAT = "twinrun.diag.v2"
# every row format this reader takes -> what its digests are
DIAG_FORMATS = {"twinrun.diag.v1": "SHA256", DIAG_FORMAT: "XXH3-128"}
_EXPECTED = " or ".join(repr(f) for f in reversed(DIAG_FORMATS))
_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_HINT = "each line of diag.jsonl must be one JSON object written by twinrun --diag"

# The layout the recorder writes, cut at every double quote (no string in it may hold one).
_HEAD = '{"format": "twinrun.diag.v'
_HEAD_PARTS = ["{", "format", ": "]
_STEP_PARTS = [", ", "step"]
_PHASE_PARTS = ["phase", ": "]
_CHECKS_PARTS = [", ", "checksums", ": {"]
_DIGESTS = '}, "digests": {'
_NUMBER_SEP = ', ": '  # between two checksum texts once the keys are cut out
# bytes that a JSON string may not hold raw (controls), or that start an escape (backslash)
_NOT_PLAIN = bytes(range(0x20)) + b"\\"
# JSON numbers, each followed by a comma: an integer of at most the reader's digit limit, a
# number with a fraction or exponent, or a literal Python's json module accepts. Possessive
# quantifiers: giving back a digit never helps a match here, and not trying is faster.
_INT = rf"-?(?:0|[1-9][0-9]{{0,{DIAG.max_int_digits - 1}}}+)"
_FLOAT = r"-?(?:0|[1-9][0-9]*+)(?:\.[0-9]++(?:[eE][-+]?[0-9]++)?|[eE][-+]?[0-9]++)"
_NUMBERS = re.compile(rf"(?:(?:{_FLOAT}|{_INT}|NaN|-?Infinity),)*+")


def encode_float(x: float) -> float | str:
    """A checksum as written to JSON: the float itself, or "NaN" / "Infinity" / "-Infinity"."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return float(x)


def decode_float(v: Any, path: Path, lineno: int, leaf: str) -> float:
    """A checksum as read from JSON (number, or "NaN"/"Infinity"/"-Infinity") as a float."""
    if type(v) is float:
        return v
    if isinstance(v, int) and not isinstance(v, bool):
        return float(v) if abs(v) < 2**1024 else math.copysign(math.inf, v)
    if isinstance(v, str) and v in _NONFINITE:
        return _NONFINITE[v]
    raise DataError(f"{path}:{lineno}: checksum of {leaf!r} is not a number: {v!r}", _HINT)


def text_number(text: str) -> float:
    """A checksum's JSON number text (as the fast reader keeps it) as the float `decode_float`
    gives for the value the JSON reader makes of it (an integer goes through int: -0 is 0.0)."""
    special = _NONFINITE.get(text)
    if special is not None:
        return special
    if "." in text or "e" in text or "E" in text:
        return float(text)
    return float(int(text))  # at most 40 digits: always below 2**1024


def resolve_diag_path(path: str | os.PathLike[str]) -> Path:
    """A diag.jsonl file, or a run directory containing one; DataError when there is none."""
    p = Path(path)
    if p.is_dir():
        f = p / "diag.jsonl"
        if not f.is_file():
            raise DataError(f"{p}: no diag.jsonl in this run directory", "run it with --diag")
        return f
    if not p.exists():
        raise DataError(f"{p}: no such file or directory", "give a diag.jsonl or a run directory")
    return p


class DiagRow:
    """One parsed diag row: leaf -> checksum and leaf -> digest. A checksum is the raw JSON
    value, or with `text` its JSON number text (see the module docstring); `number` reads
    either as a float."""

    __slots__ = ("phase", "step", "checks", "digs", "lineno", "text", "fmt")

    def __init__(
        self, phase: str, step: int, checks: dict, digs: dict, lineno: int, text: bool = False,
        fmt: str | None = DIAG_FORMAT,
    ) -> None:  # fmt: skip
        self.phase = phase
        self.step = step
        self.checks = checks
        self.digs = digs
        self.lineno = lineno
        self.text = text
        # one of DIAG_FORMATS (digests of two formats are not comparable); None for a row
        # that names none, whose digests are taken as comparable with any row's
        self.fmt = fmt

    def leaves(self) -> list[str]:
        out = list(self.checks)
        if len(self.digs) != len(out) or any(k not in self.checks for k in self.digs):
            out += [k for k in self.digs if k not in self.checks]
        return out

    def number(self, leaf: str, path: Path) -> float | None:
        """The leaf's checksum as a float; None when the row has none (or a JSON null)."""
        v = self.checks.get(leaf)
        if v is None:
            return None
        if self.text:
            return text_number(v)
        return decode_float(v, path, self.lineno, leaf)


def iter_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(line number, stripped bytes) of each non-blank line; DataError if unreadable."""
    for lineno, raw in reading.iter_lines(path, "diag file", DIAG.max_bytes, DIAG.max_file_bytes):
        raw = raw.strip()
        if raw:
            yield lineno, raw


def parse_row(raw: bytes, path: Path, lineno: int) -> DiagRow | None:
    """Parse one line; None for another twinrun row kind (e.g. a step trace) to skip."""
    row = _plain_row(raw, lineno)
    if row is not None:
        return row
    obj = parse_json(raw, f"{path}:{lineno}", DIAG)  # bounded digits, depth and size
    if type(obj) is not dict:
        raise DataError(f"{path}:{lineno}: a row must be a JSON object", _HINT)
    fmt = obj.get("format")
    step = obj.get("step")
    phase = obj.get("phase", "train")
    checks = obj.get("checksums", {})
    digs = obj.get("digests", {})
    known = fmt is None or (type(fmt) is str and fmt in DIAG_FORMATS)
    if (
        known
        and type(step) is int
        and type(phase) is str
        and phase
        and type(checks) is dict
        and type(digs) is dict
    ):
        return DiagRow(phase, step, checks, digs, lineno, fmt=fmt)
    where = f"{path}:{lineno}"
    if not known:
        if isinstance(fmt, str) and fmt.startswith("twinrun.diag."):
            raise DataError(
                f"{where}: diag format {fmt!r} is not one this twinrun reads ({_EXPECTED})",
                "a newer twinrun wrote it? upgrade twinrun to compare this file",
            )
        if isinstance(fmt, str) and fmt.startswith("twinrun."):
            return None  # another twinrun row kind (e.g. a step trace): not compared here
        raise DataError(f"{where}: unknown format {fmt!r} (expected {_EXPECTED})", _HINT)
    if type(step) is not int:
        raise DataError(f"{where}: 'step' must be an integer, got {step!r}", _HINT)
    if type(phase) is not str or not phase:
        raise DataError(f"{where}: 'phase' must be a non-empty string, got {phase!r}", _HINT)
    raise DataError(f"{where}: 'checksums' and 'digests' must be JSON objects", _HINT)


def _plain_row(raw: bytes, lineno: int) -> DiagRow | None:
    """The row of a line in the recorder's own layout, or None to read it as JSON.

    Since no string in such a line holds a double quote, cutting the line at every quote gives
    its tokens; each is checked against the layout: the fixed parts by equality, the step as
    digits, keys and strings as plain ASCII (no control character, no backslash), checksums by
    `_NUMBERS`. Anything that does not fit returns None, never an error."""
    if len(raw) > DIAG.max_bytes or not raw.isascii():
        return None
    if len(raw.translate(None, _NOT_PLAIN)) != len(raw):
        return None
    text = raw.decode("ascii")
    if not text.startswith(_HEAD) or not text.endswith("}}"):
        return None
    head, found, digests = text.partition(_DIGESTS)
    if not found:
        return None
    p = head.split('"')
    if (
        p[:3] != _HEAD_PARTS
        or p[3] not in DIAG_FORMATS
        or p[4:6] != _STEP_PARTS
        or p[7:9] != _PHASE_PARTS
        or p[10:13] != _CHECKS_PARTS
        or not len(p) % 2
        or not p[9]  # an empty phase: the JSON reader names the error
        or not p[6].endswith(", ")
    ):
        return None
    step = p[6][2:-2]
    if not step.isdigit() or len(step) > DIAG.max_int_digits or (step[0] == "0" and step != "0"):
        return None
    keys, values = p[13::2], p[14::2]
    if keys:
        # ': 1.5, ' + ': 2.5' joined at the quotes: one separator per boundary, or no fit
        joined = '"'.join(values)
        texts = joined[2:].split(_NUMBER_SEP)
        if (
            not joined.startswith(": ")
            or len(texts) != len(keys)
            or _NUMBERS.fullmatch(",".join(texts) + ",") is None
        ):
            return None
    else:
        texts = []
    body = digests[:-2]
    if body:
        d = body.split('"')
        m = len(d) // 4
        if (
            len(d) != 4 * m + 1
            or d[0]
            or d[-1]
            or d[2::4].count(": ") != m
            or d[4:-1:4].count(", ") != m - 1
        ):
            return None
        digs = dict(zip(d[1::4], d[3::4], strict=True))
    else:
        digs = {}
    checks = dict(zip(keys, texts, strict=True))
    return DiagRow(p[9], int(step), checks, digs, lineno, True, p[3])
