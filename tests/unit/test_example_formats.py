"""Examples in the formats users bring: TRL's conversational rows (prompt and completion, or
chosen and rejected, as message lists) and CSV are read; Parquet files and `datasets`
directories get a line naming what is read and how to convert."""

from __future__ import annotations

import json
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


def test_parquet_and_datasets_directories_say_how_to_convert(tmp_path: Path) -> None:
    parquet = tmp_path / "train.parquet"
    parquet.write_bytes(b"PAR1" + b"\0" * 64 + b"PAR1")
    renamed = tmp_path / "train.data"  # the magic bytes, whatever the name
    renamed.write_bytes(parquet.read_bytes())
    for p in (parquet, renamed):
        with pytest.raises(DataError, match="is a Parquet file; twinrun reads JSONL") as err:
            load_rows(p)
        assert "to_json('examples.jsonl')" in (err.value.hint or "")
    saved = tmp_path / "saved"
    saved.mkdir()
    (saved / "dataset_info.json").write_text("{}")
    (saved / "state.json").write_text("{}")
    with pytest.raises(DataError, match="is a datasets save_to_disk directory") as err:
        load_rows(saved)
    assert "load_from_disk" in (err.value.hint or "")
