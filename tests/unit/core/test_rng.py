"""Tests for twinrun.core.rng: SplitMix64 reference vectors, keyed-stream properties, derived draws
and pinned outputs (so any change to key derivation or draw order fails here)."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest

from twinrun.core import rng
from twinrun.core.rng import (
    GAMMA,
    MASK64,
    SplitMix64,
    Stream,
    check_seed,
    extend_key,
    first_draws,
    float_bits,
    mix64,
    stream,
    stream_key,
)

# SplitMix64 reference vectors (first four outputs).
REFERENCE_VECTORS = {
    0: ["e220a8397b1dcdaf", "6e789e6aa1b965f4", "06c45d188009454f", "f88bb8a8724c81ec"],
    1: ["910a2dec89025cc1", "beeb8da1658eec67", "f893a2eefb32555e", "71c18690ee42c90b"],
    42: ["bdd732262feb6e95", "28efe333b266f103", "47526757130f9f52", "581ce1ff0e4ae394"],
}


def _draws(s: Stream, n: int) -> list[int]:
    return [s.next_u64() for _ in range(n)]


# -- SplitMix64 --------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", sorted(REFERENCE_VECTORS))
def test_splitmix64_reference_vectors(seed: int) -> None:
    g = SplitMix64(seed)
    assert [f"{g.next_u64():016x}" for _ in range(4)] == REFERENCE_VECTORS[seed]


@pytest.mark.parametrize("seed", sorted(REFERENCE_VECTORS))
def test_stream_at_raw_key_is_splitmix64(seed: int) -> None:
    """A Stream keyed by k is exactly the SplitMix64 sequence seeded with k (scalar and array)."""
    expected = [int(h, 16) for h in REFERENCE_VECTORS[seed]]
    assert _draws(Stream(seed), 4) == expected
    assert [int(x) for x in Stream(seed).u64_array(4)] == expected


def test_mix64_masks_input() -> None:
    assert mix64(1 << 64) == mix64(0)
    assert 0 <= mix64(MASK64) <= MASK64


# -- stream properties -------------------------------------------------------------------------


def test_same_key_same_draws() -> None:
    a = stream(5, "sample", 3, 1, 0, 7)
    b = stream(5, "sample", 3, 1, 0, 7)
    assert a.key == b.key
    assert _draws(a, 16) == _draws(b, 16)


@pytest.mark.parametrize(
    "other",
    [
        (6, "shuffle", 0),  # seed
        (5, "shufflf", 0),  # purpose
        (5, "shuffle", 1),  # index value
        (5, "shuffle", "0"),  # index type (int vs str)
        (5, "shuffle"),  # fewer indices
        (5, "shuffle", 0, 0),  # more indices
    ],
)
def test_different_key_different_draws(other: tuple) -> None:
    base = stream(5, "shuffle", 0)
    s = stream(*other)
    assert s.key != base.key
    assert _draws(s, 8) != _draws(base, 8)


def test_key_parts_are_framed() -> None:
    """Concatenating/splitting strings must not collide: ("ab",) vs ("a", "b")."""
    assert stream_key(0, "ab") != stream_key(0, "a", "b")
    assert stream_key(0, "x", "") != stream_key(0, "x")
    assert stream_key(0, "a\0") != stream_key(0, "a")
    assert stream_key(0, "x", "é") != stream_key(0, "x", "e")


def test_interleaved_purposes_do_not_shift_each_other() -> None:
    alone_a = _draws(stream(9, "shuffle", 2), 10)
    alone_b = _draws(stream(9, "sample", 2, 0), 10)
    a, b = stream(9, "shuffle", 2), stream(9, "sample", 2, 0)
    got_a: list[int] = []
    got_b: list[int] = []
    # an irregular interleaving, scalar and block draws mixed
    for who in "abbaabbbaaabababaa":
        if who == "a":
            got_a.append(a.next_u64())
        else:
            got_b.append(b.next_u64())
    got_b.extend(int(u) for u in b.u64_array(10 - len(got_b)))
    assert got_a == alone_a
    assert got_b == alone_b


def test_u64_array_equals_scalar_draws_and_continues_position() -> None:
    s1 = stream(1, "block")
    s2 = stream(1, "block")
    first = s1.u64_array(5)
    assert first.dtype == np.uint64
    assert [int(x) for x in first] == _draws(s2, 5)
    assert s1.position == s2.position == 5
    # continues: a scalar after the array, an array after scalars
    assert s1.next_u64() == s2.next_u64()
    assert [int(x) for x in s2.u64_array(7)] == _draws(s1, 7)
    assert s1.position == s2.position == 13


def test_an_extended_key_is_the_key_of_all_its_parts() -> None:
    module = "model.layers.0.self_attn.q_proj"
    prefix = stream_key(3, "lora_dropout", 7, module)
    assert extend_key(prefix, 5, "x") == stream_key(3, "lora_dropout", 7, module, 5, "x")
    assert extend_key(prefix) == prefix
    assert extend_key(prefix, 5) != extend_key(prefix, 6)


def test_first_draws_are_each_stream_s_draws() -> None:
    keys = [stream_key(1, "rows", i) for i in range(3)]
    block = first_draws(keys, 6)
    assert block.shape == (3, 6) and block.dtype == np.uint64
    assert [[int(u) for u in row] for row in block] == [_draws(Stream(k), 6) for k in keys]


def test_position_is_random_access() -> None:
    """Draw i depends only on (key, i): a stream restarted at a position continues exactly."""
    s = stream(4, "resume")
    draws = _draws(s, 20)
    resumed = Stream(stream_key(4, "resume"), position=12)
    assert _draws(resumed, 8) == draws[12:]
    assert [int(x) for x in Stream(s.key, position=3).u64_array(4)] == draws[3:7]


def test_stream_label() -> None:
    assert stream(0, "sample", 3, "k").label == "sample/3/k"


# -- derived draws -----------------------------------------------------------------------------


def test_uniform_is_top_53_bits() -> None:
    s1, s2 = stream(2, "u"), stream(2, "u")
    for _ in range(50):
        u = s2.next_u64()
        x = s1.uniform()
        assert x == (u >> 11) * 2.0**-53
        assert 0.0 <= x < 1.0


def test_uniform_extremes(monkeypatch: pytest.MonkeyPatch) -> None:
    s = stream(0, "u")
    monkeypatch.setattr(s, "next_u64", lambda: MASK64)
    assert s.uniform() == 1.0 - 2.0**-53 < 1.0
    monkeypatch.setattr(s, "next_u64", lambda: 0)
    assert s.uniform() == 0.0


def test_uniform_array_matches_scalar() -> None:
    arr = stream(2, "u").uniform_array(64)
    s = stream(2, "u")
    assert arr.dtype == np.float64
    assert arr.tolist() == [s.uniform() for _ in range(64)]
    assert float(arr.min()) >= 0.0 and float(arr.max()) < 1.0


def test_integers_in_range() -> None:
    s = stream(3, "int")
    values = [s.integers(-5, 7) for _ in range(2000)]
    assert min(values) == -5 and max(values) == 6
    assert stream(3, "int").integers(10, 11) == 10


@pytest.mark.parametrize("low,high", [(0, 0), (5, 4)])
def test_integers_empty_range(low: int, high: int) -> None:
    with pytest.raises(ValueError):
        stream(0, "int").integers(low, high)


def test_integers_unbiased_six_buckets() -> None:
    n, k = 60_000, 6
    s = stream(123, "dice")
    counts = np.bincount([s.integers(0, k) for _ in range(n)], minlength=k)
    expected = n / k
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    # 5 degrees of freedom: P(chi2 > 30) ~ 1.5e-5; the draws are pinned, so this is not flaky.
    assert chi2 < 30.0, counts


def test_integers_rejection_is_real() -> None:
    """For n = 2**63 + 1 the accepted range is [0, 2**63 + 1): about half of draws are rejected."""
    n = 2**63 + 1
    limit = (1 << 64) - ((1 << 64) % n)
    assert limit == 2**63 + 1
    s = stream(8, "big")
    raw = Stream(s.key)
    calls = 200
    for _ in range(calls):
        before = s.position
        x = s.integers(0, n)
        assert 0 <= x < n
        # every draw consumed but the last was rejected (>= limit); the last was accepted
        consumed = [raw.next_u64() for _ in range(s.position - before)]
        assert all(u >= limit for u in consumed[:-1])
        assert consumed[-1] < limit and x == consumed[-1] % n
    assert s.position > calls  # some rejection happened (expected ~2x)


def test_integers_rejects_forced_high_draw(monkeypatch: pytest.MonkeyPatch) -> None:
    s = stream(0, "big")
    seq = iter([MASK64, 2**63 + 1, 12345])
    monkeypatch.setattr(s, "next_u64", lambda: next(seq))
    assert s.integers(10, 10 + 2**63 + 1) == 10 + 12345
    with pytest.raises(StopIteration):  # both high draws were consumed, then the accepted one
        next(seq)


def test_integers_small_range_uses_modulo() -> None:
    s1, s2 = stream(4, "mod"), stream(4, "mod")
    for _ in range(100):
        # 7 does not divide 2**64, but the rejected tail (2**64 % 7 values) is ~never hit
        assert s1.integers(0, 7) == s2.next_u64() % 7
    assert s1.position == s2.position


def test_permutation_is_permutation() -> None:
    for n in (0, 1, 2, 5, 33):
        p = stream(7, "perm", n).permutation(n)
        assert sorted(p) == list(range(n))
    assert stream(7, "perm").permutation(50) != list(range(50))


def test_permutation_pinned() -> None:
    assert stream(7, "shuffle", 0).permutation(8) == [4, 1, 7, 5, 0, 3, 6, 2]


def test_permutation_roughly_uniform() -> None:
    """Each of the 6 permutations of 3 items appears about equally often."""
    counts: dict[tuple[int, ...], int] = {}
    for epoch in range(6000):
        p = tuple(stream(1, "shuffle", epoch).permutation(3))
        counts[p] = counts.get(p, 0) + 1
    assert len(counts) == 6
    assert all(800 < c < 1200 for c in counts.values()), counts


def test_choice_weighted() -> None:
    s = stream(5, "per")
    draws = [s.choice_weighted([0.0, 1.0, 3.0]) for _ in range(4000)]
    assert 0 not in draws
    share = draws.count(2) / len(draws)
    assert 0.70 < share < 0.80
    with pytest.raises(ValueError):
        stream(5, "per").choice_weighted([0.0, 0.0])


@pytest.mark.parametrize("fan_in", [1, 4, 64, 1000])
def test_kaiming_uniform_bound(fan_in: int) -> None:
    w = stream(3, "lora_A", fan_in).kaiming_uniform((16, fan_in))
    bound = math.sqrt(1.0 / fan_in)
    # with a = sqrt(5): sqrt(6 / ((1 + 5) fan_in)) == sqrt(1 / fan_in)
    assert math.sqrt(6.0 / ((1.0 + math.sqrt(5.0) ** 2) * fan_in)) == pytest.approx(bound)
    assert w.shape == (16, fan_in) and w.dtype == np.float64
    assert float(np.abs(w).max()) <= bound
    assert float(w.min()) >= -bound and float(w.max()) < bound


def test_kaiming_uniform_is_scaled_uniform() -> None:
    fan_in = 4
    w = stream(3, "k").kaiming_uniform((2, fan_in))
    u = stream(3, "k").uniform_array(8)
    bound = math.sqrt(6.0 / ((1.0 + math.sqrt(5.0) ** 2) * fan_in))
    assert w.ravel().tolist() == ((2.0 * u - 1.0) * bound).tolist()


def test_torch_seed_is_63_bit() -> None:
    s1, s2 = stream(0, "torch"), stream(0, "torch")
    seed = s1.torch_seed()
    assert seed == s2.next_u64() >> 1
    assert 0 <= seed < 2**63


# -- pinned outputs (any change to key derivation or draw order fails these) -------------------


def test_pinned_stream_key_and_draw() -> None:
    assert f"{stream_key(0, 'x'):016x}" == "caf60ac4a9027519"
    assert f"{stream(0, 'x').next_u64():016x}" == "c75fc129991edf78"
    assert [f"{int(u):016x}" for u in stream(42, "sample", 3, 1, 0, 5).u64_array(3)] == [
        "ae63850b1563a532",
        "1c5b3f8dd31404f5",
        "4f82e3e96b333248",
    ]


def test_pinned_kaiming_uniform_bits() -> None:
    w = stream(3, "lora_A", "model.layers.0.self_attn.q_proj").kaiming_uniform((2, 4))
    assert [float_bits(float(v)) for v in w.ravel()] == [
        "3fdf40fa374debd3",
        "bfce65745dcddbef",
        "3fb6186d6ad550f7",
        "bfd962914cfc5f25",
        "bf9d28eeca06cddf",
        "bfd9bf6a4f3943ed",
        "3fb222066274b74f",
        "bfd06155a403210d",
    ]


def test_float_bits() -> None:
    assert float_bits(1.0) == "3ff0000000000000"
    assert float_bits(-0.0) == "8000000000000000"
    assert float_bits(0.1) == struct.pack(">d", 0.1).hex()


# -- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [-1, 2**63, 2**64, True, False, 1.0, "1", None])
def test_bad_seed(seed: object) -> None:
    with pytest.raises(ValueError):
        check_seed(seed)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        stream(seed, "x")  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", [0, 1, 2**63 - 1])
def test_good_seed(seed: int) -> None:
    check_seed(seed)
    assert 0 <= stream_key(seed, "x") <= MASK64


@pytest.mark.parametrize("part", [1.0, True, None, b"x", (1,)])
def test_key_parts_must_be_int_or_str(part: object) -> None:
    with pytest.raises(TypeError):
        stream(0, "x", part)  # type: ignore[arg-type]


@pytest.mark.parametrize("part", [2**64, -(2**63) - 1])
def test_int_key_part_out_of_range(part: int) -> None:
    with pytest.raises(ValueError):
        stream(0, "x", part)


def test_gamma_constant() -> None:
    assert GAMMA == 0x9E3779B97F4A7C15
    assert rng.MAX_SEED == 2**63


def test_int_key_parts_do_not_alias() -> None:
    # negative indices are refused, so n and n + 2**64 cannot name the same stream
    with pytest.raises(ValueError):
        stream_key(0, "x", -1)
    assert stream_key(0, "x", 2**64 - 1) != stream_key(0, "x", 0)
