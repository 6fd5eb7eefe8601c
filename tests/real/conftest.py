"""Fixtures of the real-model tests: SmolLM2-135M-Instruct (built once into a cache outside the
repository, see testkit/smollm2.py) and tiny random checkpoints of other architectures."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.smollm2 import ensure_smollm2
from tests.real.tiny_archs import write_tiny_checkpoint


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as a safetensors checkpoint (cached; about 20 s the first time)."""
    return ensure_smollm2()


@pytest.fixture(scope="session")
def tiny_arch_dir(
    tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path
) -> Callable[[str], Path]:
    """`tiny_arch_dir(arch)`: the tiny checkpoint of `arch`, written once per session."""
    root = tmp_path_factory.mktemp("tiny_archs")
    built: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in built:
            built[arch] = write_tiny_checkpoint(arch, root / arch, smollm2_dir)
        return built[arch]

    return get
