"""A process that fails ends the whole job: an exception or a SIGKILL on rank 1 stops every
process well within the collective timeout, with one clear line and no run file written (3
processes, one without forwards, and a sharded base: test_shard_base.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from testkit.toy_runs import run_args, write_examples
from tests.distributed.launch import FAULT_ENV, FAULT_TIMEOUT_S, torchrun

FAILING_ENV = '''
import os
import signal


class FailsOnOneRank:
    """Arithmetic-like prompts; the reward fails on one process (RANK), as bad input would."""

    calls = 0  # per process: the rows' check scores first, then the steps' rollouts

    def __init__(self, mode="raise", rank="1", after="0"):
        self.mode, self.rank, self.after = mode, rank, int(after)

    def prompt(self, row, rng):
        return row["prompt"]

    def reward(self, row, completion):
        FailsOnOneRank.calls += 1
        if os.environ.get("RANK") == self.rank and FailsOnOneRank.calls > self.after:
            if self.mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise ValueError("this process cannot score its rows")
        return float(len(completion.encode("utf-8")) % 3)


def make(**args):
    return FailsOnOneRank(**args)
'''
MODULE = "twinrun_dist_failing_env"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("dist_faults")
    write_examples(folder)
    (folder / f"{MODULE}.py").write_text(FAILING_ENV)
    return folder


@pytest.mark.parametrize(("mode", "shard"), [("raise", False), ("kill", False), ("raise", True)])
def test_a_failing_rank_ends_every_process(
    mode: str, shard: bool, data: Path, toy_model_dir: Path
) -> None:
    out = data / f"out-{mode}-{shard}"
    args = run_args("grpo", toy_model_dir, data / "arith4.jsonl", out, "--diag")
    args = [*args[: args.index("--env") + 1], f"{MODULE}:make", *args[args.index("--env") + 2 :]]
    # sharded: rank 1 fails in a step's rollouts (past the rows' check), inside the lockstep
    args += ["--shard-base", "--rollout-block", "1", "--env-arg", "after=4"] if shard else []
    job = torchrun(2, ["-m", "twinrun", *args, "--env-arg", f"mode={mode}"], paths=(data,),
                   env=FAULT_ENV, timeout=FAULT_TIMEOUT_S + 120)  # fmt: skip
    assert job.returncode != 0
    assert job.seconds < FAULT_TIMEOUT_S  # rank 0 ended without waiting for the timeout
    ours = [line for line in job.stderr.splitlines() if line.startswith("twinrun: ")]
    cause = (
        f"twinrun: error: environment '{MODULE}:make': reward raised ValueError: "
        "this process cannot score its rows"
    )
    # rank 0 fails at whichever collective it waits in when rank 1 stops: the input check
    # (rows are scored before anything is written), the rollout gather, or (sharded) the step's
    # forwards
    consequence = re.compile(
        r"twinrun: error: rank 0 of 2: (waiting for every process to check its inputs|"
        r"gathering the rollouts|a step of the sharded base|waiting for the other processes' "
        r"forwards) failed: another process stopped "
        f"or did not answer within {FAULT_TIMEOUT_S} s"
    )
    # rank 1's own line (it raised); rank 0's one line, unless torchrun ended it first
    assert all(line == cause or consequence.match(line) for line in ours), ours
    if mode == "raise":
        assert ours[0] == cause or ours[-1] == cause
    else:  # a SIGKILL prints nothing; torchrun reports the signal
        assert cause not in ours and "Signal 9 (SIGKILL)" in job.stderr
    written = sorted(p.name for p in out.iterdir()) if out.exists() else []
    if shard:  # it failed while training: the run had begun (its list, its inputs), no more
        assert written == ["twinrun.files.jsonl", "twinrun.inputs.json"]
    else:
        assert written == []  # no adapter, metrics, sidecar or diag row: not even half of one
