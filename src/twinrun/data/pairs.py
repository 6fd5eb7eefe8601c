"""Preference pairs for DPO and reward modelling: validation and encoding.

A pair row is one of

    {"prompt": str, "chosen": str, "rejected": str}
    {"messages": [{"role": str, "content": str}, ...], "chosen": str, "rejected": str}
    {"prompt": [messages], "chosen": [one assistant message], "rejected": [one ...]}  (TRL's
    conversational preference rows)
    {"chosen": str, "rejected": str} or {"chosen": [messages], "rejected": [messages]}  (TRL's
    implicit prompt: what the two share is the prompt, `implicit_prompt`)

where `messages` is the prompt conversation only (its last message must not be the assistant's:
the two answers are `chosen` and `rejected`). Each side is encoded like an SFT row
(data/examples.py, TRL's rules): the prompt + that side, with the loss mask on the side's tokens
(its eos or end of turn included). As in TRL's DPOTrainer the two sides share one prompt length,
the shorter of their two: when the prompt's last token merges with one answer only (a final
space), the other side trains that token too. A pair is two rows.

Every bad row raises DataError naming it (`path:line` or `path[index]`): missing fields,
non-strings, an empty side (empty after strip), or chosen == rejected (the pair teaches nothing).
"""

from __future__ import annotations

from dataclasses import dataclass

from twinrun.core.errors import DataError
from twinrun.data.examples import (
    EncodedRow,
    SourcedRow,
    Tokenizer,
    check_length,
    check_length_floor,
    check_messages,
    message_list,
    require_str,
)

__all__ = ["EncodedPair", "encode_pairs", "pair_parts"]


@dataclass(frozen=True)
class EncodedPair:
    """The two encoded sides of one preference pair."""

    chosen: EncodedRow
    rejected: EncodedRow


def _prompt_messages(row: SourcedRow) -> list[dict[str, str]]:
    has_messages, has_prompt = "messages" in row.data, "prompt" in row.data
    if has_messages and has_prompt:
        raise DataError(
            f"{row.where}: a pair row has both 'prompt' and 'messages'",
            "give the prompt one way only",
        )
    if has_prompt and isinstance(row.data["prompt"], list):  # TRL's conversational format
        msgs = message_list(row, "prompt")
        if msgs[-1]["role"] == "assistant":
            raise DataError(f"{row.where}: the prompt's last message has role 'assistant'")
        return msgs
    if has_prompt:
        return [{"role": "user", "content": require_str(row, "prompt")}]
    if not has_messages:
        raise DataError(
            f"{row.where}: a pair row needs 'prompt' (or 'messages'), 'chosen' and 'rejected'",
            f"found fields: {', '.join(sorted(row.data)) or 'none'}",
        )
    msgs = row.data["messages"]
    if not isinstance(msgs, list) or not msgs:
        raise DataError(
            f"{row.where}: 'messages' must be a non-empty list of prompt messages",
            "the answers go in 'chosen' and 'rejected'",
        )
    check_messages(row, "messages", msgs)
    if msgs[-1]["role"] == "assistant":
        raise DataError(
            f"{row.where}: the last prompt message has role 'assistant'",
            "in a pair row 'messages' is the prompt only; put the answers in 'chosen' and "
            "'rejected'",
        )
    return [{"role": m["role"], "content": m["content"]} for m in msgs]


def pair_parts(row: SourcedRow) -> tuple[list[dict[str, str]], str, str]:
    """(prompt messages, chosen, rejected) of a pair row, or a DataError naming the row."""
    missing = [k for k in ("chosen", "rejected") if k not in row.data]
    if missing:
        raise DataError(
            f"{row.where}: a pair row needs 'prompt' (or 'messages'), 'chosen' and 'rejected'; "
            f"missing {', '.join(repr(k) for k in missing)}",
            f"found fields: {', '.join(sorted(row.data)) or 'none'}",
        )
    if "prompt" not in row.data and "messages" not in row.data:
        messages, chosen, rejected = implicit_prompt(row)
        if not (chosen.strip() and rejected.strip()):
            raise DataError(f"{row.where}: an answer is empty after the shared prompt")
    else:
        messages = _prompt_messages(row)
        chosen, rejected = answer_text(row, "chosen"), answer_text(row, "rejected")
    if chosen == rejected:
        raise DataError(
            f"{row.where}: 'chosen' and 'rejected' are the same text, so the pair teaches nothing",
            "give a different rejected answer or drop the row",
        )
    return messages, chosen, rejected


def encode_pairs(
    tok: Tokenizer, rows: list[SourcedRow], chat_template: bool, max_length: int
) -> list[EncodedPair]:
    """Encode every pair row; each side like SFT, each checked against `max_length` positions."""
    out = []
    for row in rows:
        messages, chosen, rejected = pair_parts(row)
        for side, answer in (("chosen", chosen), ("rejected", rejected)):  # before tokenizing
            conversation = [*messages, {"role": "assistant", "content": answer}]
            check_length_floor(tok, conversation, chat_template, f"{row.where} ({side})",
                               max_length)  # fmt: skip
        pair = encode_pair(tok, messages, chosen, rejected, chat_template)
        check_length(pair.chosen, f"{row.where} (chosen)", max_length)
        check_length(pair.rejected, f"{row.where} (rejected)", max_length)
        out.append(pair)
    return out


def encode_pair(
    tok: Tokenizer, messages: list[dict[str, str]], chosen: str, rejected: str, chat_template: bool
) -> EncodedPair:
    """Both sides' ids; the loss on each side's tokens after the prompt length the two share
    (TRL's DPOTrainer: the shorter of the sides' common prefixes with the prompt ids)."""
    (c_ids, c_n), (r_ids, r_n) = (
        tok.prompt_completion_ids(messages, answer, chat_template) for answer in (chosen, rejected)
    )
    n = min(c_n, r_n)

    def side(ids: list[int]) -> EncodedRow:
        return EncodedRow(tuple(ids), tuple([0] * n + [1] * (len(ids) - n)))

    return EncodedPair(chosen=side(c_ids), rejected=side(r_ids))


def answer_text(row: SourcedRow, key: str) -> str:
    """A pair's answer: a string, or (TRL's conversational format) one assistant message."""
    value = row.data.get(key)
    if not isinstance(value, list):
        return require_str(row, key)
    one = value[0] if len(value) == 1 and isinstance(value[0], dict) else {}
    msgs = message_list(row, key) if one else []
    if len(msgs) != 1 or msgs[0]["role"] != "assistant" or not msgs[0]["content"].strip():
        raise DataError(
            f"{row.where}: '{key}' must be a string or one non-empty message with role 'assistant'"
        )
    return msgs[0]["content"]


def implicit_prompt(row: SourcedRow) -> tuple[list[dict[str, str]], str, str]:
    """TRL's implicit-prompt pair: `chosen` and `rejected` each the whole exchange, the prompt
    what they share. Two conversations: their common leading messages are the prompt and each
    must end in one assistant message after it. Two strings: the prompt is their common
    leading text, less a space that ends it (TRL's `extract_prompt`), the answers the rest."""
    chosen, rejected = row.data["chosen"], row.data["rejected"]
    if isinstance(chosen, list) and isinstance(rejected, list):
        return _implicit_conversation(row)
    if not (isinstance(chosen, str) and isinstance(rejected, str)):
        raise DataError(
            f"{row.where}: a pair row without 'prompt' needs 'chosen' and 'rejected' both "
            "strings or both conversations (the prompt is what they share)"
        )
    idx = common_text_prefix(chosen, rejected)
    if idx is None:
        raise DataError(
            f"{row.where}: 'chosen' and 'rejected' do not differ after a shared prompt",
            "one is the start of the other (or they are equal): give the prompt in 'prompt'",
        )
    if not chosen[:idx].strip():
        raise DataError(
            f"{row.where}: 'chosen' and 'rejected' share no prompt text",
            "give the prompt in 'prompt', the two answers in 'chosen' and 'rejected'",
        )
    return [{"role": "user", "content": chosen[:idx]}], chosen[idx:], rejected[idx:]


def common_text_prefix(a: str, b: str) -> int | None:
    """Where a and b part, one back when the character before is a space (TRL's rule for
    implicit prompts); None when neither has a character the other lacks there."""
    for idx in range(min(len(a), len(b))):
        if a[idx] != b[idx]:
            return idx - 1 if idx and a[idx - 1] == " " else idx
    return None


def _implicit_conversation(row: SourcedRow) -> tuple[list[dict[str, str]], str, str]:
    chosen, rejected = message_list(row, "chosen"), message_list(row, "rejected")
    shared = 0
    while shared < min(len(chosen), len(rejected)) and chosen[shared] == rejected[shared]:
        shared += 1
    answers = (chosen[shared:], rejected[shared:])
    if not shared or any(len(a) != 1 or a[0]["role"] != "assistant" for a in answers):
        raise DataError(
            f"{row.where}: 'chosen' and 'rejected' must share the prompt's messages and differ "
            "in one final assistant message each",
            "or give the prompt in 'prompt' and one assistant message in each answer",
        )
    if chosen[shared - 1]["role"] == "assistant":
        raise DataError(f"{row.where}: the shared prompt's last message has role 'assistant'")
    return chosen[:shared], answers[0][0]["content"], answers[1][0]["content"]
