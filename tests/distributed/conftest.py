"""The 1-process runs every data-parallel test compares with, built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.distributed.runs import OneProcess, one_process_runs


@pytest.fixture(scope="session")
def one_process(tmp_path_factory: pytest.TempPathFactory, toy_model_dir: Path) -> OneProcess:
    return one_process_runs(tmp_path_factory.mktemp("dist"), toy_model_dir)
