"""Example files: JSONL (one object per line) or a JSON array, validated row by row with errors
that name the file and line. Also the encoding of SFT rows into token ids plus a loss mask."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from twinrun.core.errors import DataError
from twinrun.core.jsonlimits import EXAMPLES, Limits, iter_jsonl, parse_json, read_limited


class Tokenizer(Protocol):
    bos_id: int
    eos_id: int
    pad_id: int

    def encode(self, text: str) -> list[int]: ...

    def render_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str: ...


@dataclass(frozen=True)
class SourcedRow:
    """A row of an examples file with where it came from (for error messages)."""

    data: dict[str, Any]
    where: str  # "path:line" (JSONL) or "path[index]" (JSON array)


def load_rows(path: str | Path, limits: Limits = EXAMPLES) -> list[SourcedRow]:
    """Read an examples file. Raises DataError naming the file (and line) on any problem; rows
    and the file are bounded by `limits` (bytes per row and per file, integer digits, nesting)."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"examples file not found: {p}", "check the --examples path")
    with open(p, "rb") as fh:
        head = fh.read(4096)
        while head.strip() == b"" and (more := fh.read(4096)):
            head = more
    if not head.strip():
        raise DataError(f"{p}: the examples file is empty", "give at least one example")
    rows: list[SourcedRow] = []
    if head.lstrip().startswith(b"["):
        whole = Limits(**{**limits.__dict__, "max_bytes": limits.max_file_bytes})
        items = parse_json(read_limited(p, "examples file", limits.max_file_bytes), str(p), whole)
        for i, item in enumerate(items):
            if len(json.dumps(item, ensure_ascii=False)) > limits.max_bytes:
                raise DataError(
                    f"{p}[{i}]: a row over the limit of {limits.max_bytes} bytes",
                    "shorten the row",
                )
            rows.append(_as_object(item, f"{p}[{i}]"))
    else:
        for lineno, item in iter_jsonl(p, "examples file", limits):
            rows.append(_as_object(item, f"{p}:{lineno}"))
    if not rows:
        raise DataError(f"{p}: the examples file has no rows", "give at least one example")
    return rows


def _as_object(item: Any, where: str) -> SourcedRow:
    if not isinstance(item, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(item).__name__}")
    return SourcedRow(item, where)


def require_str(row: SourcedRow, key: str, allow_empty: bool = False) -> str:
    value = row.data.get(key)
    if not isinstance(value, str):
        got = "missing" if key not in row.data else type(value).__name__
        raise DataError(f"{row.where}: field {key!r} must be a string ({got})")
    if not allow_empty and not value.strip():
        raise DataError(f"{row.where}: field {key!r} is empty")
    return value


@dataclass(frozen=True)
class EncodedRow:
    """Token ids of one example and its loss mask (1 where the token is a training target)."""

    input_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]

    @property
    def targets(self) -> int:
        return sum(self.loss_mask)


def prompt_text(tok: Tokenizer, messages: list[dict[str, str]], chat_template: bool) -> str:
    """The text the model sees before its answer."""
    if chat_template:
        return tok.render_chat(messages, add_generation_prompt=True)
    return "\n".join(m["content"] for m in messages)


def sft_parts(row: SourcedRow) -> tuple[list[dict[str, str]], str]:
    """(prompt messages, completion) of an SFT row: {prompt, completion} or {messages}."""
    if "messages" in row.data:
        msgs = row.data["messages"]
        if not isinstance(msgs, list) or len(msgs) < 2:
            raise DataError(f"{row.where}: 'messages' must be a list of at least two messages")
        for i, m in enumerate(msgs):
            if not (
                isinstance(m, dict)
                and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str)
            ):
                raise DataError(f"{row.where}: messages[{i}] needs string 'role' and 'content'")
        if msgs[-1]["role"] != "assistant":
            raise DataError(
                f"{row.where}: the last message must have role 'assistant' (it is the completion)"
            )
        return [dict(m) for m in msgs[:-1]], msgs[-1]["content"]
    if "prompt" not in row.data or "completion" not in row.data:
        raise DataError(
            f"{row.where}: a row needs 'prompt' and 'completion', or 'messages'",
            f"found fields: {', '.join(sorted(row.data)) or 'none'}",
        )
    return (
        [{"role": "user", "content": require_str(row, "prompt")}],
        require_str(row, "completion", allow_empty=True),
    )


def encode_prompt_completion(
    tok: Tokenizer, messages: list[dict[str, str]], completion: str, chat_template: bool
) -> EncodedRow:
    """`[bos] + prompt + completion + [eos]`; the loss covers the completion and the eos."""
    prompt_ids = [tok.bos_id, *tok.encode(prompt_text(tok, messages, chat_template))]
    completion_ids = [*tok.encode(completion), tok.eos_id]
    return EncodedRow(
        tuple(prompt_ids + completion_ids),
        tuple([0] * len(prompt_ids) + [1] * len(completion_ids)),
    )


def encode_sft_rows(
    tok: Tokenizer, rows: list[SourcedRow], chat_template: bool, max_length: int
) -> list[EncodedRow]:
    out = []
    for row in rows:
        messages, completion = sft_parts(row)
        enc = encode_prompt_completion(tok, messages, completion, chat_template)
        check_length(enc, row.where, max_length)
        out.append(enc)
    return out


def check_length(enc: EncodedRow, where: str, max_length: int) -> None:
    if len(enc.input_ids) > max_length:
        raise DataError(
            f"{where}: {len(enc.input_ids)} tokens exceed the model's {max_length} positions",
            "shorten the example",
        )
