"""Learning-rate schedule: warmup end, middle, last step exactly zero."""

from __future__ import annotations

import math

import pytest

from twinrun.core.errors import ConfigError
from twinrun.train.schedule import lr_at


def test_warmup_is_linear_and_ends_at_base() -> None:
    assert lr_at(0, 1.0, 4, 10) == 0.25
    assert lr_at(1, 1.0, 4, 10) == 0.5
    assert lr_at(3, 1.0, 4, 10) == 1.0  # warmup end


def test_cosine_starts_at_base_passes_half_and_ends_exactly_zero() -> None:
    # W=4, T=13: decay over steps 4..12, progress (s-4)/8
    assert lr_at(4, 2.0, 4, 13) == 2.0
    assert lr_at(8, 2.0, 4, 13) == pytest.approx(1.0, abs=1e-15)  # middle: cos(pi/2) = 0
    assert lr_at(6, 2.0, 4, 13) == 2.0 * 0.5 * (1 + math.cos(math.pi * 0.25))
    assert lr_at(12, 2.0, 4, 13) == 0.0  # exactly zero at the last step


def test_no_warmup_last_step_zero() -> None:
    assert lr_at(0, 0.1, 0, 5) == 0.1
    assert lr_at(4, 0.1, 0, 5) == 0.0


def test_single_remaining_step_uses_base() -> None:
    assert lr_at(0, 0.1, 0, 1) == 0.1
    assert lr_at(2, 0.1, 2, 3) == 0.1


def test_warmup_must_leave_a_step() -> None:
    with pytest.raises(ConfigError, match="warmup"):
        lr_at(0, 0.1, 5, 5)
    with pytest.raises(ValueError):
        lr_at(5, 0.1, 0, 5)
