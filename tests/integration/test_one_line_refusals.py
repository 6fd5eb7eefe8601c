"""A refusal is one line on stderr, and no line repeats a secret: a resume with a changed
tokenizer (refused before its rows are tokenized, so no warning about them comes first), and a
plugin factory whose exception repeats an `--env-arg` value."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from testkit.toy_runs import run_args, write_examples
from twinrun.cli.main import run_cli

ECHOING_ENV = """
def make(api_key, **rest):
    raise ValueError(f"cannot log in with {api_key} at {rest}")
"""


def test_resume_with_a_changed_tokenizer_is_one_line(
    tmp_path: Path, toy_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "model"
    shutil.copytree(toy_model_dir, model)
    examples = write_examples(tmp_path)["sft"]
    args = run_args("sft", model, examples, tmp_path / "run", "--checkpoint-every", "1")
    assert run_cli([*args, "--stop-after", "1"]) == 0
    template = model / "chat_template.jinja"
    template.write_text(template.read_text() + "{{ bos_token }}x")  # prompts render differently
    capsys.readouterr()
    before = sorted((tmp_path / "run").rglob("*"))
    assert run_cli([*args, "--stop-after", "1", "--resume"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("twinrun: error: --resume with inputs that differ") and "tokenizer" in err
    assert sorted((tmp_path / "run").rglob("*")) == before


def test_a_plugin_error_line_never_repeats_an_argument(
    tmp_path: Path,
    toy_model_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "twinrun_echoing_env.py").write_text(ECHOING_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    examples = write_examples(tmp_path)["grpo"]
    args = run_args("grpo", toy_model_dir, examples, tmp_path / "o")
    i = args.index("--env")
    args[i + 1] = "twinrun_echoing_env:make"
    secrets = ["sk-CANARY-1", "CANARY-2", "https://u:CANARY-3@h/v1"]
    extra = ["--env-arg", f"api_key={secrets[0]}", "--env-arg", f"region={secrets[1]}",
             "--env-arg", f"endpoint={secrets[2]}"]  # fmt: skip
    assert run_cli([*args, *extra]) == 2
    err = capsys.readouterr().err
    assert "factory raised ValueError: cannot log in with <redacted>" in err
    assert len(err.strip().splitlines()) == 1
    assert not [s for s in ["CANARY", *secrets] if s in err], err
    assert not (tmp_path / "o").exists()
