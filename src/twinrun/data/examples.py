"""Example files: JSONL (one object per line), a JSON array, CSV, or through the `datasets` extra a
Parquet file or a `save_to_disk` directory; validated row by row with errors that name the file
and line (or row). Also the encoding of SFT rows into token ids plus a loss mask, by TRL's rules
(`twinrun.model.tokens`): through the chat template the loss covers every assistant turn of a
{messages} conversation and the completion of a prompt-completion row (`conversation_ids`; a
row's `tools` rendered by the template); plain rows (`--no-chat-template`) train their last
answer (`prompt_completion_ids`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

from twinrun.core import reading
from twinrun.core.digest import sha256_file
from twinrun.core.errors import DataError
from twinrun.core.jsonarray import iter_json_array
from twinrun.core.jsonlimits import EXAMPLES, Limits, iter_jsonl, read_limited
from twinrun.data.datasets_source import other_format, read_source, source_kind, source_sha256


class Tokenizer(Protocol):
    """What encoding needs of a tokenizer (`twinrun.model.tokens.CheckpointTokenizer`)."""

    pad_id: int

    def prompt_ids(self, messages: list[dict[str, str]], chat_template: bool) -> list[int]: ...

    def prompt_completion_ids(
        self, messages: list[dict[str, str]], completion: str, chat_template: bool
    ) -> tuple[list[int], int]: ...

    def conversation_ids(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        last_only: bool = False,
        limit: int | None = None,
    ) -> tuple[list[int], list[int]]: ...

    def token_floor(self, messages: list[dict[str, Any]], chat_template: bool) -> int: ...


@dataclass(frozen=True)
class SourcedRow:
    """A row of an examples file with where it came from (for error messages)."""

    data: dict[str, Any]
    where: str  # "path:line" (JSONL) or "path[index]" (JSON array)
    # a GRPO row's conversation before its prompt (`conversational_prompt`): system, earlier turns
    context: tuple[dict[str, str], ...] = ()


def shipped_examples(name: str = "sft.jsonl") -> Path:
    """The path of an examples file shipped in the package (`twinrun/examples/NAME`)."""
    return Path(str(resources.files("twinrun") / "examples" / name))


def load_rows(path: str | Path, limits: Limits = EXAMPLES) -> list[SourcedRow]:
    """Read an examples file. Raises DataError naming the file (and line) on any problem; rows
    and the file are bounded by `limits` (bytes per row and per file, integer digits, nesting)."""
    p = Path(path)
    if p.is_dir() and (kind := source_kind(p)) is not None:
        return _checked_rows(
            p, [_as_object(*pair) for pair in read_source(p, kind, limits)], limits
        )
    with reading.open_regular(p, "examples file", hint="check the --examples path") as fh:
        head = fh.read(4096)
        while head.strip() == b"" and (more := fh.read(4096)):
            head = more
    if not head.strip():
        raise DataError(f"{p}: the examples file is empty", "give at least one example")
    if (kind := source_kind(p, head)) is not None:
        return _checked_rows(
            p, [_as_object(*pair) for pair in read_source(p, kind, limits)], limits
        )
    if (other := other_format(head)) is not None:
        raise DataError(f"{p} is {other[0]}; {READS}", other[1])
    if p.suffix.lower() != ".csv" and _plain_text(head):
        raise DataError(
            f"{p} is plain text, not JSONL (its first line is not JSON)",
            f"to train on raw text, run `twinrun tune text --corpus {p}`; examples are JSONL, "
            "a JSON array or CSV",
        )
    rows: list[SourcedRow] = []
    if p.suffix.lower() == ".csv":
        rows = csv_rows(p, limits)
    elif head.lstrip().startswith(b"["):  # streamed one element at a time, up to the row cap
        for i, item in iter_json_array(p, "examples file", limits):
            _row_cap(p, i, limits)
            rows.append(_as_object(item, f"{p}[{i}]"))
    else:
        for lineno, item in iter_jsonl(p, "examples file", limits):
            _row_cap(p, len(rows), limits)
            rows.append(_as_object(item, f"{p}:{lineno}"))
    return _checked_rows(p, rows, limits)


def _plain_text(head: bytes) -> bool:
    """The file's first line is no JSON at all (not a broken object or array: that is a JSON
    file with a mistake, said by the reader with its line and column)."""
    first = head.removeprefix(b"\xef\xbb\xbf").lstrip().split(b"\n", 1)[0].strip()
    if first.startswith((b"{", b"[")):
        return False
    if b"\n" not in head.lstrip() and len(head) >= 4096:  # a first line longer than the head
        return False
    try:
        text = first.decode("utf-8")
    except UnicodeDecodeError:  # not text at all: the reader says "not UTF-8 text"
        return False
    if "\0" in text:
        return False
    try:
        json.loads(text)
    except ValueError:
        return True
    return False


def _row_cap(p: Path, index: int, limits: Limits) -> None:
    """Refuse row `index` (0-based) past `limits.max_rows`, before it is kept."""
    if limits.max_rows is not None and index >= limits.max_rows:
        raise DataError(
            f"{p}: more than {limits.max_rows} rows, over the limit for an examples file",
            "split the data, or give a subset",
        )


def _checked_rows(p: Path, rows: list[SourcedRow], limits: Limits = EXAMPLES) -> list[SourcedRow]:
    if not rows:
        raise DataError(f"{p}: the examples file has no rows", "give at least one example")
    if limits.max_rows is not None and len(rows) > limits.max_rows:
        _row_cap(p, len(rows), limits)  # CSV and datasets sources, counted once read
    return rows


def examples_sha256(path: str | Path) -> str:
    """The SHA256 of the examples' bytes as read: the file's, or for a `save_to_disk` directory
    one over the files it reads. A path that is neither is refused as the reader refuses it."""
    p = Path(path)
    kind = source_kind(p)
    if kind == "saved":
        return source_sha256(p, kind)
    if kind == "splits":
        read_source(p, kind, EXAMPLES)  # refuses it in one line, naming the splits
    with reading.open_regular(p, "examples file", hint="check the --examples path"):
        return sha256_file(p)


READS = (
    "twinrun reads JSONL, a JSON array or CSV (a header row, then one example a line), and "
    "with the datasets extra Parquet and save_to_disk directories"
)


def csv_rows(p: Path, limits: Limits) -> list[SourcedRow]:
    """The rows of a CSV file (UTF-8, a header row naming the fields, every value a string),
    each named `FILE:LINE`; bounded as a JSONL file is."""
    import csv
    import io

    text = read_limited(p, "examples file", limits.max_file_bytes)
    try:
        decoded = text.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(f"{p}: not UTF-8 text (byte {exc.start}); {READS}") from None
    reader = csv.DictReader(io.StringIO(decoded, newline=""), strict=True)
    rows = []
    try:
        for record in reader:
            where = f"{p}:{reader.line_num}"
            if None in record or any(v is None for v in record.values()):
                raise DataError(f"{where}: the row has another number of fields than the header")
            if sum(len(k) + len(v) for k, v in record.items()) > limits.max_bytes:
                raise DataError(f"{where}: a row over the limit of {limits.max_bytes} bytes")
            rows.append(SourcedRow(dict(record), where))
    except csv.Error as exc:
        raise DataError(f"{p}:{reader.line_num}: not valid CSV ({exc})") from None
    if not reader.fieldnames:
        raise DataError(f"{p}: the CSV file has no header row", "name the fields on line 1")
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


def sft_parts(row: SourcedRow) -> tuple[list[dict[str, str]], str]:
    """(prompt messages, completion) of an SFT row: {prompt, completion} or {messages}."""
    if "messages" in row.data:
        msgs = row.data["messages"]
        if not isinstance(msgs, list) or len(msgs) < 2:
            raise DataError(f"{row.where}: 'messages' must be a list of at least two messages")
        check_messages(row, "messages", msgs)
        if msgs[-1]["role"] != "assistant":
            raise DataError(
                f"{row.where}: the last message must have role 'assistant' (it is the completion)"
            )
        return [dict(m) for m in msgs[:-1]], msgs[-1]["content"]
    if "prompt" not in row.data or "completion" not in row.data:
        if "text" in row.data:  # TRL's standard language-modelling row
            raise DataError(
                f"{row.where}: a {{text}} row is plain language modelling, not an SFT example",
                "train plain text with `twinrun tune text --corpus FILE` (the text in a UTF-8 "
                "file); an SFT row is {prompt, completion} or {messages}",
            )
        raise DataError(
            f"{row.where}: a row needs 'prompt' and 'completion', or 'messages'",
            f"found fields: {', '.join(sorted(row.data)) or 'none'}",
        )
    if isinstance(row.data["prompt"], list) or isinstance(row.data["completion"], list):
        return conversational_parts(row)
    return (
        [{"role": "user", "content": require_str(row, "prompt")}],
        require_str(row, "completion", allow_empty=True),
    )


def message_list(row: SourcedRow, key: str) -> list[dict[str, str]]:
    """`row[key]` as a list of {role, content} string messages (a DataError naming the row)."""
    msgs = row.data.get(key)
    if not isinstance(msgs, list) or not msgs:
        raise DataError(f"{row.where}: '{key}' must be a non-empty list of messages")
    check_messages(row, key, msgs)
    return [{"role": m["role"], "content": m["content"]} for m in msgs]


def check_messages(row: SourcedRow, key: str, msgs: list[Any]) -> None:
    """A DataError naming the row and the first of `msgs` (the list at `row[key]`) that is not
    a dict with string 'role' and 'content'."""
    for i, m in enumerate(msgs):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str)):  # fmt: skip
            raise DataError(f"{row.where}: {key}[{i}] needs string 'role' and 'content'")


def conversational_parts(row: SourcedRow) -> tuple[list[dict[str, str]], str]:
    """TRL's conversational prompt-completion row: `prompt` the conversation so far, `completion`
    one assistant message — the same tokens as {messages: prompt + completion}, the completion
    alone trained (`encode_sft_row`)."""
    prompt, completion = message_list(row, "prompt"), message_list(row, "completion")
    if len(completion) != 1 or completion[0]["role"] != "assistant":
        raise DataError(
            f"{row.where}: 'completion' must be one message with role 'assistant'",
            "a conversational row's completion is the assistant's answer",
        )
    if prompt[-1]["role"] == "assistant":
        raise DataError(f"{row.where}: the prompt's last message has role 'assistant'")
    return prompt, completion[0]["content"]


def conversational_prompt(row: SourcedRow, templated: bool) -> SourcedRow:
    """A GRPO row as its environment sees it. TRL's conversational prompt (`prompt` a list of
    messages ending with the user's) becomes that last message's text — what the environment's
    prompt and reward read — with the messages before it (a system prompt, earlier turns) kept
    as the row's `context`, which comes first in what the model is shown. A string prompt is
    left as it is."""
    if not isinstance(row.data.get("prompt"), list):
        return row
    messages = message_list(row, "prompt")
    if messages[-1]["role"] != "user":
        raise DataError(
            f"{row.where}: a conversational prompt must end with a 'user' message (it ends "
            f"with {messages[-1]['role']!r})",
            "the model answers the last user message: end the prompt with one",
        )
    if not templated:
        raise DataError(
            f"{row.where}: a conversational prompt needs the chat template",
            "pass --chat-template on, or give the prompt as a string",
        )
    data = {**row.data, "prompt": messages[-1]["content"]}
    return SourcedRow(data, row.where, tuple(messages[:-1]))


def encode_prompt_completion(
    tok: Tokenizer, messages: list[dict[str, str]], completion: str, chat_template: bool
) -> EncodedRow:
    """The row's ids as TRL tokenizes them; the loss covers the completion's tokens (with the
    eos or the template's end of turn)."""
    ids, n_prompt = tok.prompt_completion_ids(messages, completion, chat_template)
    return EncodedRow(tuple(ids), tuple([0] * n_prompt + [1] * (len(ids) - n_prompt)))


def row_tools(row: SourcedRow) -> list[dict[str, Any]] | None:
    """The row's `tools` (TRL's tool-calling SFT column): JSON schemas as a list of objects, or
    that list as a JSON string; None when the row has none."""
    value = row.data.get("tools")
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise DataError(f"{row.where}: 'tools' is a string but not JSON ({exc.msg})") from None
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise DataError(
            f"{row.where}: 'tools' must be a list of tool schemas (JSON objects)",
            "give each tool's JSON schema, as the chat template expects",
        )
    return value


def sft_conversation(row: SourcedRow) -> list[dict[str, Any]]:
    """The whole conversation of an SFT row, its last message the assistant's: {messages} as
    given (tool messages and `tool_calls` kept for the template), a prompt-completion row as
    its prompt plus the answer."""
    if "messages" not in row.data:
        messages, completion = sft_parts(row)
        return [*messages, {"role": "assistant", "content": completion}]
    sft_parts(row)  # the checks: a list of messages, the last the assistant's
    msgs = [dict(m) for m in row.data["messages"]]
    if msgs[0]["role"] == "assistant":
        raise DataError(
            f"{row.where}: the conversation starts with the assistant",
            "an assistant turn is trained on what comes before it: start with a system or "
            "user message",
        )
    return msgs


def sft_row_text(
    row: SourcedRow, chat_template: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """What an SFT row's tokens are made of, read and checked without a tokenizer: the
    conversation, its last message the assistant's answer, and the row's `tools` (only through
    the chat template, which renders them). Every refusal of a row's shape is raised here."""
    tools = row_tools(row)
    if chat_template:
        return sft_conversation(row), tools
    if tools is not None:
        raise DataError(
            f"{row.where}: a row with 'tools' needs the chat template to render them",
            "drop --no-chat-template, or drop the row's 'tools'",
        )
    messages, completion = sft_parts(row)
    return [*messages, {"role": "assistant", "content": completion}], None


def encode_sft_row(
    tok: Tokenizer,
    row: SourcedRow,
    chat_template: bool,
    max_length: int | None = None,
    all_tokens: bool = False,
) -> EncodedRow:
    """An SFT row's ids and loss mask. Through the chat template every assistant turn of a
    {messages} row is a target (TRL's `assistant_only_loss`), of a prompt-completion row the
    completion alone (TRL's `completion_only_loss`: an assistant turn in the prompt is context),
    and the row's `tools` are rendered; without it the row is plain text (the contents one per
    line) and the last answer is the target. `all_tokens` (`--messages-loss all`, TRL's default
    `assistant_only_loss=False`): every token of a {messages} row is a target (after the
    first, which nothing predicts)."""
    conversation, tools = sft_row_text(row, chat_template)
    if max_length is not None:
        check_length_floor(tok, conversation, chat_template, row.where, max_length)
    if not chat_template:
        *messages, answer = conversation
        enc = encode_prompt_completion(tok, messages, answer["content"], chat_template)
        ids, mask = list(enc.input_ids), list(enc.loss_mask)
    else:
        ids, mask = tok.conversation_ids(
            conversation, tools, last_only="messages" not in row.data, limit=max_length
        )
    if all_tokens and "messages" in row.data and (max_length is None or len(ids) <= max_length):
        mask = [1] * len(ids)
    return EncodedRow(tuple(ids), tuple(mask))


def encode_sft_rows(
    tok: Tokenizer,
    rows: list[SourcedRow],
    chat_template: bool,
    max_length: int,
    all_tokens: bool = False,
) -> list[EncodedRow]:
    out = []
    for row in rows:
        enc = encode_sft_row(tok, row, chat_template, max_length, all_tokens)
        check_length(enc, row.where, max_length)
        out.append(enc)
    return out


def check_length_floor(
    tok: Tokenizer,
    messages: list[dict[str, Any]],
    chat_template: bool,
    where: str,
    max_length: int,
) -> None:
    """`check_length` before any tokenizing: DataError naming the row when even its floor of
    tokens (`token_floor`: its characters, and its turns through the template) is over the
    row limit — a row of 10,000 turns is refused at once, not after 10,000 template renders."""
    floor = tok.token_floor(messages, chat_template)
    if floor > max_length:
        turns, chars = len(messages), sum(len(m.get("content") or "") for m in messages)
        raise DataError(
            f"{where}: at least {floor} tokens ({turns} messages, {chars} characters), over the "
            f"row limit of {max_length} (--max-length, else the model's positions)",
            "shorten the example, or raise --max-length within the model's positions",
        )


def check_length(enc: EncodedRow, where: str, max_length: int) -> None:
    """DataError naming the row when its tokens do not fit the row limit (`--max-length`, else
    the model's positions)."""
    if len(enc.input_ids) > max_length:
        raise DataError(
            f"{where}: {len(enc.input_ids)} tokens exceed the row limit of {max_length} "
            "(--max-length, else the model's positions)",
            "shorten the example, or raise --max-length within the model's positions",
        )
