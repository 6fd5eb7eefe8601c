"""A seeded, bounded hostile-input sweep over every parser of a user-supplied file (examples,
TOML, manifests, payloads, diag rows and files, inputs records, evidence and harness metrics
rows, model config, trainer state): each input gives a result or one twinrun error line, never
an internal error. The full sweep is `python bench/hostile_sweep.py`."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testkit.hostile import HOSTILE, PARSERS, mutate, outcome, seeds

SEEDS = seeds()
BOUNDED = settings(
    max_examples=60,
    derandomize=True,  # seeded: the same inputs on every run
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
OPS = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 1 << 16), st.integers(0, 1 << 16)), max_size=6
)


@pytest.mark.parametrize("parser", sorted(PARSERS))
def test_every_hostile_snippet_is_refused_or_parsed(parser: str) -> None:
    for data in HOSTILE:
        result = outcome(parser, data)
        assert not result.startswith("internal"), (parser, data[:80], result)


@pytest.mark.parametrize("parser", sorted(PARSERS))
@BOUNDED
@given(ops=OPS, which=st.integers(0, 10))
def test_mutated_valid_inputs(parser: str, ops: list[tuple[int, int, int]], which: int) -> None:
    base = SEEDS[parser][which % len(SEEDS[parser])]
    result = outcome(parser, mutate(base, ops))
    assert not result.startswith("internal"), result


@pytest.mark.parametrize("parser", ["examples", "manifest", "diag_row", "toml"])
@BOUNDED
@given(data=st.binary(max_size=512))
def test_random_bytes(parser: str, data: bytes) -> None:
    result = outcome(parser, data)
    assert not result.startswith("internal"), result


def test_seeds_are_accepted_where_they_are_valid() -> None:
    """The sweep starts from real inputs: the valid seeds parse (else it would test nothing
    but the first refusal)."""
    for parser in ("examples", "diag_row", "diag_file", "evidence_rows", "harness_rows"):
        assert outcome(parser, SEEDS[parser][0]) == "ok", parser
