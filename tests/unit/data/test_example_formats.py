"""Examples in the formats users bring: TRL's conversational rows (prompt and completion, or
chosen and rejected, as message lists) and CSV are read; other binary formats get a line naming
what is read and how to convert (Parquet and `save_to_disk`:
tests/unit/data/test_datasets_source.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from twinrun.core.errors import DataError
from twinrun.data.examples import load_rows, sft_parts
from twinrun.data.pairs import pair_parts

USER = {"role": "user", "content": "What is 1 + 1?"}
SYSTEM = {"role": "system", "content": "Be brief."}
ANSWER = {"role": "assistant", "content": "2"}


def write(tmp_path: Path, name: str, rows: list[dict]) -> Path:
    p = tmp_path / name
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_conversational_prompt_completion_is_the_messages_row(tmp_path: Path) -> None:
    conv, msgs = load_rows(write(tmp_path, "c.jsonl", [
        {"prompt": [SYSTEM, USER], "completion": [ANSWER]},
        {"messages": [SYSTEM, USER, ANSWER]},
    ]))  # fmt: skip
    assert sft_parts(conv) == sft_parts(msgs) == ([SYSTEM, USER], "2")


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"prompt": [USER], "completion": [ANSWER, ANSWER]}, "must be one message"),
        ({"prompt": [USER], "completion": [USER]}, "must be one message with role 'assistant'"),
        ({"prompt": [USER, ANSWER], "completion": [ANSWER]}, "last message has role 'assistant'"),
        ({"prompt": [{"role": "user"}], "completion": [ANSWER]}, r"prompt\[0\] needs string"),
        ({"prompt": [], "completion": [ANSWER]}, "'prompt' must be a non-empty list"),
    ],
)
def test_bad_conversational_rows(tmp_path: Path, row: dict, message: str) -> None:
    (r,) = load_rows(write(tmp_path, "bad.jsonl", [row]))
    with pytest.raises(DataError, match=message) as err:
        sft_parts(r)
    assert err.value.message.startswith(f"{tmp_path / 'bad.jsonl'}:1: ")


def test_conversational_preference_rows(tmp_path: Path) -> None:
    worse = {"role": "assistant", "content": "3"}
    conv, plain = load_rows(write(tmp_path, "p.jsonl", [
        {"prompt": [USER], "chosen": [ANSWER], "rejected": [worse]},
        {"prompt": USER["content"], "chosen": "2", "rejected": "3"},
    ]))  # fmt: skip
    assert pair_parts(conv) == pair_parts(plain) == ([USER], "2", "3")
    (bad,) = load_rows(write(tmp_path, "q.jsonl", [{"prompt": [USER], "chosen": [USER],
                                                   "rejected": [worse]}]))  # fmt: skip
    with pytest.raises(DataError, match="'chosen' must be a string or one non-empty message"):
        pair_parts(bad)


def test_csv_rows_are_read_in_file_order(tmp_path: Path) -> None:
    p = tmp_path / "e.csv"
    p.write_text('prompt,completion\n"What is 1 + 1?",2\n"Say ""hi""","hi, there"\n')
    rows = load_rows(p)
    assert [r.data for r in rows] == [
        {"prompt": "What is 1 + 1?", "completion": "2"},
        {"prompt": 'Say "hi"', "completion": "hi, there"},
    ]
    assert [r.where for r in rows] == [f"{p}:2", f"{p}:3"]
    assert sft_parts(rows[1]) == ([{"role": "user", "content": 'Say "hi"'}], "hi, there")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("prompt,completion\na,b,c\n", ":2: the row has another number of fields"),
        ("prompt,completion\na\n", ":2: the row has another number of fields"),
    ],
)
def test_bad_csv(tmp_path: Path, text: str, message: str) -> None:
    p = tmp_path / "bad.csv"
    p.write_text(text)
    with pytest.raises(DataError, match=message):
        load_rows(p)


@pytest.mark.parametrize(
    ("head", "what", "convert"),
    [
        (b"\x1f\x8b\x08\x00", "is a gzip file", "gunzip"),
        (b"PK\x03\x04", "is a zip archive (or an Excel workbook)", "CSV"),
        (b"ARROW1\x00\x00", "is an Arrow IPC (Feather) file", "Dataset.from_file"),
        (
            b"\xff\xff\xff\xff\x10",
            "is an Arrow stream file (a save_to_disk shard?)",
            "give the directory",
        ),
    ],
)
def test_other_binary_formats_say_what_is_read_and_how_to_convert(
    tmp_path: Path, head: bytes, what: str, convert: str
) -> None:
    p = tmp_path / "train.jsonl"  # the name says JSONL; the bytes decide
    p.write_bytes(head + b"\0" * 32)
    line = f"{what}; twinrun reads JSONL, a JSON array or CSV"
    with pytest.raises(DataError, match=re.escape(line)) as e:
        load_rows(p)
    assert convert in (e.value.hint or "")
