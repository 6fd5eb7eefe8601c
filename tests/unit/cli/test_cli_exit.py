"""The console entry point's exit: the exit code of the command, and the heap frozen first, so
the interpreter's last garbage collections do not walk every object torch's import made."""

from __future__ import annotations

import gc

import pytest

import twinrun.cli.main as cli_main


@pytest.mark.parametrize("code", [0, 2])
def test_main_exits_with_the_commands_code_and_the_heap_frozen(
    monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    monkeypatch.setattr(cli_main, "run_cli", lambda args=None: code)
    monkeypatch.setattr("twinrun.core.portable.pin_environment", lambda: None)
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    try:
        with pytest.raises(SystemExit) as exit_info:
            cli_main.main()
        assert exit_info.value.code == code
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()  # this process goes on: its objects collectable again
