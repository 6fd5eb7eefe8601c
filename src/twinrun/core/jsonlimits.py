"""JSON and JSONL parsed with limits, so that no input file can exhaust memory or end in an
internal error: bytes per file and per row, digits per integer, nesting depth, no lone UTF-16
surrogate, no NaN/Infinity unless the format allows them. Every violation is one DataError line
naming the file (and line), never echoing the offending value.

Every parser of a file a user hands twinrun goes through here: examples, manifests, payload
metadata, diag rows, sidecars, checkpoint and inputs records, evidence metrics rows.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twinrun.core import reading
from twinrun.core.errors import DataError

MiB = 1 << 20


@dataclass(frozen=True)
class Limits:
    """Bounds on one JSON document (a file, or one JSONL row) and on a whole file."""

    max_bytes: int = 16 * MiB  # one document
    max_file_bytes: int = 1024 * MiB  # a whole file (JSONL: all rows together)
    max_depth: int = 64
    max_int_digits: int = 40  # 2**128 has 39
    allow_nonfinite: bool = False  # NaN / Infinity / numbers that overflow a float
    max_rows: int | None = None  # rows of an examples source (None: bounded by bytes only)


DEFAULT = Limits()
EXAMPLES = Limits(max_bytes=8 * MiB, max_file_bytes=1024 * MiB, max_rows=1_000_000)  # a row
# bigger than 8 MiB of text is far past any context window; the limit keeps tokenization memory
# bounded. A million rows (tiny ones hold ~0.5 GB as Python objects) in any format: JSONL, a JSON
# array, CSV, Parquet (counted from its footer, before any row is read) or a save_to_disk folder
SMALL = Limits(max_bytes=4 * MiB, max_file_bytes=4 * MiB)  # manifests, records, configs
RECORDS = Limits(max_bytes=256 * MiB, max_file_bytes=256 * MiB)  # checkpoint state (metrics)
DIAG = Limits(max_bytes=4 * MiB, max_file_bytes=4096 * MiB, allow_nonfinite=True)

_SURROGATE = re.compile("[\ud800-\udfff]")


class _Refused(Exception):
    """Raised from inside the decoder hooks; turned into a DataError with the location."""


def _parse_int(limits: Limits) -> Any:
    def parse(text: str) -> int:
        if len(text.lstrip("-")) > limits.max_int_digits:
            raise _Refused(f"an integer with more than {limits.max_int_digits} digits")
        return int(text)

    return parse


def _parse_float(limits: Limits) -> Any:
    def parse(text: str) -> float:
        if len(text) > 400:  # no float needs more; keeps float() linear and cheap
            raise _Refused("a number written with more than 400 characters")
        value = float(text)
        if not limits.allow_nonfinite and not math.isfinite(value):
            raise _Refused("a number too large for a float")
        return value

    return parse


def _parse_constant(limits: Limits) -> Any:
    def parse(name: str) -> float:
        if not limits.allow_nonfinite:
            raise _Refused(f"{name}, which is not a JSON number")
        return float(name.replace("Infinity", "inf"))

    return parse


@functools.lru_cache(maxsize=32)
def _decoder(limits: Limits) -> json.JSONDecoder:
    """A decoder built once per limits (json.loads with hooks builds one per call): `decode`
    for a whole document, `raw_decode` for one element of an array."""
    return json.JSONDecoder(
        parse_int=_parse_int(limits),
        parse_float=None if limits.allow_nonfinite else _parse_float(limits),
        parse_constant=_parse_constant(limits),
    )


def _check_shape(value: Any, limits: Limits) -> None:
    """Depth and strings, walked without recursion."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                raise _Refused("a lone UTF-16 surrogate (\\ud800-\\udfff) in a string")
        elif isinstance(item, dict | list):
            if depth > limits.max_depth:
                raise _Refused(f"nesting deeper than {limits.max_depth} levels")
            children = item.items() if isinstance(item, dict) else enumerate(item)
            for k, v in children:
                if isinstance(k, str) and _SURROGATE.search(k):
                    raise _Refused("a lone UTF-16 surrogate (\\ud800-\\udfff) in a key")
                stack.append((v, depth + 1))


def parse_json(text: str | bytes, where: str, limits: Limits = DEFAULT) -> Any:
    """One JSON document, within `limits`; DataError naming `where` otherwise."""
    raw_str = isinstance(text, str)  # strict UTF-8 decoding never yields a lone surrogate
    size = len(text.encode("utf-8", "surrogatepass")) if isinstance(text, str) else len(text)
    if size > limits.max_bytes:
        raise DataError(
            f"{where}: {size} bytes, over the limit of {limits.max_bytes} for one JSON document",
            "split or shorten it",
        )
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(f"{where}: not UTF-8 text ({exc.reason})", "save it as UTF-8") from exc
    # the walk costs Python time per value: only when the text could break its limits (diag
    # files are parsed at ~100k rows a second)
    deep = text.count("[") + text.count("{") > limits.max_depth
    escaped = "\\u" in text or (raw_str and _SURROGATE.search(text) is not None)
    with _json_errors(where, limits):
        value = _decoder(limits).decode(text)
        if deep or escaped:
            _check_shape(value, limits)
    return value


@contextlib.contextmanager
def _json_errors(at: str, limits: Limits, document: str | None = None) -> Iterator[None]:
    """A parse's failures as one DataError line: a refused value, nesting, or invalid JSON at
    `at` (a syntax error's line and column are the `document`'s, when `at` is one element)."""
    try:
        yield
    except _Refused as exc:
        raise DataError(f"{at}: refused {exc}", "fix or regenerate the file") from None
    except RecursionError:
        raise DataError(
            f"{at}: refused nesting deeper than {limits.max_depth} levels",
            "fix or regenerate the file",
        ) from None
    except json.JSONDecodeError as exc:
        raise DataError(
            f"{document or at}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})",
            "fix or regenerate the file",
        ) from None
    except ValueError as exc:  # e.g. int() beyond Python's own digit limit
        raise DataError(f"{at}: not valid JSON ({type(exc).__name__})") from None


_WS = re.compile(r"[ \t\n\r]*")


def _skip_ws(text: str, i: int) -> int:
    """The position of the first character at or after `i` that is not JSON white space."""
    return _WS.match(text, i).end()  # type: ignore[union-attr]  # _WS matches the empty string: never None


def read_limited(path: str | os.PathLike[str], what: str, max_bytes: int) -> bytes:
    """The bytes of `path`, refusing a missing, unreadable, too large or not regular file."""
    return reading.read_bytes(path, what, max_bytes)


def load_json_file(path: str | os.PathLike[str], what: str, limits: Limits = SMALL) -> Any:
    """A whole-file JSON document (manifest, record, sidecar) within `limits`."""
    data = read_limited(path, what, min(limits.max_bytes, limits.max_file_bytes))
    return parse_json(data, f"{what} {path}", limits)


def iter_jsonl(
    path: str | os.PathLike[str], what: str, limits: Limits = DEFAULT
) -> Iterator[tuple[int, Any]]:
    """(line number, value) for every non-blank line of a JSONL file, each within `limits`;
    the file as a whole within `limits.max_file_bytes`. Read line by line: memory stays at
    one row."""
    p = Path(path)
    for lineno, body in reading.iter_lines(p, what, limits.max_bytes, limits.max_file_bytes):
        if body.strip():
            yield lineno, parse_json(body, f"{p}:{lineno}", limits)


#: the sections of a run's sidecar (`twinrun.json`) that are JSON objects whenever present
SIDECAR_SECTIONS = (
    "train", "model", "data", "adapter", "determinism", "runtime", "metrics", "inputs", "eval",
    "replay", "reward_head", "tokenizer", "init_adapter",
)  # fmt: skip


def check_sidecar(record: Any, where: str, what: str = "sidecar") -> dict[str, Any]:
    """`record` when it is a JSON object whose sections (`SIDECAR_SECTIONS`, where present) are
    objects too; one DataError naming the first that is not, so that no reader of a sidecar (or
    of a run's inputs record, `what`) meets a list where it reads a section."""
    if not isinstance(record, dict):
        raise DataError(f"{where}: a {what} must be a JSON object", "point at a twinrun run")
    for name in SIDECAR_SECTIONS:
        if name in record and not isinstance(record[name], dict):
            raise DataError(
                f"{where}: the {what}'s {name} section is a {_json_kind(record[name])}, "
                "not an object",
                f"give the directory a run wrote, with its {Path(where).name} unedited",
            )
    return record


def _json_kind(value: Any) -> str:
    kinds = {list: "list", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else kinds.get(type(value), type(value).__name__)
