"""Tool calls parsed from model text (never raising), schemas from typed functions, the tools
system text, and which chat templates can carry a tool turn."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jinja2
import jinja2.sandbox
import pytest

from twinrun.core.errors import ConfigError, ModelError
from twinrun.rl.tool_calls import (
    MAX_CALL_CHARS,
    MAX_CALLS,
    ToolCall,
    canonical_json,
    check_tool_template,
    parse_tool_calls,
    template_takes_tools,
    tool_schema,
    tools_system_text,
)


def test_one_well_formed_call_and_the_text_around_it() -> None:
    text = (
        'Let me compute.\n<tool_call>\n {"name": "calc", "arguments": {"x": 1}} \n</tool_call> ok'
    )
    assert parse_tool_calls(text) == [
        ToolCall("calc", {"x": 1}, '\n {"name": "calc", "arguments": {"x": 1}} \n', None)
    ]
    assert parse_tool_calls("no calls here </tool_call>") == []


def test_several_calls_in_order() -> None:
    text = (
        '<tool_call>{"name": "a", "arguments": {}}</tool_call>'
        '<tool_call>{"name": " b ", "arguments": {"k": [1, 2]}}</tool_call>'
        '<tool_call>{"name": "c"}</tool_call>'
    )
    calls = parse_tool_calls(text)
    assert [(c.name, c.arguments, c.error) for c in calls] == [
        ("a", {}, None),
        ("b", {"k": [1, 2]}, None),
        ("c", {}, None),  # no "arguments": a call without parameters
    ]


@pytest.mark.parametrize(
    ("body", "name", "error"),
    [
        ('{"name": "a", "arguments": {"x": 1,}}', "", "tool call: not valid JSON (Expecting "),
        ("[1, 2]", "", "tool call is a JSON list, not an object"),
        ('{"arguments": {}}', "", 'tool call has no "name" string'),
        ('{"name": "", "arguments": {}}', "", 'tool call has no "name" string'),
        ('{"name": "a", "arguments": [1]}', "a", '"arguments" is a JSON list, not an object'),
        ('{"name": "a", "arguments": 3}', "a", '"arguments" is a JSON int, not an object'),
        ('{"name": "a", "arguments": "[1]"}', "a", '"arguments" is a JSON list, not an object'),
        ('{"name": "a", "arguments": "{bad"}', "a", '"arguments" is a string that is not a JSON'),
        ('{"name": "a", "arguments": {"x": NaN}}', "", "tool call: refused NaN"),
    ],
)
def test_malformed_calls_are_calls_with_an_error(body: str, name: str, error: str) -> None:
    (call,) = parse_tool_calls(f"<tool_call>{body}</tool_call>")
    assert call.name == name and call.arguments is None and call.raw == body
    assert call.error is not None and call.error.startswith(error) and "\n" not in call.error


def test_arguments_encoded_as_a_string_are_accepted() -> None:
    (call,) = parse_tool_calls(
        '<tool_call>{"name": "calc", "arguments": "{\\"expression\\": \\"1+2\\"}"}</tool_call>'
    )
    assert (call.name, call.arguments, call.error) == ("calc", {"expression": "1+2"}, None)


def test_an_unclosed_tag_is_one_error_call_after_the_good_ones() -> None:
    calls = parse_tool_calls('<tool_call>{"name": "a"}</tool_call> then <tool_call>{"name": "b"')
    assert [(c.name, c.error) for c in calls] == [
        ("a", None),
        ("", "<tool_call> is never closed by </tool_call>"),
    ]
    assert calls[1].raw == '{"name": "b"' and calls[1].arguments is None


def test_more_than_sixteen_calls_and_long_calls_are_bounded() -> None:
    one = '<tool_call>{"name": "a", "arguments": {}}</tool_call>'
    calls = parse_tool_calls(one * 40)
    assert len(calls) == MAX_CALLS + 1 == 17
    assert all(c.error is None for c in calls[:16])
    assert calls[16] == ToolCall(
        "", None, "", "more than 16 tool calls in one turn; the rest were not read"
    )
    long = '{"name": "a", "arguments": {"x": "' + "y" * MAX_CALL_CHARS + '"}}'
    (call,) = parse_tool_calls(f"<tool_call>{long}</tool_call>")
    assert call.error == "tool call longer than 8192 characters"
    assert len(call.raw) == MAX_CALL_CHARS
    (unclosed,) = parse_tool_calls("<tool_call>" + "z" * 100_000)
    assert len(unclosed.raw) == MAX_CALL_CHARS and unclosed.error is not None


def test_deep_nesting_is_an_error_not_a_crash() -> None:
    body = '{"name": "a", "arguments": {"x": ' + "[" * 3000 + "]" * 3000 + "}}"
    (call,) = parse_tool_calls(f"<tool_call>{body}</tool_call>")
    assert call.arguments is None and "nesting deeper than 32 levels" in (call.error or "")


def forecast(city: str, days: int, metric: bool = True, hours: list[int] | None = None,
             note=None, scale: float = 1.0, extra: dict | None = None) -> str:  # fmt: skip
    """Get the weather forecast for a city.

    Uses the nearest station.

    Args:
        city: The city's name,
            in English.
        days (int): How many days ahead.
        metric: Celsius when true.

    Returns:
        The forecast text.
    """
    return ""


def test_schema_of_a_typed_function_with_a_google_docstring() -> None:
    assert tool_schema(forecast) == {
        "type": "function",
        "function": {
            "name": "forecast",
            "description": "Get the weather forecast for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "The city's name, in English."},
                    "days": {"type": "integer", "description": "How many days ahead."},
                    "metric": {"type": "boolean", "description": "Celsius when true."},
                    "hours": {"type": "array", "items": {"type": "integer"}},
                    "note": {"type": "string"},
                    "scale": {"type": "number"},
                    "extra": {"type": "object"},
                },
                "required": ["city", "days"],
            },
        },
    }


def test_schema_of_a_bound_method_under_another_name_and_refusals() -> None:
    class Tools:
        def add(self, a: int, b: object) -> int:
            return a

    schema = tool_schema(Tools().add, "plus")
    assert schema["function"]["name"] == "plus" and schema["function"]["description"] == ""
    assert schema["function"]["parameters"]["properties"] == {
        "a": {"type": "integer"},
        "b": {"type": "string"},  # an unsupported annotation is a string
    }

    def star(*values: int) -> None: ...
    def stars(**options: int) -> None: ...

    for fn, kind in ((star, r"\*args"), (stars, r"\*\*kwargs")):
        with pytest.raises(ConfigError, match=rf"parameter '\w+' is {kind}, which a JSON schema"):
            tool_schema(fn)


def test_canonical_json() -> None:
    assert canonical_json({"b": 1, "a": ["é", 2.5]}) == '{"a":["é",2.5],"b":1}'
    with pytest.raises(ValueError):
        canonical_json(float("nan"))


def test_tools_system_text_is_stable() -> None:
    schemas = [tool_schema(forecast), {"type": "function", "function": {"name": "z"}}]
    text = tools_system_text(schemas)
    assert text == tools_system_text([dict(s) for s in schemas])
    assert text.startswith("# Tools\n\nYou may call one or more functions")
    body = text.split("<tools>\n")[1].split("\n</tools>")[0]
    assert body.splitlines() == [canonical_json(s) for s in schemas]
    assert text.endswith(
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )
    assert tools_system_text([]) == ""


SMOLLM2 = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
QWEN25 = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}
    {%- else %}{{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\n<tools>" }}
    {%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""  # noqa: E501 (Qwen2.5's own line)
RAISES_FOR_TOOL = (
    "{% for m in messages %}{% if m['role'] not in ['user', 'assistant', 'system'] %}"
    "{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}"
    "{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
DROPS_TOOL = (
    "{% for m in messages %}{% if m['role'] != 'tool' %}{{ m['role'] + ': ' + m['content'] + "
    "'\\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
)
REWRITES_HISTORY = (  # the assistant's turn is trimmed of its tool call when re-rendered
    "{% for m in messages %}{{ m['role'] + ': ' + m['content'].split('<tool_call>')[0] + "
    "'\\n' }}{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
)


def renderer(template: str, **variables: Any) -> Callable[[list[dict[str, str]], bool], str]:
    """A template rendered as transformers renders chat templates."""

    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    compiled = env.from_string(template)

    def render(messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return compiled.render(
            messages=messages, add_generation_prompt=add_generation_prompt, **variables
        )

    return render


def test_smollm2_and_qwen_templates_carry_a_tool_turn() -> None:
    check_tool_template(renderer(SMOLLM2), "SmolLM2")
    check_tool_template(renderer(QWEN25), "Qwen2.5")
    check_tool_template(renderer(QWEN25, tools=[tool_schema(forecast)]), "Qwen2.5 with tools")
    text = renderer(QWEN25)([{"role": "tool", "content": "R"}], False)
    assert text.endswith("<|im_start|>user\n<tool_response>\nR\n</tool_response><|im_end|>\n")


@pytest.mark.parametrize(
    ("template", "why"),
    [
        (RAISES_FOR_TOOL, "rendering raised TemplateError: Only user and assistant roles"),
        (DROPS_TOOL, "the tool message's content is not in the rendered text"),
        (REWRITES_HISTORY, "the rendered conversation does not start with the generation"),
    ],
)
def test_templates_that_cannot_carry_a_tool_turn_are_one_line(template: str, why: str) -> None:
    with pytest.raises(ModelError) as info:
        check_tool_template(renderer(template), "runs/model")
    line = info.value.one_line()
    assert line.startswith(f"the chat template of runs/model cannot render tool messages: {why}")
    assert line.endswith(
        "use a model whose chat template renders role 'tool' (e.g. SmolLM2, Qwen2.5)"
    )
    assert "\n" not in line


def test_template_takes_tools() -> None:
    assert template_takes_tools(QWEN25) is True
    assert template_takes_tools("{{ tools | tojson }}") is True
    assert template_takes_tools("{%- for t in tools -%}{{ t }}{% endfor %}") is True
    assert template_takes_tools(SMOLLM2) is False
    assert template_takes_tools("tools in the text {{ message['tools'] }} {{ m.tools }}") is False
    assert template_takes_tools("{{ my_tools }} {% if toolset %}{% endif %}") is False
    assert template_takes_tools("{{ tools") is False
    assert template_takes_tools("{{" * 50_000) is False  # linear: each block looked at once
