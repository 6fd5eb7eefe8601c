"""Bounded JSON parsing: each limit refused with its own line, valid JSON unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from twinrun.core.errors import DataError
from twinrun.core.jsonlimits import DIAG, Limits, iter_jsonl, parse_json
from twinrun.core.redact import redact_argv


def test_valid_json_is_parsed_as_json_does() -> None:
    assert parse_json(b'{"a": [1, 2.5, "x", null, true], "b": {"c": -7}}', "f") == {
        "a": [1, 2.5, "x", None, True], "b": {"c": -7},
    }  # fmt: skip
    assert parse_json("9" * 40, "f") == int("9" * 40)  # exactly at the digit limit
    assert parse_json("[" * 64 + "]" * 64, "f", Limits()) is not None  # exactly at the depth


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("9" * 41, "f: refused an integer with more than 40 digits"),
        ("[" * 65 + "]" * 65, "f: refused nesting deeper than 64 levels"),
        ("[" * 100_000, "f: refused nesting deeper than 64 levels"),
        ('"\\ud800"', "f: refused a lone UTF-16 surrogate"),
        ('{"\\udc00": 1}', "f: refused a lone UTF-16 surrogate"),
        ("1e309", "f: refused a number too large for a float"),
        ("-Infinity", "f: refused -Infinity, which is not a JSON number"),
        (b"\xff", "f: not UTF-8 text"),
        ("x" * 20, "f: not valid JSON"),
    ],
)
def test_each_limit_is_one_line(text: str | bytes, why: str) -> None:
    with pytest.raises(DataError) as err:
        parse_json(text, "f")
    assert err.value.one_line().startswith(why)
    assert "\n" not in err.value.one_line()


def test_diag_rows_may_hold_nonfinite_numbers() -> None:
    assert parse_json('{"x": NaN, "y": -Infinity}', "d", DIAG)["y"] == float("-inf")


def test_jsonl_limits_per_row_and_per_file(tmp_path: Path) -> None:
    f = tmp_path / "a.jsonl"
    f.write_bytes(b'{"a": 1}\n\n' + b'"' + b"x" * 20 + b'"\n')
    small = Limits(max_bytes=21, max_file_bytes=100)
    assert [n for n, _ in iter_jsonl(f, "rows", Limits(max_bytes=22))] == [1, 3]
    with pytest.raises(DataError, match=r"a\.jsonl:3: a line over the limit of 21 bytes"):
        list(iter_jsonl(f, "rows", small))
    with pytest.raises(DataError, match="over the limit of 10"):
        list(iter_jsonl(f, "rows", Limits(max_file_bytes=10)))


def test_redact_argv() -> None:
    argv = ["twinrun", "--env-arg", "token=S", "--env-arg=k=S", "--api-key", "S", "--seed", "1",
            "https://u:S@h/?token=S&x=1", "password=S", "--token=S", "{out}"]  # fmt: skip
    assert redact_argv(argv) == [
        "twinrun", "--env-arg", "token=<redacted>", "--env-arg=k=<redacted>", "--api-key",
        "<redacted>", "--seed", "1", "https://<redacted>@h/?token=<redacted>&x=1",
        "password=<redacted>", "--token=<redacted>", "{out}",
    ]  # fmt: skip
