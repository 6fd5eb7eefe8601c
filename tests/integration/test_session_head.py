"""The session is built with its final parameters: a reward run's session holds the reward head
(`session.head`) and its parameter from the moment it is built — nothing is added to it after —
and the head it trained is the one written beside the adapter. An objective without a head has
none, and no head parameter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from testkit.toy_runs import run_args, write_examples
from twinrun.capture.state import HEAD_PARAM
from twinrun.cli.main import run_cli
from twinrun.model.reward_head import HEAD_FILE, HEAD_KEY
from twinrun.train.setup.session import Opening, Session


def built_sessions(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[str], Any, Session]]:
    """Each session as `Opening.session` returns it: its parameters' names, its head, itself."""
    seen: list[tuple[list[str], Any, Session]] = []
    original = Opening.session

    def spy(self: Opening, encoded: Any) -> Session:
        s = original(self, encoded)
        seen.append(([name for name, _ in s.params], s.head, s))
        return s

    monkeypatch.setattr(Opening, "session", spy)
    return seen


def test_a_reward_session_is_built_with_its_head(
    tmp_path: Path, toy_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = write_examples(tmp_path / "data")
    seen = built_sessions(monkeypatch)
    out = tmp_path / "reward"
    assert run_cli(run_args("reward", toy_model_dir, files["reward"], out)) == 0
    ((names, head, session),) = seen
    assert head is not None and names[-1] == HEAD_PARAM
    assert names.count(HEAD_PARAM) == 1 and all("lora_" in n for n in names[:-1])
    assert dict(session.params)[HEAD_PARAM] is head.weight
    assert [n for n, _ in session.params] == names  # nothing was added after it was built
    written = load_file(str(out / HEAD_FILE))[HEAD_KEY]
    assert written.equal(head.weight.detach())  # the head that trained is the head written
    assert written.abs().sum() > 0


def test_an_sft_session_has_no_head(
    tmp_path: Path, toy_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = write_examples(tmp_path / "data")
    seen = built_sessions(monkeypatch)
    assert run_cli(run_args("sft", toy_model_dir, files["sft"], tmp_path / "sft")) == 0
    ((names, head, _),) = seen
    assert head is None and HEAD_PARAM not in names and names
