"""A JSON array file (an examples file written as `[{...}, {...}]`) parsed as a stream: read a
chunk of bytes at a time and decoded one element at a time, each element within the limits of one
JSONL row (`core.jsonlimits`). Memory holds the element being parsed and a chunk or two of text —
never the file's bytes or its whole text (a 300 MB array of text with one character outside
Latin-1 is 1.2 GB as a Python string).

Every refusal is a DataError naming the file, and the element (`FILE[N]`) where one is at fault;
a syntax error gives its line and column in the file.
"""

from __future__ import annotations

import codecs
import json
import os
from collections.abc import Iterator
from typing import Any, BinaryIO

from twinrun.core import reading
from twinrun.core.errors import DataError
from twinrun.core.jsonlimits import Limits, _check_shape, _decoder, _json_errors, _skip_ws

CHUNK = 1 << 20  # bytes read at a time
LOOKAHEAD = 512  # an element must end this far before the text read so far (or at the end of
# the file): a number cut by a chunk's end ("1.5e" | "10") parses as a shorter one otherwise


class _Text:
    """The document's text from the first character not yet parsed: `text`, read on demand."""

    def __init__(self, fh: BinaryIO, where: str, max_file: int) -> None:
        self.fh, self.where, self.max_file = fh, where, max_file
        self.decoder = codecs.getincrementaldecoder("utf-8")("strict")
        self.text = ""
        self.eof = False
        self.read = 0  # bytes read
        self.lines = 0  # newlines in the text dropped before `text`
        self.column = 0  # characters after the last of them
        self.started = False

    def more(self, keep: int) -> int:
        """Drop the text before `keep` and append the next chunk's; returns how far positions
        moved (`keep`), or -1 at the end of the file (then nothing changes)."""
        if self.eof:
            return -1
        try:
            data = self.fh.read(CHUNK)
        except OSError as exc:
            raise DataError(f"{self.where} cannot be read ({exc.strerror or exc})") from None
        self.read += len(data)
        if self.read > self.max_file:
            raise DataError(
                f"examples file {self.where} is over the limit of {self.max_file} bytes",
                "split it",
            )
        try:
            piece = self.decoder.decode(data, final=not data)
        except UnicodeDecodeError as exc:
            raise DataError(
                f"{self.where}: not UTF-8 text ({exc.reason})", "save it as UTF-8"
            ) from None
        if not self.started and piece:
            piece, self.started = piece.removeprefix("\ufeff"), True
        self.eof = not data
        dropped = self.text[:keep]
        newline = dropped.rfind("\n")
        self.lines += dropped.count("\n")
        self.column = len(dropped) - newline - 1 if newline >= 0 else self.column + len(dropped)
        self.text = self.text[keep:] + piece
        return keep

    def skip_ws(self, i: int) -> int:
        """The position of the next character that is not white space (or the text's end, at
        the end of the file); reads on as needed, so `i` may move: the result is in `text`."""
        while True:
            i = _skip_ws(self.text, i)
            if i < len(self.text):
                return i
            moved = self.more(i)
            if moved < 0:
                return i
            i -= moved

    def syntax_error(self, exc: json.JSONDecodeError) -> DataError:
        column = exc.colno + (self.column if exc.lineno == 1 else 0)
        return DataError(
            f"{self.where}: not valid JSON ({exc.msg} at line {exc.lineno + self.lines} "
            f"column {column})",
            "fix or regenerate the file",
        )


def _element(doc: _Text, i: int, at: str, limits: Limits, decode: Any) -> tuple[Any, int]:
    """(value, end) of the element that starts at `i` of `doc.text` (read on until it is
    whole, the text before it dropped: `i` becomes 0), within `limits` like one JSONL row."""
    while True:
        syntax: json.JSONDecodeError | None = None
        with _json_errors(at, limits):
            try:
                value, end = decode(doc.text, i)
            except json.JSONDecodeError as exc:
                syntax, end = exc, -1
            if end >= 0 and (doc.eof or len(doc.text) - end >= LOOKAHEAD):
                if end - i <= limits.max_bytes:
                    _check_shape(value, limits)
                break
        if syntax is not None and doc.eof:
            raise doc.syntax_error(syntax)
        if len(doc.text) - i > limits.max_bytes + LOOKAHEAD:
            break  # not whole within a row's limit: refused below, however it would end
        i -= max(doc.more(i), 0)  # the element's text is kept; it starts at 0 now
    if end < 0 or end - i > limits.max_bytes:
        raise DataError(
            f"{at}: a row over the limit of {limits.max_bytes} bytes", "shorten the row"
        )
    return value, end


def _after_element(doc: _Text, end: int) -> tuple[int, bool]:
    """What follows an element that ends at `end`: (the next element's start, False) after a
    comma, or (the position past the closing bracket, True); DataError for anything else."""
    i = doc.skip_ws(end)
    sep = doc.text[i : i + 1]
    if sep == "]":
        return i + 1, True
    if sep != ",":
        line = doc.lines + doc.text.count("\n", 0, i) + 1
        raise DataError(
            f"{doc.where}: not valid JSON (expected ',' or ']' at line {line})",
            "fix or regenerate the file",
        )
    return doc.skip_ws(i + 1), False


def iter_json_array(
    path: str | os.PathLike[str], what: str, limits: Limits
) -> Iterator[tuple[int, Any]]:
    """(index, value) for each element of the JSON array file at `path` (a regular file of at
    most `limits.max_file_bytes`), parsed as a stream, one element at a time: a caller that
    stops at a row count stops the reading there too."""
    where = os.fspath(path)
    with reading.open_regular(path, what) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > limits.max_file_bytes:
            raise DataError(
                f"{what} {where} is {size} bytes, over the limit of {limits.max_file_bytes}",
                "split it",
            )
        doc = _Text(fh, where, limits.max_file_bytes)
        decode = _decoder(limits).raw_decode
        i = doc.skip_ws(0)
        if doc.text[i : i + 1] != "[":
            raise DataError(f"{where}: not a JSON array", "fix or regenerate the file")
        i = doc.skip_ws(i + 1)
        if doc.text[i : i + 1] == "]":
            i += 1
        else:
            index, done = 0, False
            while not done:
                value, end = _element(doc, i, f"{where}[{index}]", limits, decode)
                yield index, value
                index += 1
                i, done = _after_element(doc, end)
        if doc.skip_ws(i) != len(doc.text) or not doc.eof:
            raise DataError(f"{where}: not valid JSON (extra data after the array)")
