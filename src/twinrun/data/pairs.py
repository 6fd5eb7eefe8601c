"""Preference pairs for DPO and reward modelling: validation and encoding.

A pair row is one of

    {"prompt": str, "chosen": str, "rejected": str}
    {"messages": [{"role": str, "content": str}, ...], "chosen": str, "rejected": str}
    {"prompt": [messages], "chosen": [one assistant message], "rejected": [one ...]}  (TRL's
    conversational preference rows)

where `messages` is the prompt conversation only (its last message must not be the assistant's:
the two answers are `chosen` and `rejected`). Each side is encoded exactly like an SFT row
(data/examples.py, TRL's rules): the prompt + that side, with the loss mask on the side's tokens
(its eos or end of turn included). A pair is two rows.

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
    check_messages,
    encode_prompt_completion,
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
        pair = EncodedPair(
            chosen=encode_prompt_completion(tok, messages, chosen, chat_template),
            rejected=encode_prompt_completion(tok, messages, rejected, chat_template),
        )
        check_length(pair.chosen, f"{row.where} (chosen)", max_length)
        check_length(pair.rejected, f"{row.where} (rejected)", max_length)
        out.append(pair)
    return out


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
