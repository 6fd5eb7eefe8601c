"""Deterministic prioritized replay: probabilities, weights, descent and tree determinism."""

from __future__ import annotations

import math
import struct

import pytest

from twinrun.core.rng import stream
from twinrun.rl.prioritized import PrioritizedReplay, SumTree


def bits(x: float) -> bytes:
    return struct.pack("<d", x)


def buffer(advs: list[float], alpha: float, beta: float, eps: float = 0.0) -> PrioritizedReplay:
    buf: PrioritizedReplay[str] = PrioritizedReplay(8, alpha, beta, priority_eps=eps)
    for i, a in enumerate(advs):
        buf.add(f"item{i}", a)
    return buf


def test_probabilities_alpha_one() -> None:
    buf = buffer([1.0, -2.0, 3.0, -4.0], alpha=1.0, beta=1.0)
    assert buf.probabilities() == pytest.approx([0.1, 0.2, 0.3, 0.4], abs=1e-16)
    assert buf.tree.total == 10.0


def test_probabilities_alpha_half() -> None:
    buf = buffer([1.0, 2.0, 3.0, 4.0], alpha=0.5, beta=1.0)
    # p = [1, sqrt2, sqrt3, 2]; total = 3 + sqrt2 + sqrt3 = 6.146264369941973
    total = 3.0 + math.sqrt(2.0) + math.sqrt(3.0)
    hand = [1 / total, math.sqrt(2.0) / total, math.sqrt(3.0) / total, 2 / total]
    assert buf.probabilities() == pytest.approx(hand, rel=1e-15)
    assert buf.probabilities() == pytest.approx([0.16270, 0.23009, 0.28180, 0.32540], abs=1e-5)


def test_alpha_zero_is_uniform_and_eps_gives_zero_advantages_a_chance() -> None:
    assert buffer([0.0, 5.0], alpha=0.0, beta=1.0).probabilities() == [0.5, 0.5]
    probs = buffer([0.0, 1.0], alpha=1.0, beta=1.0, eps=1e-6).probabilities()
    assert probs[0] == pytest.approx(1e-6 / (1 + 2e-6)) and probs[0] > 0


def test_weights_by_hand() -> None:
    buf = buffer([1.0, 2.0, 3.0, 4.0], alpha=1.0, beta=1.0)
    # w_i = (N P_i)^-beta / max_j (N P_j)^-beta = p_min / p_i with beta = 1
    assert [buf.weight(s) for s in range(4)] == pytest.approx([1.0, 0.5, 1 / 3, 0.25], rel=1e-15)
    buf = buffer([1.0, 2.0, 3.0, 4.0], alpha=1.0, beta=0.5)
    hand = [
        (4 * 0.1) ** -0.5 / (4 * 0.1) ** -0.5,
        (4 * 0.2) ** -0.5 / (4 * 0.1) ** -0.5,
        (4 * 0.3) ** -0.5 / (4 * 0.1) ** -0.5,
        (4 * 0.4) ** -0.5 / (4 * 0.1) ** -0.5,
    ]
    assert [buf.weight(s) for s in range(4)] == pytest.approx(hand, rel=1e-14)
    assert hand == pytest.approx([1.0, 0.70711, 0.57735, 0.5], abs=1e-5)
    # beta 0: no correction
    assert [buffer([1.0, 3.0], 1.0, 0.0).weight(s) for s in range(2)] == [1.0, 1.0]


def test_weights_normalised_over_buffer_not_sample() -> None:
    buf = buffer([1.0, 2.0, 3.0, 4.0], alpha=1.0, beta=1.0)
    drawn = buf.sample(1, lambda i: 0.95)  # slot 3 only: its weight is still p_min / p_3
    assert [(s, w) for s, _, w in drawn] == [(3, 0.25)]


def test_descent_boundaries() -> None:
    buf = buffer([1.0, 2.0, 1.0, 4.0], alpha=1.0, beta=1.0)  # total 8, prefix 0 1 3 4 8
    cases = {
        0.0: 0,
        0.124: 0,
        0.125: 1,
        0.374: 1,
        0.375: 2,
        0.4999: 2,
        0.5: 3,
        1.0 - 2.0**-53: 3,
    }
    us = list(cases)
    drawn = buf.sample(len(us), lambda i: us[i])
    assert [s for s, _, _ in drawn] == list(cases.values())
    assert [item for _, item, _ in drawn] == [f"item{s}" for s in cases.values()]
    with pytest.raises(ValueError):
        buf.sample(1, lambda i: 1.0)


def test_descent_skips_zero_priority_and_empty_slots() -> None:
    tree = SumTree(5)  # size 8: slots 5..7 are padding with priority 0
    for slot, p in enumerate([0.0, 2.0, 0.0, 1.0, 0.0]):
        tree.set(slot, p)
    assert [tree.find(x) for x in (0.0, 1.999, 2.0, 2.999)] == [1, 1, 3, 3]
    assert tree.find(3.0) == 3 and tree.find(1e9) == 3  # at/past the total: last positive leaf


def test_ring_overwrites_oldest() -> None:
    buf: PrioritizedReplay[str] = PrioritizedReplay(3, 1.0, 1.0, priority_eps=0.0)
    assert [buf.add(x, a) for x, a in [("a", 1), ("b", 2), ("c", 3)]] == [0, 1, 2]
    assert buf.add("d", 4) == 0 and buf.add("e", 5) == 1
    assert len(buf) == 3 and [buf.item(s) for s in range(3)] == ["d", "e", "c"]
    assert buf.probabilities() == pytest.approx([4 / 12, 5 / 12, 3 / 12], rel=1e-15)
    assert buf.tree.total == 12.0


def test_update_reprioritises() -> None:
    buf = buffer([1.0, 1.0], alpha=1.0, beta=1.0)
    buf.update(1, 3.0)
    assert buf.probabilities() == [0.25, 0.75]
    with pytest.raises(IndexError):
        buf.update(5, 1.0)


def test_tree_total_independent_of_update_order() -> None:
    values = [0.1 * (i + 1) ** 1.7 + 1e-3 / (i + 3) for i in range(13)]
    a, b, c = SumTree(13), SumTree(13), SumTree(13)
    for s in range(13):
        a.set(s, values[s])
    for s in reversed(range(13)):
        b.set(s, values[s])
    for s in [7, 2, 11, 0, 5, 12, 9, 1, 4, 10, 3, 8, 6]:
        c.set(s, 123.456 * s + 1.0)  # a different history first
    for s in [3, 12, 0, 8, 1, 6, 10, 5, 2, 9, 11, 4, 7]:
        c.set(s, values[s])
    assert bits(a.total) == bits(b.total) == bits(c.total)
    assert a._nodes == b._nodes == c._nodes


def test_state_dict_roundtrip_is_bitwise() -> None:
    buf = buffer([0.3, 1.7, 2.9, 0.01, 5.5], alpha=0.6, beta=0.4, eps=1e-6)
    back = PrioritizedReplay.from_state_dict(buf.state_dict())
    assert back.tree._nodes == buf.tree._nodes and back.add("x", 1.0) == buf.add("x", 1.0)


def test_sampling_with_streams_is_reproducible() -> None:
    def run(seed: int) -> list[tuple[int, str, float]]:
        buf = buffer([0.5, 1.5, 0.2, 3.0, 2.2, 0.9], alpha=0.6, beta=0.4, eps=1e-6)
        return buf.sample(16, lambda i: stream(seed, "replay", 3, i).uniform())

    first, again, other = run(11), run(11), run(12)
    assert first == again
    assert [bits(w) for *_, w in first] == [bits(w) for *_, w in again]
    assert [s for s, *_ in first] != [s for s, *_ in other]
    # a draw depends only on its own key: a prefix of draws is the same
    buf = buffer([0.5, 1.5, 0.2, 3.0, 2.2, 0.9], alpha=0.6, beta=0.4, eps=1e-6)
    assert buf.sample(4, lambda i: stream(11, "replay", 3, i).uniform()) == first[:4]


def test_empty_and_bad_arguments() -> None:
    buf: PrioritizedReplay[str] = PrioritizedReplay(4, 1.0, 1.0)
    assert buf.sample(0, lambda i: 0.0) == []
    with pytest.raises(ValueError):
        buf.sample(1, lambda i: 0.0)
    with pytest.raises(ValueError):
        PrioritizedReplay(4, -1.0, 1.0)
    with pytest.raises(ValueError):
        SumTree(0)
    with pytest.raises(ValueError):
        buf.add("x", float("nan"))
