"""The output lock: atomic, PID-holding, stale-lock takeover, released on exit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from twinrun.core.errors import OutputError
from twinrun.core.lock import lock_path, output_lock

HOLD = """
import sys, time
from twinrun.core.lock import output_lock
with output_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(60)
"""


def hold_in_other_process(out: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], stdout=subprocess.PIPE,
                            text=True, env=os.environ)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_lock_file_holds_the_pid_and_goes_away(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with output_lock(out) as lock:
        assert lock == tmp_path / ".run.twinrun-lock"
        assert lock.read_text() == f"{os.getpid()}\n"
        assert not out.exists()  # the lock never makes the directory itself
    assert not lock.exists()
    assert sorted(tmp_path.iterdir()) == []


def test_second_process_is_refused_then_takes_over_a_dead_owner(tmp_path: Path) -> None:
    out = tmp_path / "run"
    holder = hold_in_other_process(out)
    try:
        with pytest.raises(OutputError) as err, output_lock(out):
            pass
        line = err.value.one_line()
        assert f"in use by another twinrun process (pid {holder.pid})" in line
        assert "\n" not in line
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert lock_path(out).read_text() == f"{holder.pid}\n"  # SIGKILL left it behind: stale
    with output_lock(out) as lock:
        assert lock.read_text() == f"{os.getpid()}\n"


def test_lock_is_released_when_the_process_exits(tmp_path: Path) -> None:
    out = tmp_path / "run"
    code = "import sys\nfrom twinrun.core.lock import acquire\nacquire(sys.argv[1])\n"
    subprocess.run([sys.executable, "-c", code, str(out)], check=True, env=os.environ)
    assert not lock_path(out).exists()  # released at interpreter exit, not left stale


def test_parents_made_for_the_lock_are_removed_when_left_empty(tmp_path: Path) -> None:
    with output_lock(tmp_path / "a" / "b" / "run"):
        assert (tmp_path / "a" / "b").is_dir()
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("where", ["under_file", "loop"])
def test_unusable_output_locations_are_one_line(tmp_path: Path, where: str) -> None:
    if where == "under_file":
        (tmp_path / "f").write_text("x")
        out, expect = tmp_path / "f" / "run", "which is a file and not a directory"
    else:
        (tmp_path / "l1").symlink_to(tmp_path / "l2")
        (tmp_path / "l2").symlink_to(tmp_path / "l1")
        out, expect = tmp_path / "l1" / "run", "symlink loop"
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(OutputError) as err, output_lock(out):
        pass
    assert expect in err.value.one_line()
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_two_training_runs_on_one_output(tmp_path: Path, toy_model_dir: Path) -> None:
    """Two real `twinrun tune sft` processes started together on one --output: one trains, the
    other stops with one line and writes nothing."""
    from testkit.toy_runs import sft_args
    from twinrun.data.examples import shipped_examples

    ex = tmp_path / "ex.jsonl"
    ex.write_text("\n".join(shipped_examples("sft.jsonl").read_text().splitlines()[:8]) + "\n")
    out = tmp_path / "run"
    args = [sys.executable, "-m", "twinrun", *sft_args(toy_model_dir, ex, out, 1, "--diag")]
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]  # fmt: skip
    results = [(p.wait(), *p.communicate()) for p in procs]
    codes = sorted(r[0] for r in results)
    assert codes == [0, 2], results
    (_, _, err) = next(r for r in results if r[0] == 2)
    lines = err.strip().splitlines()
    # usually the lock; if the winner finished before the other started, the non-empty check
    assert len(lines) == 1, err
    assert "in use by another twinrun process" in lines[0] or "is not empty" in lines[0], err
    rows = (out / "diag.jsonl").read_text().splitlines()
    assert [json.loads(r)["step"] for r in rows] == [0, 1]
    assert not lock_path(out).exists()


@pytest.mark.parametrize(
    "content", [b"99999999999\n", b"4194305\n", b"0\n", b"-5\n", b"abc\n", b"12\x00\n", b""]
)
def test_a_lock_that_does_not_hold_a_pid_is_one_line_and_left_alone(
    tmp_path: Path, content: bytes
) -> None:
    out = tmp_path / "run"
    lock = lock_path(out)
    lock.write_bytes(content)
    with pytest.raises(OutputError, match="not a process id") as info:
        with output_lock(out):
            pass
    assert "\n" not in info.value.one_line()
    assert lock.read_bytes() == content and not out.exists()


def test_a_stale_lock_with_a_valid_pid_is_taken_over(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    lock_path(out).write_text(proc.stdout)  # that process has exited
    with output_lock(out) as lock:
        assert lock.read_text() == f"{os.getpid()}\n"
