"""GRPO advantages and the token cap against hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from twinrun.core.errors import ConfigError
from twinrun.rl.advantages import (
    apply_token_cap,
    batch_normalise,
    clip_advantages,
    compute_advantages,
    group_advantages,
)

F64 = torch.float64


def t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=F64)


def test_group_uses_population_std() -> None:
    # [0, 1]: mean 0.5, population std 0.5 -> -1, +1 (sample std would give +-0.7071)
    assert group_advantages(t([[0.0, 1.0]]), eps=0.0).tolist() == [[-1.0, 1.0]]
    # [0, 1, 2]: mean 1, population variance 2/3
    s = math.sqrt(2.0 / 3.0)
    assert group_advantages(t([[0.0, 1.0, 2.0]]), eps=0.0).tolist() == [[-1.0 / s, 0.0, 1.0 / s]]


def test_group_eps_in_denominator() -> None:
    adv = group_advantages(t([[1.0, 0.0, 0.0, 1.0]]), eps=1e-6)
    a = 0.5 / (0.5 + 1e-6)
    assert adv.tolist() == [[a, -a, -a, a]]
    assert adv.dtype == F64


def test_all_equal_group_is_exactly_zero() -> None:
    adv = group_advantages(t([[0.1, 0.1, 0.1], [1.0, 0.0, 0.0]]))
    assert adv[0].tolist() == [0.0, 0.0, 0.0]
    assert adv[1].abs().sum().item() > 0


def test_batch_normalise_hand_computed() -> None:
    # values 1, -1, 0, 0: mean 0, population std sqrt(2/4)
    s = math.sqrt(0.5)
    out = batch_normalise(t([[1.0, -1.0], [0.0, 0.0]]), eps=0.0)
    assert out.tolist() == [[1.0 / s, -1.0 / s], [0.0, 0.0]]
    # all zeros stay zeros (no 0/0)
    assert batch_normalise(torch.zeros(2, 3, dtype=F64)).tolist() == [[0.0] * 3] * 2


def test_clip() -> None:
    assert clip_advantages(torch.tensor([-7.0, 0.5, 7.0], dtype=F64), 5.0).tolist() == [-5, 0.5, 5]
    with pytest.raises(ConfigError):
        clip_advantages(torch.zeros(1, dtype=F64), 0.0)


def test_compute_advantages_pipeline() -> None:
    rewards = t([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    # group (eps 0): [[1,-1,-1,1],[0,0,0,0]]; batch: mean 0, std sqrt(4/8) -> +-1.41421...
    adv, zero_frac = compute_advantages(rewards, clip=10.0, eps=0.0)
    s = 1.0 / math.sqrt(0.5)
    assert adv.tolist() == [[s, -s, -s, s], [0.0] * 4]
    assert zero_frac == 0.5
    clipped, _ = compute_advantages(rewards, clip=1.2, eps=0.0)
    assert clipped.tolist() == [[1.2, -1.2, -1.2, 1.2], [0.0] * 4]


def test_compute_advantages_no_signal() -> None:
    adv, zero_frac = compute_advantages(t([[1.0, 1.0], [0.0, 0.0]]), clip=5.0)
    assert adv.tolist() == [[0.0, 0.0], [0.0, 0.0]] and zero_frac == 1.0


def test_advantages_independent_of_group_order() -> None:
    g = torch.Generator().manual_seed(0)
    rewards = torch.rand(6, 5, generator=g, dtype=F64)
    perm = [3, 0, 5, 1, 4, 2]
    adv, _ = compute_advantages(rewards, clip=5.0)
    adv_perm, _ = compute_advantages(rewards[perm], clip=5.0)
    assert torch.equal(adv[perm], adv_perm)  # bitwise: fsum is order-independent


def test_rewards_validated() -> None:
    with pytest.raises(TypeError):
        group_advantages(torch.zeros(2, 2))  # float32
    with pytest.raises(ValueError):
        group_advantages(t([[float("nan"), 1.0]]))
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(4, dtype=F64))


def test_token_cap_keeps_first_tokens() -> None:
    mask = torch.tensor(
        [[0, 1, 1, 1, 1], [0, 0, 1, 0, 1], [0, 0, 0, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.bool
    )
    kept, counts, denom = apply_token_cap(mask, 2)
    assert kept.tolist() == [
        [False, True, True, False, False],
        [False, False, True, False, True],
        [False] * 5,
        [True, False, False, False, False],
    ]
    assert counts.tolist() == [2, 2, 0, 1] and counts.dtype == torch.int64
    assert denom == 5


def test_token_cap_large_cap_and_empty_batch() -> None:
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]], dtype=torch.bool)
    kept, counts, denom = apply_token_cap(mask, 100)
    assert torch.equal(kept, mask) and counts.tolist() == [2, 2] and denom == 4
    _, counts, denom = apply_token_cap(torch.zeros(2, 3, dtype=torch.bool), 4)
    assert counts.tolist() == [0, 0] and denom == 1
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigError):
            apply_token_cap(mask, bad)  # type: ignore[arg-type]
