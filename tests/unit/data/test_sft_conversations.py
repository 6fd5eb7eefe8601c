"""SFT rows as TRL trains them, on the toy's byte tokenizer (id b is byte b; <|bos|> 256,
<|eos|> 257) where every id and mask bit is written by hand: every assistant turn of a
multi-turn conversation is a target (of a prompt-completion row, the completion alone), a row's
`tools` reach the chat template, a {text} row points at `tune text`, and a single-turn row keeps
the ids and mask it always had."""

from __future__ import annotations

import json

import pytest

from twinrun.core.errors import DataError
from twinrun.data.examples import (
    SourcedRow,
    encode_prompt_completion,
    encode_sft_row,
    encode_sft_rows,
)
from twinrun.model.tokens import CheckpointTokenizer
from twinrun.model.toy import BOS_ID, EOS_ID, toy_tokenizer

TOOLS_TEMPLATE = (
    "{{ bos_token }}{% if tools %}<|tools|>{% for t in tools %}{{ t['name'] }};{% endfor %}"
    "{{ eos_token }}{% endif %}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}"
    "{{ eos_token }}{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
CONVERSATION = [
    {"role": "user", "content": "a"},
    {"role": "assistant", "content": "b"},
    {"role": "user", "content": "c"},
    {"role": "assistant", "content": "d"},
]


@pytest.fixture(scope="module")
def tok() -> CheckpointTokenizer:
    return CheckpointTokenizer(toy_tokenizer(), (EOS_ID,))


def turn(role: str, content: str) -> list[int]:
    return [*f"<|{role}|>\n{content}".encode(), EOS_ID]


def test_every_assistant_turn_of_a_conversation_is_a_target(tok: CheckpointTokenizer) -> None:
    enc = encode_sft_row(tok, SourcedRow({"messages": CONVERSATION}, "x:1"), True)
    user_a, asst_b, user_c, asst_d = (turn(m["role"], m["content"]) for m in CONVERSATION)
    head = len(b"<|assistant|>\n")  # the generation prompt: not a target
    assert list(enc.input_ids) == [BOS_ID, *user_a, *asst_b, *user_c, *asst_d]
    expected = [0] * (1 + len(user_a)) + [0] * head + [1, 1]  # "b" and its end of turn
    expected += [0] * len(user_c) + [0] * head + [1, 1]  # "d" and its end of turn
    assert list(enc.loss_mask) == expected
    assert enc.targets == 4  # the last turn alone would be 2


def test_a_prompt_completion_row_trains_its_completion_alone(tok: CheckpointTokenizer) -> None:
    """TRL's `completion_only_loss`: an assistant turn inside a conversational prompt is context,
    not a target; the same conversation as {messages} trains both turns."""
    row = {"prompt": CONVERSATION[:3], "completion": CONVERSATION[3:]}
    enc = encode_sft_row(tok, SourcedRow(row, "x:1"), True)
    whole = encode_sft_row(tok, SourcedRow({"messages": CONVERSATION}, "x:2"), True)
    assert enc.input_ids == whole.input_ids
    assert list(enc.loss_mask) == [0] * (len(enc.input_ids) - 2) + [1, 1]  # "d", end of turn
    assert enc.targets == 2 and whole.targets == 4


def test_a_single_turn_row_keeps_its_ids_and_mask(tok: CheckpointTokenizer) -> None:
    user = [{"role": "user", "content": "hi"}]
    rows = [
        SourcedRow({"messages": [*user, {"role": "assistant", "content": "ok"}]}, "x:1"),
        SourcedRow({"prompt": "hi", "completion": "ok"}, "x:2"),
        SourcedRow({"prompt": user, "completion": [{"role": "assistant", "content": "ok"}]}, "x:3"),
    ]
    for chat in (True, False):
        before = encode_prompt_completion(tok, user, "ok", chat)
        assert encode_sft_rows(tok, rows, chat, 2048) == [before] * 3


def test_a_rows_tools_reach_the_chat_template(tok: CheckpointTokenizer) -> None:
    tools = [{"name": "add"}, {"name": "mul"}]
    hf = toy_tokenizer()
    hf.chat_template = TOOLS_TEMPLATE
    tooled = CheckpointTokenizer(hf, (EOS_ID,))
    messages = [*CONVERSATION[:1], {"role": "tool", "content": "3"}, CONVERSATION[1]]
    for given in (tools, json.dumps(tools)):  # a list of schemas, or that list as JSON text
        enc = encode_sft_row(
            tooled, SourcedRow({"messages": messages, "tools": given}, "x:1"), True
        )
        header = [*b"<|tools|>add;mul;", EOS_ID]
        body = [*turn("user", "a"), *turn("tool", "3"), *turn("assistant", "b")]
        assert list(enc.input_ids) == [BOS_ID, *header, *body]
        assert list(enc.loss_mask) == [0] * (len(enc.input_ids) - 2) + [1, 1]


@pytest.mark.parametrize(
    ("row", "chat", "message"),
    [
        ({"text": "The sky is blue."}, True, "twinrun tune text"),
        ({"messages": [{"role": "assistant", "content": "b"}, *CONVERSATION]}, True,
         "starts with the assistant"),
        ({"messages": CONVERSATION, "tools": "{not json"}, True, "is a string but not JSON"),
        ({"messages": CONVERSATION, "tools": [1, 2]}, True, "list of tool schemas"),
        ({"messages": CONVERSATION, "tools": [{"name": "add"}]}, False, "needs the chat template"),
    ],
)  # fmt: skip
def test_rows_trl_writes_that_cannot_train_as_sft_say_why(
    tok: CheckpointTokenizer, row: dict[str, object], chat: bool, message: str
) -> None:
    with pytest.raises(DataError, match="x:7") as err:
        encode_sft_row(tok, SourcedRow(row, "x:7"), chat)
    assert message in str(err.value) + str(err.value.hint or "")


def test_messages_loss_all_trains_every_token_of_a_messages_row(tok: CheckpointTokenizer) -> None:
    """`--messages-loss all` (TRL's default `assistant_only_loss=False`): every token of a
    {messages} row is a target, the same ids; prompt-completion rows keep their completion."""
    row = SourcedRow({"messages": CONVERSATION}, "x:1")
    every = encode_sft_row(tok, row, True, all_tokens=True)
    assistant = encode_sft_row(tok, row, True)
    assert every.input_ids == assistant.input_ids
    assert list(every.loss_mask) == [1] * len(every.input_ids)
    plain = encode_sft_row(tok, row, False, all_tokens=True)  # no template: the plain text
    assert plain.input_ids == encode_sft_row(tok, row, False).input_ids
    assert list(plain.loss_mask) == [1] * len(plain.input_ids)
    pc = SourcedRow({"prompt": CONVERSATION[:3], "completion": CONVERSATION[3:]}, "x:2")
    assert encode_sft_row(tok, pc, True, all_tokens=True) == encode_sft_row(tok, pc, True)
    (listed,) = encode_sft_rows(tok, [row], True, 4096, all_tokens=True)
    assert listed == every
