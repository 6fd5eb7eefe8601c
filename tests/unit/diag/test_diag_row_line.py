"""A diag row's line is exactly what `json.dumps` writes for its object (the layout the fast
reader takes apart), whether it is built directly or through `json.dumps`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from twinrun.diag.recorder import LeafValue, StepRecord
from twinrun.diag.rows import parse_row

CHECKSUMS = [0.0, -0.0, 6318.0, 1281.8960490393586, 5e-324, 1e-300, 1.7976931348623157e308,
             0.1, 1e16, 123456789012345.0, math.nan, math.inf, -math.inf]  # fmt: skip


def row(names: list[str], phase: str = "train") -> StepRecord:
    rec = StepRecord(12, phase)
    for i, name in enumerate(names):
        rec.leaves[name] = LeafValue(CHECKSUMS[i % len(CHECKSUMS)], f"{i:064x}")
    return rec


def test_plain_rows_are_built_as_json_dumps_writes_them() -> None:
    rec = row([f"leaf.{i}" for i in range(len(CHECKSUMS))])
    line = rec.to_line()
    assert line == json.dumps(rec.to_json(), allow_nan=False)
    finite = row([f"leaf.{i}" for i in range(len(CHECKSUMS) - 3)])  # no string checksums
    parsed = parse_row(finite.to_line().encode(), Path("diag.jsonl"), 1)
    assert parsed is not None and parsed.text  # the fast reader took it
    assert parsed.step == 12 and list(parsed.checks) == list(finite.leaves)


@pytest.mark.parametrize(
    "names, phase",
    [
        (['say "hi"'], "train"),
        (["back\\slash"], "train"),
        (["é"], "train"),
        (["tab\there"], "train"),
        (["plain"], 'ev"al'),
        ([], "train"),
    ],  # fmt: skip
)
def test_other_names_go_through_json_dumps(names: list[str], phase: str) -> None:
    rec = row(names, phase)
    assert rec.to_line() == json.dumps(rec.to_json(), allow_nan=False)
