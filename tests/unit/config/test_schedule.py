"""Learning-rate schedule: warmup end, middle, last step exactly zero."""

from __future__ import annotations

import math

import pytest

from twinrun.config.schedule import check_schedule, lr_at
from twinrun.core.errors import ConfigError


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


# wsd, W=2, T=10, D=4: warmup 0..1, stable 2..5, decay 6..9 as base * (9 - s) / 4
def test_wsd_warmup_end_stable_decay_and_last_step_zero() -> None:
    assert lr_at(1, 2.0, 2, 10, "wsd", 4) == 2.0  # warmup end: 2 * 2 / 2
    assert lr_at(0, 2.0, 2, 10, "wsd", 4) == 1.0
    assert lr_at(5, 2.0, 2, 10, "wsd", 4) == 2.0  # last stable step
    assert lr_at(6, 2.0, 2, 10, "wsd", 4) == 1.5  # first decay step: 2 * 3 / 4
    assert lr_at(7, 2.0, 2, 10, "wsd", 4) == 1.0  # mid-decay: 2 * 2 / 4
    assert lr_at(8, 2.0, 2, 10, "wsd", 4) == 0.5
    assert lr_at(9, 2.0, 2, 10, "wsd", 4) == 0.0  # exactly zero at the last step


def test_wsd_decay_may_start_right_after_warmup() -> None:
    # W=1, T=3, D=2: warmup step 0, decay 1..2 as base * (2 - s) / 2
    assert [lr_at(s, 0.5, 1, 3, "wsd", 2) for s in range(3)] == [0.5, 0.25, 0.0]


def test_constant_is_flat_after_warmup() -> None:
    assert [lr_at(s, 0.5, 2, 6, "constant") for s in range(6)] == [0.25, 0.5, 0.5, 0.5, 0.5, 0.5]
    assert lr_at(5, 0.3, 0, 6, "constant") == 0.3  # the last step is not zeroed


def test_cosine_is_the_default() -> None:
    assert [lr_at(s, 2.0, 4, 13, "cosine") for s in range(13)] == [
        lr_at(s, 2.0, 4, 13) for s in range(13)
    ]


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((2, 10, "wsd", None), "--lr-schedule wsd needs --decay-steps"),
        ((2, 10, "wsd", 0), "--decay-steps must be >= 1"),
        ((2, 10, "wsd", 9), "--warmup-steps 2 \\+ --decay-steps 9 exceed the 10-step run"),
        ((2, 10, "cosine", 3), "--decay-steps applies to --lr-schedule wsd, not cosine"),
        ((2, 10, "step", None), "--lr-schedule must be one of cosine, wsd, constant, linear"),
    ],
)
def test_bad_schedules_are_one_line_errors(args: tuple, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        check_schedule(*args)


def test_linear_is_transformers_linear_after_warmup() -> None:
    """transformers' get_linear_schedule_with_warmup after warmup: (T - s) / (T - W) of base,
    base / (T - W) at the last step. Hand-computed: base 2, W 2, T 6."""
    got = [lr_at(s, 2.0, 2, 6, "linear") for s in range(6)]
    assert got == [1.0, 2.0, 2.0, 1.5, 1.0, 0.5]
    assert [lr_at(s, 1.0, 0, 4, "linear") for s in range(4)] == [1.0, 0.75, 0.5, 0.25]
