"""Start twinrun under torchrun on loopback (gloo, CPU): a free port per job, one torch thread
per process, the worktree and the test's plugin folders on PYTHONPATH (ahead of any inherited
entries)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import twinrun

SRC = Path(twinrun.__file__).resolve().parents[1]
ROOT = SRC.parent
MANY = Path(__file__).with_name("run_many.py")
# The collective timeout of a job whose test holds that no process waited for a peer (the
# product's default): far from the ~20 s a failing job takes on 2 idle cores, and from what it
# takes on a busy machine, so `job.seconds < FAULT_TIMEOUT_S` fails only when a process waited.
# Other jobs keep 60 s: a hang fails sooner.
FAULT_TIMEOUT_S = 300
FAULT_ENV = {"TWINRUN_DIST_TIMEOUT_S": str(FAULT_TIMEOUT_S)}


def free_port() -> int:
    """A TCP port nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Job:
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def launch_env(
    nproc: int,
    target: list[str],
    paths: tuple[Path, ...] = (),
    env: dict[str, str] | None = None,
    rdzv: list[str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of `torchrun --nproc-per-node N TARGET...`: on a free
    loopback port, or at the rendezvous `rdzv` gives (`--nnodes 2 --rdzv-backend c10d ...`)."""
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    path = os.pathsep.join([str(SRC), str(ROOT), *map(str, paths), *inherited])
    full_env = os.environ | {
        "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "TWINRUN_DIST_TIMEOUT_S": "60",
    } | (env or {})  # fmt: skip
    where = rdzv or ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           *where, *target]  # fmt: skip
    return cmd, full_env


def torchrun(
    nproc: int,
    target: list[str],
    *,
    paths: tuple[Path, ...] = (),
    timeout: float = 180,
    env: dict[str, str] | None = None,
) -> Job:
    """`torchrun --nproc-per-node N --master-port <free> TARGET...` (TARGET: `-m twinrun ...` or
    a script and its arguments); returns its exit status, output and wall seconds."""
    cmd, full_env = launch_env(nproc, target, paths, env)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout)
    return Job(done.returncode, done.stdout, done.stderr, time.perf_counter() - t0)


def torchrun_many(nproc: int, runs: list[list[str]], folder: Path, **kw: object) -> Job:
    """Several twinrun commands, one after the other, in one torchrun job (one process group;
    it saves the start-up of a job per run)."""
    folder.mkdir(parents=True, exist_ok=True)
    spec = folder / "runs.json"
    spec.write_text(json.dumps(runs))
    return torchrun(nproc, [str(MANY), str(spec)], **kw)  # type: ignore[arg-type]
