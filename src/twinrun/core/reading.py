"""Every file a user hands twinrun is read through here: configs, examples, corpora, diag and
trace files, manifests, tokenizer and adapter configs.

Two rules, so that no input can hang a command or exhaust its memory:
- the path must name a regular file. A FIFO, a device, a socket or a directory is refused by
  kind before any read (a FIFO blocks an open forever, /dev/zero reads without end), and the
  open itself is non-blocking, so a FIFO swapped in after the check cannot hang it either;
- every read has a byte cap: per file, and per line where the file is read by lines.

Each refusal is one line naming the file, raised as the caller's error class (ConfigError for a
config, DataError for data, ModelError for a model's files).
"""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Iterator

from twinrun.core.errors import DataError, TwinrunError

MiB = 1 << 20

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str | None:
    """None for a regular file, else what the path is ("a FIFO", ...)."""
    if stat.S_ISREG(mode):
        return None
    return next((word for test, word in _KINDS if test(mode)), "not a regular file")


def check_path_text(path: str | os.PathLike[str], what: str, error: type[TwinrunError]) -> str:
    """The path as a string; `error` when it holds a NUL byte (no OS call accepts one)."""
    text = os.fspath(path)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if "\0" in text:
        raise error(f"the {what} path contains a NUL byte", "remove it from the path")
    return text


def open_regular(
    path: str | os.PathLike[str],
    what: str,
    error: type[TwinrunError] = DataError,
    hint: str = "check the path",
    missing: str | None = None,
) -> io.BufferedReader:
    """`path` opened for binary reading, refused unless it is an existing regular file.

    `missing` is the message for a path that does not exist ("{what} not found: {path}")."""
    p = check_path_text(path, what, error)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise error(missing or f"{what} not found: {p}", hint) from None
    except OSError as exc:
        raise error(f"{what} {p} cannot be read ({exc.strerror or exc})", hint) from None
    if (kind := _kind(st.st_mode)) is not None:
        raise error(f"{what} {p} is {kind}, not a file", hint)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise error(f"{what} {p} cannot be read ({exc.strerror or exc})", hint) from None
    kind = _kind(os.fstat(fd).st_mode)
    if kind is not None:  # replaced between the stat and the open
        os.close(fd)
        raise error(f"{what} {p} is {kind}, not a file", hint)
    return os.fdopen(fd, "rb")


def read_bytes(
    path: str | os.PathLike[str],
    what: str,
    max_bytes: int,
    error: type[TwinrunError] = DataError,
    hint: str = "check the path",
    missing: str | None = None,
) -> bytes:
    """The bytes of a regular file of at most `max_bytes`."""
    with open_regular(path, what, error, hint, missing) as fh:
        try:
            data = fh.read(max_bytes + 1)
        except OSError as exc:
            raise error(
                f"{what} {os.fspath(path)} cannot be read ({exc.strerror or exc})"
            ) from None
    if len(data) > max_bytes:
        raise error(
            f"{what} {os.fspath(path)} is larger than the limit of {max_bytes} bytes",
            "split or shorten it",
        )
    return data


def read_text(
    path: str | os.PathLike[str],
    what: str,
    max_bytes: int,
    error: type[TwinrunError] = DataError,
    hint: str = "check the path",
    missing: str | None = None,
) -> str:
    """The UTF-8 text of a regular file of at most `max_bytes`."""
    data = read_bytes(path, what, max_bytes, error, hint, missing)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(
            f"{what} {os.fspath(path)} is not UTF-8 text (byte {exc.start})", "save it as UTF-8"
        ) from None


def iter_lines(
    path: str | os.PathLike[str],
    what: str,
    max_line: int,
    max_file: int,
    error: type[TwinrunError] = DataError,
    hint: str = "check the path",
) -> Iterator[tuple[int, bytes]]:
    """(line number, line without its end) for every line of a regular file; `error` for a
    line over `max_line` bytes or a file over `max_file`. Memory stays at one line."""
    fh = open_regular(path, what, error, hint)
    p = os.fspath(path)
    size = os.fstat(fh.fileno()).st_size
    if size > max_file:
        fh.close()
        raise error(f"{what} {p} is {size} bytes, over the limit of {max_file}", "split it")
    with fh:
        lineno = total = 0
        while True:
            try:
                line = fh.readline(max_line + 2)
            except OSError as exc:
                raise error(f"{what} {p} cannot be read ({exc.strerror or exc})") from None
            if not line:
                return
            lineno += 1
            total += len(line)
            body = line.rstrip(b"\r\n")
            if len(body) > max_line:
                raise error(
                    f"{p}:{lineno}: a line over the limit of {max_line} bytes", "shorten the line"
                )
            if total > max_file:  # the file grew while it was read
                raise error(f"{what} {p} is over the limit of {max_file} bytes", "split it")
            yield lineno, body
