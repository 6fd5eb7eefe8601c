"""Reading diag rows: the plain reader (the recorder's own layout, checksums kept as number
texts) gives exactly the row the JSON reader gives, and declines every line it cannot vouch for,
so malformed lines still get the JSON reader's error."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest

from tests.integration.diff_cases import MALFORMED, ODD_BUT_VALID
from twinrun.core.errors import DataError
from twinrun.core.jsonlimits import DIAG, parse_json
from twinrun.diag.rows import DiagRow, _plain_row, decode_float, parse_row, text_number

WHERE = Path("diag.jsonl")
VALUES = [0.0, -0.0, 1.0, 0.1, 1e16, 1e-05, 5e-324, 1.7976931348623157e308, -2.5, 12345.678,
          3, -7, 0, 10**39]  # fmt: skip


def line(checks: dict, digests: dict | None = None, step: int = 3, phase: str = "train") -> bytes:
    digests = {k: f"{i:064x}" for i, k in enumerate(checks)} if digests is None else digests
    obj = {"format": "twinrun.diag.v1", "step": step, "phase": phase, "checksums": checks,
           "digests": digests}  # fmt: skip
    return json.dumps(obj).encode()


def bits(x: float) -> bytes:
    return struct.pack("<d", x)


def json_row(raw: bytes) -> dict:
    return parse_json(raw, "x", DIAG)


def assert_same_row(row: DiagRow, raw: bytes) -> None:
    obj = json_row(raw)
    assert (row.phase, row.step) == (obj["phase"], obj["step"])
    assert list(row.checks) == list(obj["checksums"]) and row.digs == obj["digests"]
    assert list(row.digs) == list(obj["digests"])
    for leaf, v in obj["checksums"].items():
        assert bits(row.number(leaf, WHERE)) == bits(decode_float(v, WHERE, 1, leaf))


def test_recorder_lines_are_read_as_text_with_the_same_numbers() -> None:
    raw = line({f"leaf{i}": v for i, v in enumerate(VALUES)}, step=123456)
    row = _plain_row(raw, 1)
    assert row is not None and row.text and row.step == 123456
    assert row.checks["leaf0"] == "0.0" and row.checks["leaf13"] == str(10**39)
    assert_same_row(row, raw)
    assert bits(row.number("leaf1", WHERE)) == bits(-0.0)


def test_bare_literals_integers_and_empty_objects() -> None:
    raw = b'{"format": "twinrun.diag.v1", "step": 0, "phase": "eval", "checksums": {"a": NaN, '
    raw += b'"b": -Infinity, "c": -0, "d": 1E+400}, "digests": {}}'
    row = _plain_row(raw, 1)
    assert row is not None and row.digs == {}
    assert math.isnan(row.number("a", WHERE)) and row.number("b", WHERE) == -math.inf
    assert bits(row.number("c", WHERE)) == bits(0.0)  # the JSON reader makes an int of -0
    assert row.number("d", WHERE) == math.inf
    raw = line({}, {})
    assert (_plain_row(raw, 1).checks, _plain_row(raw, 1).digs) == ({}, {})
    raw = line({}, {"x": "ab"})
    assert_same_row(_plain_row(raw, 1), raw)


def test_text_number_matches_the_json_reader() -> None:
    for text in ["0", "-0", "12", "1.5", "-1.5e-3", "1E+05", "NaN", "Infinity", "-Infinity",
                 "9" * 40, "2.2250738585072014e-308"]:  # fmt: skip
        want = decode_float(json_row(f"[{text}]".encode())[0], WHERE, 1, "x")
        assert bits(text_number(text)) == bits(want), text


@pytest.mark.parametrize("name", sorted(ODD_BUT_VALID))
def test_other_layouts_are_left_to_the_json_reader(name: str) -> None:
    raw = ODD_BUT_VALID[name].strip()
    plain = ("int_checksum", "exponent", "big_exponent", "crlf", "duplicate_key")  # the layout
    assert (_plain_row(raw, 1) is None) == (name not in plain)
    row = parse_row(raw, WHERE, 1)
    assert row is not None
    assert_same_row(row, raw)


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_lines_are_never_read_plainly(name: str) -> None:
    assert _plain_row(MALFORMED[name], 1) is None or name == "duplicate_step"


def test_string_checksums_and_escapes_go_to_the_json_reader() -> None:
    for raw in (
        line({"loss": "NaN"}),
        line({"loss": 1.0}, {"loss": "\\u0041"}),
        line({"lo\u00dfs": 1.0}),
        line({"loss": 1.0}, step=-1),
    ):
        assert _plain_row(raw, 1) is None
        assert_same_row(parse_row(raw, WHERE, 1), raw)
    raw = line({"loss": 1.0}).replace(b'"train"', b'"tr\tin"')  # a raw tab in a string
    assert _plain_row(raw, 1) is None
    with pytest.raises(DataError, match=r"diag\.jsonl:1: not valid JSON \(Invalid control"):
        parse_row(raw, WHERE, 1)
    raw = line({"loss": 1.0}).replace(b'"train"', b'"tr\x7fin"')  # DEL is a valid JSON char
    assert_same_row(_plain_row(raw, 1), raw)
    with pytest.raises(DataError, match=r"diag\.jsonl:1: checksum of 'loss' is not a number"):
        parse_row(line({"loss": "1.5"}), WHERE, 1).number("loss", WHERE)


@pytest.mark.parametrize("fmt", ["twinrun.diag.v1", "twinrun.diag.v2"])
def test_both_formats_are_read_and_keep_their_format(fmt: str) -> None:
    raw = line({"loss": 0.5, "lr": 1e-3}).replace(b"twinrun.diag.v1", fmt.encode())
    fast = _plain_row(raw, 1)
    assert fast is not None and fast.fmt == fmt
    slow = parse_row(raw.replace(b'"step": 3', b'"step":  3'), WHERE, 1)  # not the plain layout
    assert slow is not None and not slow.text and slow.fmt == fmt
    assert_same_row(fast, raw)


def test_a_row_without_a_format_has_none() -> None:
    row = parse_row(b'{"step": 0, "checksums": {"loss": 1.0}, "digests": {}}', WHERE, 1)
    assert row is not None and row.fmt is None


@pytest.mark.parametrize(
    ("fmt", "says"),
    [
        ('"twinrun.diag.v9"', "diag format 'twinrun.diag.v9' is not one this twinrun reads"),
        ('["twinrun.diag.v2"]', "unknown format ['twinrun.diag.v2']"),
        ('{"v": 2}', "unknown format {'v': 2}"),
    ],
)
def test_a_format_this_reader_does_not_know_is_one_error(fmt: str, says: str) -> None:
    raw = line({"loss": 0.5}).replace(b'"twinrun.diag.v1"', fmt.encode())
    with pytest.raises(DataError, match="diag.jsonl:7: ") as err:
        parse_row(raw, WHERE, 7)
    assert says in str(err.value)
