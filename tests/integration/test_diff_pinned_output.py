"""`twinrun diff` prints exactly what it printed when its output was pinned: text and --json,
stderr and exit code, for a drifting pair, edge cases and every kind of malformed row
(cases in tests/integration/diff_cases.py, outputs in diff_outputs.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.diff_cases import PINNED, run_all


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    return run_all(tmp_path_factory.mktemp("diff-pinned"))


PINNED_CASES: dict[str, dict] = json.loads(PINNED.read_text())


def test_every_case_is_pinned(outputs: dict[str, dict]) -> None:
    assert sorted(outputs) == sorted(PINNED_CASES)


@pytest.mark.parametrize("name", sorted(PINNED_CASES))
def test_output_is_unchanged(outputs: dict[str, dict], name: str) -> None:
    assert outputs[name] == PINNED_CASES[name]


def test_the_pins_cover_each_outcome() -> None:
    """The pinned set holds divergences, agreements and errors, in text and JSON."""
    rcs = {c["rc"] for c in PINNED_CASES.values()}
    assert rcs == {0, 1, 2}
    assert any(c["stdout"].startswith("{") for c in PINNED_CASES.values())
    more = [c for c in PINNED_CASES.values() if "more rows (--json lists them all)" in c["stdout"]]
    assert more, "a case with a table longer than the text shows"
    assert all(c["stdout"] == "" for c in PINNED_CASES.values() if c["rc"] == 2)
    assert Path(PINNED).stat().st_size > 10_000
