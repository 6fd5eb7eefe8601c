"""Ctrl-C before a run's steps (while Python imports the CLI, torch, the model; while the run
directory is begun): one line, exit 130, no traceback, no false blame on an input — and the
rerun the line names works."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testkit.toy_runs import sft_args
from twinrun.cli import main as cli_main
from twinrun.cli.main import INTERRUPTED_LINE, run_cli

# seconds after the console script's entry point is called (what the `twinrun` script does:
# import `twinrun.__main__.main`, a module that imports nothing, and call it); before that the
# interpreter's own start-up (`site`, finding the module) is Python's
DELAYS = (0.0, 0.01, 0.03, 0.06, 0.1, 0.2, 0.4, 0.8, 1.4)
STARTED = (
    "import os, sys; from twinrun.__main__ import main; os.write({fd}, b'1'); os.close({fd}); "
    "sys.argv[0] = 'twinrun'; main()"
)


def default_sigint() -> None:  # a background job may inherit SIGINT ignored: give it Python's
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupted(args: list[str], delay: float) -> tuple[subprocess.Popen[str], str]:
    """The run started through the console script's entry point, SIGINT `delay` s after it."""
    ready, started = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-c", STARTED.format(fd=started), *args], stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, preexec_fn=default_sigint, pass_fds=(started,),
    )  # fmt: skip
    os.close(started)
    assert os.read(ready, 1) == b"1"  # twinrun's entry point runs from here on
    os.close(ready)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    said, _ = proc.communicate(timeout=120)
    return proc, said


def in_the_harness(said: str) -> bool:
    """Whether the signal landed in this test's own start-up string, between its write to the
    pipe and the call of twinrun's entry point (a loaded machine can deschedule the child
    there): Python's traceback ends in `<string>` with no twinrun frame — the test's race, not
    twinrun's, so the attempt is repeated."""
    return (
        said.startswith("Traceback")
        and 'File "<string>", line 1, in <module>' in said
        and "twinrun" + os.sep not in said
        and said.rstrip().endswith("KeyboardInterrupt")
    )


@pytest.mark.parametrize("delay", DELAYS)
def test_ctrl_c_while_starting_is_one_line(
    tmp_path: Path, toy_model_dir: Path, sft_examples: Path, delay: float
) -> None:
    out = tmp_path / "run"
    args = sft_args(toy_model_dir, sft_examples, out, 1)
    for _ in range(3):
        proc, said = interrupted(args, delay)
        if not in_the_harness(said):
            break
    if proc.returncode == 0:  # the toy run finished before the signal came: nothing to see
        pytest.skip(f"the run finished within {delay} s")
    lines = said.strip().splitlines()
    # 130, or killed by SIGINT itself after the line (what a shell also reports as 130)
    assert proc.returncode in (130, -signal.SIGINT), said
    assert len(lines) == 1 and lines[0].startswith("twinrun: interrupted (SIGINT)"), said
    assert "Traceback" not in said and "internal error" not in said, said
    rerun = [*args, "--overwrite"] if out.exists() and any(out.iterdir()) else args
    assert run_cli(rerun) == 0  # what the line says to do works
    assert (out / "twinrun.json").is_file()


def test_what_a_ctrl_c_broke_is_blamed_on_the_ctrl_c(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An import a Ctrl-C cut short raises ImportError (or a load says its file is bad) after
    the signal: that is the interrupt's, not an internal error or the input's fault."""

    def broken(*_a: object, **_k: object) -> None:
        raise ImportError("cannot import name 'AutoTokenizer' (partially initialized module)")

    monkeypatch.setattr(cli_main, "SIGINT_SEEN", [True])
    monkeypatch.setattr(cli_main.LazyGroup, "get_command", broken)
    assert run_cli(["tune", "sft"]) == 130
    assert capsys.readouterr().err.strip() == INTERRUPTED_LINE
    monkeypatch.setattr(cli_main, "SIGINT_SEEN", [])  # without a Ctrl-C: the bug it is
    assert run_cli(["tune", "sft"]) == 1
    assert "internal error: ImportError" in capsys.readouterr().err
