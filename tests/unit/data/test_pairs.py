"""Preference pair rows: every bad input gets a clear error naming the row; SFT-style encoding."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from twinrun.core.errors import DataError
from twinrun.data.examples import SourcedRow, encode_prompt_completion, load_rows
from twinrun.data.pairs import EncodedPair, encode_pairs, pair_parts
from twinrun.model.tokens import CheckpointTokenizer
from twinrun.model.toy import EOS_ID, toy_tokenizer


def FakeTok() -> CheckpointTokenizer:  # noqa: N802 - stands where a class stood
    """The toy's real tokenizer (id b is byte b; <|bos|> 256, <|eos|> 257), in memory."""
    return CheckpointTokenizer(toy_tokenizer(), (EOS_ID,))


def write_rows(tmp_path: Path, rows: list[Any]) -> Path:
    p = tmp_path / "pairs.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


USER = {"role": "user", "content": "hi"}


@pytest.mark.parametrize(
    ("row", "match"),
    [
        ({"prompt": "a", "chosen": "b"}, "missing 'rejected'"),
        ({"prompt": "a"}, "missing 'chosen', 'rejected'"),
        ({"chosen": "b", "rejected": "c"}, "share no prompt text"),  # an implicit prompt
        ({"prompt": "a", "messages": [USER], "chosen": "b", "rejected": "c"}, "both"),
        ({"prompt": 1, "chosen": "b", "rejected": "c"}, "'prompt' must be a string \\(int\\)"),
        ({"prompt": " ", "chosen": "b", "rejected": "c"}, "'prompt' is empty"),
        ({"prompt": "a", "chosen": None, "rejected": "c"}, "'chosen' must be a string"),
        ({"prompt": "a", "chosen": "b", "rejected": ["c"]}, "'rejected' must be a string"),
        ({"prompt": "a", "chosen": "", "rejected": "c"}, "'chosen' is empty"),
        ({"prompt": "a", "chosen": "b", "rejected": " \n\t"}, "'rejected' is empty"),
        ({"prompt": "a", "chosen": "b", "rejected": "b"}, "same text.*teaches nothing"),
        ({"messages": [], "chosen": "b", "rejected": "c"}, "non-empty list"),
        ({"messages": "hi", "chosen": "b", "rejected": "c"}, "non-empty list"),
        ({"messages": [{"role": "user"}], "chosen": "b", "rejected": "c"}, r"messages\[0\]"),
        ({"messages": [USER, 3], "chosen": "b", "rejected": "c"}, r"messages\[1\]"),
        (
            {
                "messages": [USER, {"role": "assistant", "content": "x"}],
                "chosen": "b",
                "rejected": "c",
            },
            "last prompt message has role 'assistant'",
        ),
    ],
)
def test_bad_pair_rows(tmp_path: Path, row: dict[str, Any], match: str) -> None:
    good = {"prompt": "q", "chosen": "y", "rejected": "n"}
    path = write_rows(tmp_path, [good, row])
    rows = load_rows(path)
    pair_parts(rows[0])
    with pytest.raises(DataError, match=match) as info:
        pair_parts(rows[1])
    assert info.value.message.startswith(f"{path}:2: ")  # names the file and line
    with pytest.raises(DataError, match=match):
        encode_pairs(FakeTok(), rows, chat_template=False, max_length=100)


def test_pair_parts_both_forms(tmp_path: Path) -> None:
    system = {"role": "system", "content": "be brief"}
    rows = load_rows(
        write_rows(
            tmp_path,
            [
                {"prompt": "What is 2 + 3?", "chosen": "5", "rejected": "6"},
                {"messages": [system, USER], "chosen": "hello", "rejected": "go away"},
                {"prompt": "p", "chosen": "x", "rejected": " x"},  # differs: not the same text
            ],
        )
    )
    assert pair_parts(rows[0]) == ([{"role": "user", "content": "What is 2 + 3?"}], "5", "6")
    assert pair_parts(rows[1]) == ([system, USER], "hello", "go away")
    assert pair_parts(rows[2])[1:] == ("x", " x")


def test_encoding_matches_sft_per_side(tmp_path: Path) -> None:
    tok = FakeTok()
    rows = load_rows(write_rows(tmp_path, [{"prompt": "hi", "chosen": "ok", "rejected": "no!"}]))
    (pair,) = encode_pairs(tok, rows, chat_template=False, max_length=100)
    assert isinstance(pair, EncodedPair)
    assert pair.chosen.input_ids == (256, ord("h"), ord("i"), ord("o"), ord("k"), 257)
    assert pair.chosen.loss_mask == (0, 0, 0, 1, 1, 1)
    assert pair.rejected.input_ids == (256, ord("h"), ord("i"), *b"no!", 257)
    assert pair.rejected.loss_mask == (0, 0, 0, 1, 1, 1, 1)
    assert pair.chosen.targets == 3 and pair.rejected.targets == 4
    msgs = [USER]
    assert pair.chosen == encode_prompt_completion(tok, msgs, "ok", False)


def test_encoding_with_chat_template(tmp_path: Path) -> None:
    tok = FakeTok()
    rows = load_rows(write_rows(tmp_path, [{"messages": [USER], "chosen": "ok", "rejected": "no"}]))
    (pair,) = encode_pairs(tok, rows, chat_template=True, max_length=100)
    prompt = (256, *b"<|user|>\nhi", 257, *b"<|assistant|>\n")
    for side, text in ((pair.chosen, b"ok"), (pair.rejected, b"no")):
        assert side.input_ids == (*prompt, *text, 257)
        assert side.loss_mask == (0,) * len(prompt) + (1, 1, 1)
    # both sides share the prompt tokens exactly
    assert pair.chosen.input_ids[:-3] == pair.rejected.input_ids[:-3]


def test_too_long_side_names_row_and_side(tmp_path: Path) -> None:
    rows = load_rows(write_rows(tmp_path, [{"prompt": "hi", "chosen": "ok", "rejected": "x" * 20}]))
    with pytest.raises(DataError, match=r"pairs.jsonl:1 \(rejected\): 24 tokens exceed .* 10"):
        encode_pairs(FakeTok(), rows, chat_template=False, max_length=10)
    assert len(encode_pairs(FakeTok(), rows, chat_template=False, max_length=24)) == 1


def test_shipped_pairs_are_valid() -> None:
    path = resources.files("twinrun") / "examples" / "pairs.jsonl"
    text = path.read_text(encoding="utf-8")
    assert text.isascii()
    rows = load_rows(str(path))
    assert len(rows) == 32
    pairs = encode_pairs(FakeTok(), rows, chat_template=True, max_length=128)
    assert len(pairs) == 32
    assert any("messages" in r.data for r in rows) and any("prompt" in r.data for r in rows)


def test_implicit_prompt_rows_split_as_trl_splits_them() -> None:
    text = SourcedRow({"chosen": "The sky is blue.", "rejected": "The sky is green."}, "p:1")
    assert pair_parts(text) == ([{"role": "user", "content": "The sky is"}], " blue.", " green.")
    user = {"role": "user", "content": "What color is the sky?"}
    conv = SourcedRow(
        {
            "chosen": [user, {"role": "assistant", "content": "Blue."}],
            "rejected": [user, {"role": "assistant", "content": "Green."}],
        },
        "p:2",
    )
    assert pair_parts(conv) == ([user], "Blue.", "Green.")


@pytest.mark.parametrize(
    ("chosen", "rejected", "message"),
    [
        ("Blue.", "Green.", "share no prompt text"),
        ("The sky", "The sky is blue.", "do not differ after a shared prompt"),
        ("The sky is blue.", [{"role": "assistant", "content": "x"}], "both strings or both"),
        ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
         [{"role": "user", "content": "other"}, {"role": "assistant", "content": "b"}],
         "must share the prompt's messages"),
        ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
          {"role": "user", "content": "more"}],
         [{"role": "user", "content": "q"}, {"role": "assistant", "content": "b"}],
         "one final assistant message each"),
    ],
)  # fmt: skip
def test_implicit_prompt_rows_that_cannot_split_say_why(
    chosen: object, rejected: object, message: str
) -> None:
    with pytest.raises(DataError, match=message):
        pair_parts(SourcedRow({"chosen": chosen, "rejected": rejected}, "p:9"))
