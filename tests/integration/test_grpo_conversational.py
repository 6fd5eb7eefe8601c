"""TRL's conversational GRPO prompts: `prompt` a list of messages ending with the user's. The
environment reads the last message's text (its prompt and reward see a string, as before); the
messages before it come first in what the model is shown. A conversation of one user message is
the same run, byte for byte, as its string; a system message changes what the model sees."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testkit.toy_runs import run_args
from twinrun.cli.main import run_cli

ROWS = [("What is 1 + 2?", "3"), ("What is 3 + 4?", "7"), ("What is 2 + 2?", "4"),
        ("What is 4 + 1?", "5")]  # fmt: skip
SYSTEM = "Answer with the number only."


def write(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def grpo_args(toy: Path, examples: Path, out: Path) -> list[str]:
    """The toy GRPO run of the other tests, on the built-in arithmetic environment."""
    args = run_args("grpo", toy, examples, out, "--log-completions", "1")
    args[args.index("--env") + 1] = "arithmetic"
    return args


def train(toy: Path, examples: Path, out: Path) -> Path:
    assert run_cli(grpo_args(toy, examples, out)) == 0
    return out


def prompts(run: Path) -> list[str]:
    lines = (run / "completions.jsonl").read_text().splitlines()
    return [json.loads(line)["prompt"] for line in lines]


def test_a_one_message_conversation_is_its_string(tmp_path: Path, toy_model_dir: Path) -> None:
    plain = write(tmp_path / "plain.jsonl", [{"prompt": p, "answer": a} for p, a in ROWS])
    said = [{"prompt": [{"role": "user", "content": p}], "answer": a} for p, a in ROWS]
    talk = write(tmp_path / "talk.jsonl", said)
    a = train(toy_model_dir, plain, tmp_path / "a")
    b = train(toy_model_dir, talk, tmp_path / "b")
    for name in ("adapter_model.safetensors", "completions.jsonl"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_the_messages_before_the_last_come_first(tmp_path: Path, toy_model_dir: Path) -> None:
    rows = [
        {"prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": p}],
         "answer": a}
        for p, a in ROWS
    ]  # fmt: skip
    run = train(toy_model_dir, write(tmp_path / "sys.jsonl", rows), tmp_path / "sys")
    plain = train(
        toy_model_dir,
        write(tmp_path / "plain.jsonl", [{"prompt": p, "answer": a} for p, a in ROWS]),
        tmp_path / "plain",
    )
    shown = prompts(run)
    assert shown and all(SYSTEM in text for text in shown)
    assert all(SYSTEM not in text for text in prompts(plain))
    assert all(any(p in text for p, _ in ROWS) for text in shown)  # the user's message follows
    assert shown[0].index(SYSTEM) < min(shown[0].find(p) for p, _ in ROWS if p in shown[0])


@pytest.mark.parametrize(
    ("prompt", "extra", "says"),
    [
        ([{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}], (),
         "a conversational prompt must end with a 'user' message (it ends with 'assistant')"),
        ([{"role": "user", "content": "2+2?"}], ("--chat-template", "off"),
         "a conversational prompt needs the chat template"),
        ([], (), "'prompt' must be a non-empty list of messages"),
        ([{"role": "user"}], (), "prompt[0] needs string 'role' and 'content'"),
    ],
)  # fmt: skip
def test_a_bad_conversational_prompt_is_one_line_and_nothing_is_written(
    tmp_path: Path, toy_model_dir: Path, capsys: pytest.CaptureFixture[str],
    prompt: list[dict[str, str]], extra: tuple[str, ...], says: str,
) -> None:  # fmt: skip
    rows = [{"prompt": p, "answer": a} for p, a in ROWS[:3]] + [{"prompt": prompt, "answer": "4"}]
    data = write(tmp_path / "bad.jsonl", rows)
    out = tmp_path / "out"
    args = grpo_args(toy_model_dir, data, out)
    if extra:
        at = args.index(extra[0])
        args[at + 1] = extra[1]
    capsys.readouterr()
    assert run_cli(args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{data}:4: {says}" in err, err
    assert not out.exists()
