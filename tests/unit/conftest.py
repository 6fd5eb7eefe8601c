"""Fixtures the unit tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from twinrun.core import portable_ops


@pytest.fixture
def portable() -> Iterator[None]:
    """The portable CPU kernels installed for the test (and taken back if it installed them)."""
    was = portable_ops.installed()
    portable_ops.install()
    try:
        yield
    finally:
        if not was:
            portable_ops.uninstall()
