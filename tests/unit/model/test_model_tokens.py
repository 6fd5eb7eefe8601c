"""CheckpointTokenizer's rules on the toy's byte tokenizer (id b is byte b; <|bos|> 256, <|eos|>
257, <|pad|> 258), where every expected id can be written by hand; and its loading errors."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest

from twinrun.core.errors import ModelError
from twinrun.model.tokens import (
    CheckpointTokenizer,
    common_prefix_length,
    declared_end_ids,
    load_tokenizer,
)
from twinrun.model.toy import BOS_ID, EOS_ID, PAD_ID, build_byte_tokenizer, toy_tokenizer

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def tok() -> CheckpointTokenizer:
    return CheckpointTokenizer(toy_tokenizer(), (EOS_ID,))


def test_plain_rule_adds_bos_once_and_eos_after_the_completion(tok: CheckpointTokenizer) -> None:
    assert tok.prompt_ids(USER, chat_template=False) == [BOS_ID, *b"hi"]
    assert tok.prompt_completion_ids(USER, "ok", False) == ([BOS_ID, *b"hiok", EOS_ID], 3)
    # a completion already ending with the eos text gets no second eos (TRL's add_eos)
    assert tok.prompt_completion_ids(USER, "ok<|eos|>", False) == ([BOS_ID, *b"hiok", EOS_ID], 3)
    assert tok.prompt_completion_ids(USER, "", False) == ([BOS_ID, *b"hi", EOS_ID], 3)
    two = [{"role": "system", "content": "a"}, {"role": "user", "content": "b"}]
    assert tok.prompt_ids(two, False) == [BOS_ID, *b"a\nb"]  # contents, one per line


def test_chat_rule_is_the_template_once(tok: CheckpointTokenizer) -> None:
    prompt = [BOS_ID, *b"<|user|>\nhi", EOS_ID, *b"<|assistant|>\n"]
    assert tok.prompt_ids(USER, chat_template=True) == prompt
    assert tok.prompt_completion_ids(USER, "ok", True) == ([*prompt, *b"ok", EOS_ID], len(prompt))
    assert tok.prompt_completion_ids(USER, "", True) == ([*prompt, EOS_ID], len(prompt))


def test_not_a_prefix_warns_once_per_tokenizer() -> None:
    class Shifting:
        """A tokenizer whose rendering of the prompt changes once an answer follows it."""

        bos_token_id, eos_token_id, pad_token_id, eos_token = None, 9, None, "</s>"

        def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
            return {"input_ids": [1, 2, 3] if text == "p" else [1, 2, 7, 8, 9]}

    tok = CheckpointTokenizer(Shifting(), ())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert tok.prompt_completion_ids([{"role": "user", "content": "p"}], "c", False) == (
            [1, 2, 7, 8, 9],
            2,
        )
        tok.prompt_completion_ids([{"role": "user", "content": "p"}], "c", False)
    assert len(caught) == 1 and "after the 2 tokens they share" in str(caught[0].message)
    assert tok.pad_id == 9 and tok.end_ids == (9,)  # no pad token: rows are padded with eos


def test_common_prefix_length() -> None:
    assert common_prefix_length([1, 2, 3], [1, 2, 3, 4]) == 3
    assert common_prefix_length([1, 2, 3], [1, 5]) == 1
    assert common_prefix_length([], [1]) == 0


def test_end_ids_from_the_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 5}))
    assert declared_end_ids(tmp_path) == (5,)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, True, 8]}))
    assert declared_end_ids(tmp_path) == (7, 8)  # generation_config.json first; no bools
    tok = CheckpointTokenizer(toy_tokenizer(), (7, EOS_ID, 8))
    assert tok.end_ids == (7, EOS_ID, 8) and (tok.bos_id, tok.pad_id) == (BOS_ID, PAD_ID)


def test_no_eos_anywhere_is_an_error() -> None:
    from transformers import PreTrainedTokenizerFast

    bare = PreTrainedTokenizerFast(tokenizer_object=build_byte_tokenizer())
    with pytest.raises(ModelError, match="has no eos token"):
        CheckpointTokenizer(bare, ())
    assert CheckpointTokenizer(bare, (EOS_ID,)).eos_id == EOS_ID


def test_loading_errors_are_one_line(tmp_path: Path, toy_model_dir: Path) -> None:
    with pytest.raises(ModelError, match="model directory not found"):
        load_tokenizer(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="no tokenizer files in"):
        load_tokenizer(tmp_path / "empty")
    broken = tmp_path / "broken"
    shutil.copytree(toy_model_dir, broken)
    (broken / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelError, match="cannot load the tokenizer in") as err:
        load_tokenizer(broken)
    assert "\n" not in err.value.one_line()
