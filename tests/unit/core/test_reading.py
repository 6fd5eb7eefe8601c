"""core/reading.py: only regular files are opened (a FIFO, a device, a socket and a directory are
refused by kind, without blocking), every read is capped per file and per line, a NUL byte in a
path is one line, and the error is the caller's class."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest

from twinrun.core import reading
from twinrun.core.errors import ConfigError, DataError


def refused(path: str | Path, **kw: object) -> str:
    with pytest.raises(DataError) as err:
        reading.read_bytes(path, "input", 1 << 20, **kw)  # type: ignore[arg-type]
    line = err.value.one_line()
    assert "\n" not in line
    return line


def test_a_fifo_is_refused_by_kind_without_blocking(tmp_path: Path) -> None:
    """Opening a FIFO that no one writes would block for ever: the read runs on a thread
    given 60 s, far from the microseconds a refusal by kind takes."""
    os.mkfifo(tmp_path / "f")
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(refused(tmp_path / "f")), daemon=True)
    reader.start()
    reader.join(60)
    assert not reader.is_alive(), "the read blocked on the FIFO"
    assert lines == [f"input {tmp_path / 'f'} is a FIFO, not a file — check the path"]


def test_a_character_device_is_refused_by_kind() -> None:
    assert (
        refused("/dev/zero") == "input /dev/zero is a character device, not a file — check the path"
    )


def test_a_directory_is_refused_by_kind(tmp_path: Path) -> None:
    assert refused(tmp_path) == f"input {tmp_path} is a directory, not a file — check the path"


def test_a_socket_is_refused_by_kind(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        assert "is a socket, not a file" in refused(path)


def test_a_missing_file_names_what_it_is(tmp_path: Path) -> None:
    assert refused(tmp_path / "no") == f"input not found: {tmp_path / 'no'} — check the path"
    assert refused(tmp_path / "no", missing="gone").startswith("gone")


def test_a_nul_byte_in_a_path_is_one_line() -> None:
    assert refused("a\0b") == "the input path contains a NUL byte — remove it from the path"


def test_the_file_cap(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x" * 11)
    assert reading.read_bytes(tmp_path / "f", "input", 11) == b"x" * 11
    with pytest.raises(DataError, match="larger than the limit of 10 bytes"):
        reading.read_bytes(tmp_path / "f", "input", 10)


def test_the_line_cap_reads_no_more_than_one_line(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"ab\r\n" + b"c" * 6 + b"\n\n")
    assert list(reading.iter_lines(tmp_path / "f", "input", 6, 100)) == [
        (1, b"ab"),
        (2, b"cccccc"),
        (3, b""),
    ]
    with pytest.raises(DataError, match=r":2: a line over the limit of 5 bytes"):
        list(reading.iter_lines(tmp_path / "f", "input", 5, 100))
    with pytest.raises(DataError, match="is 12 bytes, over the limit of 11"):
        list(reading.iter_lines(tmp_path / "f", "input", 6, 11))


def test_text_must_be_utf8_and_the_error_is_the_callers_class(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"ok \xff")
    with pytest.raises(ConfigError, match=r"is not UTF-8 text \(byte 3\)"):
        reading.read_text(tmp_path / "f", "config file", 100, ConfigError)
    os.mkfifo(tmp_path / "p")
    with pytest.raises(ConfigError, match="is a FIFO"):
        reading.read_text(tmp_path / "p", "config file", 100, ConfigError)
