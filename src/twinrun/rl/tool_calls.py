"""Tool calls in model text, tool schemas, and whether a chat template can hold a tool turn.

A model asks for a tool the Hermes way (Qwen2.5, SmolLM2, Hermes): a JSON object between tags,

    <tool_call>{"name": "calculate", "arguments": {"expression": "3 * 7"}}</tool_call>

any number of them in one turn. `parse_tool_calls` never raises: a call that cannot be used
(malformed JSON, no name, arguments that are not an object, an unclosed tag) is a `ToolCall`
whose `error` says why, in one line, so the environment can tell the model and go on. The work
is bounded: at most MAX_CALLS calls per turn are parsed, each at most MAX_CALL_CHARS long.

`tool_schema` writes the OpenAI / TRL function schema of a Python function from its signature
and its Google-style docstring (as transformers' `get_json_schema` does);
`tools_system_text` is the system prompt that offers the schemas to a model whose chat template
does not render `tools` itself; `template_takes_tools` tells the two kinds of template apart,
and `check_tool_template` refuses a template that cannot render a `tool` message. This module
does not import torch.
"""

from __future__ import annotations

import inspect
import json
import re
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from twinrun.core.errors import ConfigError, DataError, ModelError
from twinrun.core.jsonlimits import Limits, parse_json

OPEN, CLOSE = "<tool_call>", "</tool_call>"
MAX_CALLS = 16  # calls parsed per turn; the rest are one error call
MAX_CALL_CHARS = 8192  # text between the tags; a longer call is refused unparsed
_CALL_JSON = Limits(max_bytes=4 * MAX_CALL_CHARS, max_file_bytes=4 * MAX_CALL_CHARS, max_depth=32)


@dataclass(frozen=True)
class ToolCall:
    """One `<tool_call>` of a model turn."""

    name: str  # "" when unparseable
    arguments: dict[str, Any] | None  # None when malformed
    raw: str  # the text between the tags (at most MAX_CALL_CHARS of it)
    error: str | None  # None when well-formed; else one line: why it is malformed


def _malformed(raw: str, why: str, name: str = "") -> ToolCall:
    return ToolCall(name=name, arguments=None, raw=raw[:MAX_CALL_CHARS], error=why)


def _one_call(raw: str) -> ToolCall:
    if len(raw) > MAX_CALL_CHARS:
        return _malformed(raw, f"tool call longer than {MAX_CALL_CHARS} characters")
    try:
        obj = parse_json(raw.strip(), "tool call", _CALL_JSON)
    except DataError as exc:
        return _malformed(raw, exc.message)
    if not isinstance(obj, dict):
        return _malformed(raw, f"tool call is a JSON {type(obj).__name__}, not an object")
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return _malformed(raw, 'tool call has no "name" string')
    name = name.strip()
    arguments = obj.get("arguments", {})  # a tool without parameters may be called without
    if isinstance(arguments, str):  # Qwen sometimes encodes the object as a string
        try:
            arguments = parse_json(arguments, "tool call arguments", _CALL_JSON)
        except DataError:
            return _malformed(raw, '"arguments" is a string that is not a JSON object', name)
    if not isinstance(arguments, dict):
        return _malformed(
            raw, f'"arguments" is a JSON {type(arguments).__name__}, not an object', name
        )
    return ToolCall(name=name, arguments=arguments, raw=raw, error=None)


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every `<tool_call>...</tool_call>` of `text`, in order (none: an empty list). Text
    outside the tags is ignored; a stray `</tool_call>` too."""
    calls: list[ToolCall] = []
    at = text.find(OPEN)
    while at != -1:
        if len(calls) == MAX_CALLS:
            calls.append(
                _malformed(
                    "", f"more than {MAX_CALLS} tool calls in one turn; the rest were not read"
                )
            )
            break
        start = at + len(OPEN)
        end = text.find(CLOSE, start)
        if end == -1:
            calls.append(_malformed(text[start:], f"{OPEN} is never closed by {CLOSE}"))
            break
        calls.append(_one_call(text[start:end]))
        at = text.find(OPEN, end + len(CLOSE))
    return calls


def canonical_json(obj: Any) -> str:
    """One JSON text per value: sorted keys, no spaces, UTF-8 as is, no NaN or Infinity."""
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


_JSON_TYPES: dict[Any, str] = {
    int: "integer", float: "number", str: "string", bool: "boolean", list: "array",
    tuple: "array", dict: "object",
}  # fmt: skip
_SECTION = re.compile(r"^(Args|Arguments|Parameters|Returns?|Raises|Yields|Examples?|Notes?):\s*$")
_ARG_LINE = re.compile(r"^(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")


def _json_type(annotation: Any) -> dict[str, Any]:
    """The JSON schema of a parameter's annotation: the builtins of _JSON_TYPES, `list[X]` with
    its items, `X | None` as X; anything else (or nothing) is a string."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        kept = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _json_type(kept[0]) if len(kept) == 1 else {"type": "string"}
    base = origin if origin is not None else annotation
    kind = _JSON_TYPES.get(base, "string") if isinstance(base, type) else "string"
    schema: dict[str, Any] = {"type": kind}
    args = typing.get_args(annotation)
    if kind == "array" and len(args) == 1 and args[0] in _JSON_TYPES:
        schema["items"] = {"type": _JSON_TYPES[args[0]]}
    return schema


def _docstring_parts(doc: str) -> tuple[str, dict[str, str]]:
    """(first paragraph, {parameter: description}) of a Google-style docstring."""
    lines = inspect.cleandoc(doc).splitlines() if doc else []
    first: list[str] = []
    for line in lines:
        if not line.strip() or _SECTION.match(line.strip()):
            break
        first.append(line.strip())
    described: dict[str, str] = {}
    in_args, indent, current = False, -1, ""
    for line in lines:
        stripped = line.strip()
        if _SECTION.match(stripped):
            in_args, indent, current = (
                stripped.split(":")[0] in ("Args", "Arguments", "Parameters"),
                -1,
                "",
            )
            continue
        if not in_args or not stripped:
            continue
        depth = len(line) - len(line.lstrip())
        if indent < 0:
            indent = depth
        match = _ARG_LINE.match(stripped)
        if depth == indent and match:
            current = match.group(1).lstrip("*")
            described[current] = match.group(3).strip()
        elif depth > indent and current:
            described[current] = f"{described[current]} {stripped}".strip()
        else:
            in_args = False
    return " ".join(first), described


def tool_schema(fn: Callable[..., Any], name: str | None = None) -> dict[str, Any]:
    """The OpenAI / TRL function schema of `fn` (a bound method's `self` is not a parameter):
    int→integer, float→number, str→string, bool→boolean, list/tuple→array (`list[int]` with its
    items), dict→object, `X | None`→X, anything else or no annotation→string; a parameter without
    a default is required. The docstring's first paragraph is the description and its `Args:`
    lines the parameters' descriptions. *args and **kwargs (and positional-only parameters,
    which a call by name cannot fill) are refused with a ConfigError."""
    tool = name or getattr(fn, "__name__", "tool")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"tool {tool!r}: its signature cannot be read ({type(exc).__name__})"
        ) from None
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # a forward reference that does not resolve: fall back to the raw annotations
        hints = {}
    description, described = _docstring_parts(inspect.getdoc(fn) or "")
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in signature.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            kind = {"VAR_POSITIONAL": "*args", "VAR_KEYWORD": "**kwargs"}.get(
                param.kind.name, "positional-only"
            )
            raise ConfigError(
                f"tool {tool!r}: parameter {param.name!r} is {kind}, which a JSON schema "
                "cannot describe",
                "give the tool named parameters only (keyword-callable)",
            )
        annotation = hints.get(param.name, param.annotation)
        prop = _json_type(None if annotation is inspect.Parameter.empty else annotation)
        if param.name in described and described[param.name]:
            prop["description"] = described[param.name]
        properties[param.name] = prop
        if param.default is inspect.Parameter.empty:
            required.append(param.name)
    return {
        "type": "function",
        "function": {
            "name": tool,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


def tools_system_text(schemas: Sequence[dict[str, Any]]) -> str:
    """The Hermes / Qwen2.5 system text offering `schemas` (one canonical JSON per line, in the
    order given) for chat templates that do not render `tools` themselves. No schemas: ""."""
    if not schemas:
        return ""
    listed = "\n".join(canonical_json(s) for s in schemas)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{listed}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


_TOOLS_VAR = re.compile(r"(?<![\w.'\"])tools(?![\w'\"])")


def template_takes_tools(template: str) -> bool:
    """Whether the Jinja source uses a `tools` variable inside `{% %}` or `{{ }}` (a quoted
    'tools' or `x.tools` does not count). Scanned with str.find: linear in the template."""
    at = 0
    while True:
        starts = [i for i in (template.find("{{", at), template.find("{%", at)) if i != -1]
        if not starts:
            return False
        start = min(starts)
        close = "}}" if template.startswith("{{", start) else "%}"
        end = template.find(close, start + 2)
        if end == -1:
            return False
        if _TOOLS_VAR.search(template, start + 2, end):
            return True
        at = end + 2


class ToolFieldsWarning(UserWarning):
    """Rows give `tools` or assistant `tool_calls` that the chat template never renders."""


def dropped_tool_fields(template: str, rows: Sequence[dict[str, Any]]) -> str | None:
    """The warning for SFT rows whose `tools` column or assistant `tool_calls` the chat template
    does not render (SmolLM2's renders role and content only): those rows train without the
    tool list, or on an assistant turn without its call — what TRL does too, silently. None when
    nothing is dropped."""
    tools = sum(1 for r in rows if r.get("tools") not in (None, [], ""))
    calls = sum(
        1 for r in rows if isinstance(r.get("messages"), list)
        and any(isinstance(m, dict) and m.get("tool_calls") for m in r["messages"])
    )  # fmt: skip
    dropped = []
    if tools and not template_takes_tools(template):
        dropped.append(f"the 'tools' of {tools} row(s)")
    if calls and "tool_calls" not in template:
        dropped.append(f"the assistant 'tool_calls' of {calls} row(s)")
    if not dropped:
        return None
    return (
        f"the chat template does not render {' or '.join(dropped)}: those rows train without "
        "them; put the tool list in a system message (tools_system_text) and each call in the "
        "assistant's content as <tool_call>{...}</tool_call>, or use a model whose template "
        "renders them (e.g. Qwen2.5)"
    )


USER_SENTINEL = "TWINRUN-PROBE-USER-q7Zk"
ASSISTANT_SENTINEL = "TWINRUN-PROBE-ASSISTANT-q7Zk"
TOOL_SENTINEL = "TWINRUN-PROBE-TOOL-RESULT-q7Zk"
_PROBE_CALL = '<tool_call>{"name": "twinrun_probe", "arguments": {}}</tool_call>'


def check_tool_template(render: Callable[[list[dict[str, str]], bool], str], source: str) -> None:
    """Refuse (ModelError, one line) a chat template that cannot carry a tool-using episode.
    `render(messages, add_generation_prompt)` is the template's text. The probe renders
    [user, assistant with a tool call, tool] and needs:

    1. the render does not raise and is a str;
    2. the tool message's content is in it;
    3. it starts with render([user], True) followed by the assistant's content verbatim — the
       prompt the model was given and the turn it wrote are where the next prompt starts, so the
       tokens sampled in one turn are the tokens scored in the next."""
    user = {"role": "user", "content": USER_SENTINEL}
    assistant = {"role": "assistant", "content": f"{ASSISTANT_SENTINEL} {_PROBE_CALL}"}
    tool = {"role": "tool", "content": TOOL_SENTINEL}

    def refuse(why: str) -> ModelError:
        return ModelError(
            f"the chat template of {source} cannot render tool messages: {why}",
            "use a model whose chat template renders role 'tool' (e.g. SmolLM2, Qwen2.5)",
        )

    try:
        prompt = render([user], True)
        full = render([user, assistant, tool], False)
    except Exception as exc:  # a template fails in whatever way its Jinja code does
        line = " ".join(str(exc).split())[:200]
        raise refuse(f"rendering raised {type(exc).__name__}: {line}") from None
    if not isinstance(prompt, str) or not isinstance(full, str):
        raise refuse("rendering did not return text")
    if TOOL_SENTINEL not in full:
        raise refuse("the tool message's content is not in the rendered text")
    if not full.startswith(prompt + assistant["content"]):
        raise refuse(
            "the rendered conversation does not start with the generation prompt followed by "
            "the assistant's turn verbatim"
        )
