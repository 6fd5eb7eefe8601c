"""Leaving the process group ends gloo's threads then and there: after transformers has imported
torch.distributed.nn (whose functions keep the group they find at import as their default), and
after a module was sharded with FSDP2 (DTensor's sharding caches keep its mesh, and the mesh the
group). A gloo thread left to the interpreter's shutdown can abort a process whose run succeeded
("terminate called without an active exception", SIGABRT)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.distributed.launch import torchrun

LEAVE = Path(__file__).with_name("leave_group.py")
GLOO = ("gloo", "pt_gloo")  # gloo's transport loop and the process group's work threads


@pytest.mark.parametrize("sharded", [False, True], ids=["plain", "fsdp2"])
def test_teardown_joins_gloo_threads_before_the_process_ends(tmp_path: Path, sharded: bool) -> None:
    job = torchrun(2, [str(LEAVE), str(tmp_path), *(["--sharded"] if sharded else [])])
    assert job.returncode == 0, job.stderr[-2000:]
    reports = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    for report in reports:
        assert any(name.startswith(GLOO) for name in report["before"]), report  # the check bites
        assert not [name for name in report["after"] if name.startswith(GLOO)], report
