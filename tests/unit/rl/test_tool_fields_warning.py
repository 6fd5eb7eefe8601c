"""SFT rows whose `tools` or assistant `tool_calls` the chat template never renders are said
once, in one line (`dropped_tool_fields`); a template that renders them, or rows without them,
say nothing."""

from __future__ import annotations

from twinrun.rl.tool_calls import dropped_tool_fields

SMOLLM2_LIKE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>\\n'}}{% endfor %}"
)
QWEN_LIKE = (
    "{% if tools %}{% for tool in tools %}{{ tool | tojson }}{% endfor %}{% endif %}"
    "{% for m in messages %}{% if m.tool_calls %}{% for c in m.tool_calls %}{{ c.function.name }}"
    "{% endfor %}{% endif %}{{ m.content }}{% endfor %}"
)
CALL = {"type": "function", "function": {"name": "add", "arguments": {"a": 1}}}
TOOLED = {"messages": [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}],
          "tools": [{"type": "function", "function": {"name": "add"}}]}  # fmt: skip
CALLING = {"messages": [
    {"role": "user", "content": "1+1?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "content": "2"},
    {"role": "assistant", "content": "2"},
]}  # fmt: skip
PLAIN = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}


def test_a_template_that_drops_both_names_both_with_their_counts() -> None:
    said = dropped_tool_fields(SMOLLM2_LIKE, [TOOLED, CALLING, CALLING, PLAIN])
    assert said is not None and "\n" not in said
    assert "the 'tools' of 1 row(s)" in said
    assert "the assistant 'tool_calls' of 2 row(s)" in said
    assert "tools_system_text" in said and "<tool_call>" in said


def test_only_what_is_dropped_is_named() -> None:
    said = dropped_tool_fields(SMOLLM2_LIKE, [CALLING])
    assert said is not None and "'tools'" not in said and "'tool_calls' of 1 row(s)" in said


def test_a_template_that_renders_them_or_rows_without_them_say_nothing() -> None:
    assert dropped_tool_fields(QWEN_LIKE, [TOOLED, CALLING]) is None
    assert dropped_tool_fields(SMOLLM2_LIKE, [PLAIN, {**PLAIN, "tools": []}]) is None
    assert dropped_tool_fields(SMOLLM2_LIKE, [{"prompt": "a", "completion": "b"}]) is None
