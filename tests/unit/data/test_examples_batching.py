"""Examples files (every bad input gets its clear error), encoding, plans and padding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from twinrun.core.errors import DataError
from twinrun.data.batching import pad_rows, plan_steps, steps_per_epoch
from twinrun.data.examples import EncodedRow, encode_prompt_completion, load_rows, sft_parts
from twinrun.model.tokens import CheckpointTokenizer
from twinrun.model.toy import EOS_ID, toy_tokenizer


def FakeTok() -> CheckpointTokenizer:  # noqa: N802 - stands where a class stood
    """The toy's real tokenizer (id b is byte b; <|bos|> 256, <|eos|> 257), in memory."""
    return CheckpointTokenizer(toy_tokenizer(), (EOS_ID,))


def write(tmp_path: Path, text: str, name: str = "ex.jsonl") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_jsonl_and_array(tmp_path: Path) -> None:
    rows = [{"prompt": "a", "completion": "b"}, {"prompt": "c", "completion": "d"}]
    jl = load_rows(write(tmp_path, "\n".join(json.dumps(r) for r in rows) + "\n\n"))
    arr = load_rows(write(tmp_path, json.dumps(rows), "ex.json"))
    assert [r.data for r in jl] == rows == [r.data for r in arr]
    assert jl[1].where.endswith(":2") and arr[1].where.endswith("[1]")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "empty"),
        ("   \n", "empty"),
        ('{"prompt": "a", "completion": "b"}\n{not json\n', r"ex.jsonl:2: not valid JSON"),
        ("[1, 2]", r"\[0\]: expected a JSON object"),
        ('"x"\n', "expected a JSON object"),
    ],
)
def test_bad_files(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(DataError, match=match):
        load_rows(write(tmp_path, text))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not found"):
        load_rows(tmp_path / "nope.jsonl")


@pytest.mark.parametrize(
    ("row", "match"),
    [
        ({"prompt": "a"}, "needs 'prompt' and 'completion'"),
        ({"prompt": 3, "completion": "b"}, "'prompt' must be a string"),
        ({"prompt": " ", "completion": "b"}, "'prompt' is empty"),
        ({"messages": [{"role": "user", "content": "x"}]}, "at least two"),
        (
            {"messages": [{"role": "user"}, {"role": "assistant", "content": "y"}]},
            "messages\\[0\\]",
        ),
        (
            {"messages": [{"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}]},
            "last message",
        ),
    ],
)
def test_bad_rows(tmp_path: Path, row: dict, match: str) -> None:
    (r,) = load_rows(write(tmp_path, json.dumps(row)))
    with pytest.raises(DataError, match=match):
        sft_parts(r)


def test_encoding_masks_completion_and_eos_only() -> None:
    tok = FakeTok()
    enc = encode_prompt_completion(tok, [{"role": "user", "content": "hi"}], "ok", False)
    assert enc.input_ids == (256, ord("h"), ord("i"), ord("o"), ord("k"), 257)
    assert enc.loss_mask == (0, 0, 0, 1, 1, 1)
    chat = encode_prompt_completion(tok, [{"role": "user", "content": "hi"}], "ok", True)
    # the template starts with <|bos|> and ends each turn with <|eos|>: BOS once, never twice
    prompt = [256, *b"<|user|>\nhi", 257, *b"<|assistant|>\n"]
    assert chat.input_ids == (*prompt, *b"ok", 257)
    assert chat.loss_mask == (0,) * len(prompt) + (1, 1, 1)


def test_plan_covers_each_example_once_per_epoch() -> None:
    plans = plan_steps(10, epochs=2, batch_size=3, accumulation=2, seed=5)
    assert len(plans) == 2 * steps_per_epoch(10, 3, 2) == 4
    for epoch in (0, 1):
        seen = [i for p in plans if p.epoch == epoch for i in p.indices]
        assert sorted(seen) == list(range(10))
    assert [len(fw) for fw in plans[1].forwards] == [3, 1]  # short last forward
    assert plans[0].indices != plans[2].indices  # reshuffled per epoch
    assert plan_steps(10, 2, 3, 2, seed=5) == plans  # keyed: same seed, same plan


def test_pad_rows_right_pads_and_masks() -> None:
    rows = [EncodedRow((1, 2, 3), (0, 1, 1)), EncodedRow((4,), (1,))]
    ids, attn, loss = pad_rows(rows, pad_id=9)
    assert ids.tolist() == [[1, 2, 3], [4, 9, 9]]
    assert attn.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert loss.tolist() == [[0, 1, 1], [1, 0, 0]]
