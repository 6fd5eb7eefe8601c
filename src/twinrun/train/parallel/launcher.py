"""`twinrun launch`: torchrun in this process, a refusal read as one line.

torchrun answers a process that exits non-zero with its own report: an `E… failed (exitcode: 2)`
log line, the Python traceback of its `ChildFailedError`, and a 20-line block naming each rank,
host, pid and exit code — some 40 lines under the line the process printed, which every process
of the run printed once. Here torchrun's launcher (`torch.distributed.run.run`, given torchrun's
own arguments) runs with its log lines off, and:

- each node's local rank 0 prints its lines as ever; every other process hands its error line to
  the launcher (a file per rank in a folder the launcher made, `LINES_ENV`) instead of printing it;
- when a process fails, the launcher prints the line of the first one that failed if local rank 0
  printed none (it succeeded, or torchrun ended it first), and exits with that process's status
  (2 for a refusal, where torchrun exits 1);
- a process a signal ended printed nothing: the launcher says which rank and signal, in one line;
- Ctrl-C reaches every process, local rank 0 says what was kept, and the launcher exits 130.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from twinrun.core.errors import TwinrunError

if TYPE_CHECKING:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

LINES_ENV = "TWINRUN_LAUNCH_LINES"  # the folder a launched process writes its error line to


class LaunchError(TwinrunError, RuntimeError):
    """A process the launcher started ended without saying why (a signal)."""

    exit_code = 1


def hand_over(line: str) -> bool:
    """Under `twinrun launch`, keep this process's error `line` for the launcher; True when the
    launcher, not this process, prints it (a process other than its node's local rank 0)."""
    folder, rank = os.environ.get(LINES_ENV), os.environ.get("RANK")
    if not folder or rank is None:
        return False
    try:
        (Path(folder) / f"rank-{int(rank)}.line").write_text(line + "\n", encoding="utf-8")
    except (OSError, ValueError):
        return False  # print it then: a line said twice beats a line lost
    return os.environ.get("LOCAL_RANK", "0") != "0"


def launch(argv: list[str]) -> tuple[int, str | None]:
    """Run torchrun with its arguments `argv`: the exit status of the first process that failed
    (0 when none did), and the line to print for it (None when its process printed it).
    LaunchError for a process a signal ended."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    args = parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="twinrun-launch-"))
    os.environ[LINES_ENV] = str(folder)  # the processes torchrun starts inherit it
    logging.disable(logging.ERROR)  # torchrun's own lines: the processes print what matters
    try:
        run(args)
    except ChildFailedError as exc:
        return _failed(exc, folder)
    except SignalException as exc:  # Ctrl-C or SIGTERM: local rank 0 said what it kept
        return 128 + int(exc.sigval), None
    finally:
        logging.disable(logging.NOTSET)
        del os.environ[LINES_ENV]
        shutil.rmtree(folder, ignore_errors=True)
    return 0, None


def _failed(exc: ChildFailedError, folder: Path) -> tuple[int, str | None]:
    """The launcher's answer to torchrun's ChildFailedError `exc`: the first failed process's
    exit status, and its line where local rank 0 printed none."""
    rank, failure = exc.get_first_failure()
    if failure.exitcode < 0:  # a signal: the process said nothing
        error = LaunchError(
            f"rank {rank} (pid {failure.pid}) was ended by {failure.signal_name()} before it "
            "said why",
            "a SIGKILL is often the kernel's out-of-memory killer: see dmesg, or give the "
            "processes more memory",
        )
        error.exit_code = 128 - failure.exitcode
        raise error
    printed = any(  # local rank 0 exited with a status of its own: it printed its line
        f.local_rank == 0 and f.exitcode > 0 for f in exc.failures.values()
    )
    kept = folder / f"rank-{rank}.line"
    line = kept.read_text(encoding="utf-8").strip() if kept.is_file() and not printed else None
    return int(failure.exitcode), line
