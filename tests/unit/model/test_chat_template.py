"""Chat templates are rendered within bounds: a loop past the time limit, a value or an output
past the size limit, an include and a sandbox escape are each one ConfigError line naming the
template; a real template renders exactly as transformers renders it. The hang cases run in a
subprocess with a timeout, so a regression fails instead of hanging."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import pytest

from twinrun.core.errors import ConfigError
from twinrun.model import chat_template
from twinrun.model.chat_template import check_render
from twinrun.model.tokens import load_tokenizer

SRC = str(Path(__file__).resolve().parents[3] / "src")
MESSAGES = {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True}


def refused(template: str) -> str:
    with pytest.raises(ConfigError) as err:
        check_render(template, dict(MESSAGES), "toy")
    line = err.value.one_line()
    assert "\n" not in line and line.startswith("the chat template of toy ")
    return line


def test_a_loop_that_prints_nothing_is_stopped_by_the_time_limit() -> None:
    """10^10 iterations (hours) stop at the 0.5 s limit: the limit's own line, after at least
    0.5 s; the subprocess's 120 s timeout is the only upper bound, far from both (a busy
    machine took 6.3 s)."""
    code = textwrap.dedent("""
        import time
        from twinrun.model import chat_template
        from twinrun.core.errors import ConfigError
        chat_template.TIME_LIMIT = 0.5
        loop = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
        t0 = time.monotonic()
        try:
            chat_template.check_render(loop, {"messages": []}, "toy")
        except ConfigError as exc:
            print(round(time.monotonic() - t0, 1), exc.one_line())
    """)
    try:
        res = subprocess.run([sys.executable, "-c", code], env=os.environ | {"PYTHONPATH": SRC},
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("the looping template was not stopped")
    assert res.returncode == 0, res.stderr
    seconds, line = res.stdout.strip().split(" ", 1)
    assert float(seconds) >= 0.5  # it ran to the limit
    assert line == (
        "the chat template of toy ran past the time limit of 0.5 s — fix the chat template, "
        "or use --chat-template off"
    )


def test_the_deadline_stops_a_loop_off_the_main_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """No timer off the main thread: every sandboxed operation checks the deadline."""
    import threading

    monkeypatch.setattr(chat_template, "TIME_LIMIT", 0.3)
    out: list[str] = []

    def work() -> None:
        try:
            check_render("{% for i in range(100000) %}{% for j in range(100000) %}{{ i.real }}"
                         "{% endfor %}{% endfor %}", {}, "toy")  # fmt: skip
        except ConfigError as exc:
            out.append(exc.message)

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(30)
    assert out == ["the chat template of toy ran past the time limit of 0.3 s"]


def test_a_value_of_3e9_characters_is_refused_before_it_is_built() -> None:
    """Counted in bytes, not seconds: the refusal allocates nothing near the value's 3 GB."""
    tracemalloc.start()
    try:
        line = refused("{{ 'x' * 3000000000 }}")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, peak
    assert "built a value of more than 4194304 characters" in line


@pytest.mark.parametrize(
    "template", ["{{ 'x'.ljust(3000000000) }}", "{{ 10 ** 100000000 }}", "{{ [1] * 10**9 }}"]
)
def test_other_huge_values_are_refused(template: str) -> None:
    assert "the chat template of toy" in refused(template)


def test_an_output_flood_is_capped() -> None:
    line = refused("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}")
    assert "rendered more than 4194304 characters" in line


def test_an_include_is_one_line() -> None:
    line = refused("{% include '/etc/passwd' %}")
    assert "includes another template (/etc/passwd)" in line


def test_a_sandbox_escape_is_one_line() -> None:
    line = refused("{{ ''.__class__.__mro__[1].__subclasses__() }}")
    assert "was refused by the sandbox" in line


def test_a_real_template_renders_as_transformers_does(toy_model_dir: Path) -> None:
    tok = load_tokenizer(toy_model_dir)
    messages = [{"role": "user", "content": "2+2="}]
    text = tok.render_chat(messages, add_generation_prompt=True)
    assert text == tok.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert tok.prompt_ids(messages, True) == [
        int(i) for i in tok.hf(text, add_special_tokens=False)["input_ids"]
    ]


def test_a_hostile_template_in_a_checkpoint_is_one_line(
    toy_model_dir: Path, tmp_path: Path
) -> None:
    model = tmp_path / "model"
    shutil.copytree(toy_model_dir, model)
    (model / "chat_template.jinja").write_text("{{ 'x' * 3000000000 }}")
    tok = load_tokenizer(model)
    with pytest.raises(ConfigError) as err:
        tok.prompt_ids([{"role": "user", "content": "hi"}], chat_template=True)
    assert err.value.message == (
        f"the chat template of {model} built a value of more than 4194304 characters"
    )
