"""The console entry point's exit: the exit code of the command, and the heap frozen first, so
the interpreter's last garbage collections do not walk every object torch's import made."""

from __future__ import annotations

import gc
import signal

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


@pytest.mark.parametrize("ended_on_a_signal", [False, True])
def test_after_a_run_ended_on_a_signal_the_exit_ignores_more(
    monkeypatch: pytest.MonkeyPatch, ended_on_a_signal: bool
) -> None:
    """A Ctrl-C (or SIGTERM) while the process exits after a run a signal stopped would print a
    traceback from an exit hook, or end it with another status: the exit ignores them. After
    any other command, they keep their handlers."""
    from twinrun.core import interrupts

    def command(args: object = None) -> int:
        if ended_on_a_signal:
            interrupts.end()
        return 143 if ended_on_a_signal else 0

    monkeypatch.setattr(cli_main, "run_cli", command)
    monkeypatch.setattr("twinrun.core.portable.pin_environment", lambda: None)
    monkeypatch.setattr("twinrun.train.parallel.distributed.teardown", lambda: None)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.raises(SystemExit):
            cli_main.main()
        ignored = {sig: signal.getsignal(sig) is signal.SIG_IGN for sig in before}
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        interrupts.ENDING.clear()
        gc.unfreeze()
    assert ignored == dict.fromkeys(before, ended_on_a_signal)


def test_a_ctrl_c_after_a_run_ended_on_a_signal_notes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CLI's Ctrl-C handler, while a stopped run is on its way out: no KeyboardInterrupt
    (it would replace the run's own `interrupted` line and status), nothing noted."""
    from twinrun.core import interrupts

    monkeypatch.setattr(cli_main, "SIGINT_SEEN", [])
    monkeypatch.setattr(interrupts, "SEEN", [])
    monkeypatch.setattr(interrupts, "ENDING", [])
    interrupts.end()
    cli_main._note_sigint(signal.SIGINT, None)
    assert cli_main.SIGINT_SEEN == [] and interrupts.SEEN == []
    interrupts.ENDING.clear()
    with pytest.raises(KeyboardInterrupt):
        cli_main._note_sigint(signal.SIGINT, None)
    assert cli_main.SIGINT_SEEN == [True]
