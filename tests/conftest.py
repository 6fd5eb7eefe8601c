"""Session fixtures: the toy checkpoint is built once per test session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# The suite runs the portable CPU kernels (its pinned bytes and golden file are portable ones):
# the default for every run that names no --cpu-kernels, in this process and the processes it
# starts. Set before twinrun.config is imported (the flag's default is read then).
# tests/unit/core/test_portable.py checks the default without it (native).
os.environ["TWINRUN_CPU_KERNELS"] = "portable"

from twinrun.core.portable import pin_environment  # noqa: E402 (after the default is set)

# Before torch is imported: the suite's runs share this process, and torch chooses its CPU
# kernels once (the portable mode's pinned bytes hold only with the portable kernels).
pin_environment()


# Test files that share a session fixture too costly to build on both workers: the 1-process runs
# every data-parallel test compares with (tests/distributed/conftest.py, ~30 s). Under the
# default `--dist loadfile` they form one unit of work, so one worker builds it once.
SHARED_UNITS = {
    "tests/distributed/test_invariance.py": "tests/distributed (1-process runs)",
    "tests/distributed/test_shard_base.py": "tests/distributed (1-process runs)",
}


@pytest.hookimpl(optionalhook=True)  # an xdist hook: unknown when xdist is not loaded
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile`, with the files of SHARED_UNITS as one unit (any other mode: xdist's)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedFixtureFiles(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return SHARED_UNITS.get(scope, scope)

    return SharedFixtureFiles(config, log)


@pytest.fixture(scope="session")
def toy_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real Llama-architecture HF checkpoint (4 layers, hidden 64), written by twinrun."""
    from twinrun.model.toy import write_toy_checkpoint

    out = tmp_path_factory.mktemp("toy") / "model"
    write_toy_checkpoint(out, seed=0)
    return out


@pytest.fixture
def portable() -> Iterator[None]:
    """The portable CPU kernels installed for the test (and taken back if it installed them)."""
    from twinrun.core import portable_ops

    was = portable_ops.installed()
    portable_ops.install()
    try:
        yield
    finally:
        if not was:
            portable_ops.uninstall()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`gpu` tests are skipped where no CUDA device exists. Where one does, strict mode's cuBLAS
    setting is exported up front: the tests share one process, and the first that touches CUDA
    would otherwise fix cuBLAS's workspace before a later run's strict mode could set it."""
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except Exception:  # pragma: no cover - torch is a hard dependency
        has_gpu = False
    if has_gpu:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
