"""What an inference command's `--examples` file is: preference pairs or examples, told from its
rows by one rule (`examples_kind`), for `tune evaluate` and `extract` alike.

A row is a pair row when it has `chosen` or `rejected` (a row with only one of them is a pair
missing a side, which the pair encoder names). A file is a pairs file when every row is a pair
row, an examples file when none is; a file that mixes them is refused in one line naming a row of
each kind. Taking the kind from one row, or from any or all rows, would make one stray row turn
the whole file into the other kind, and the error would then be about the wrong rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from twinrun.core.errors import DataError
from twinrun.data.examples import SourcedRow, load_rows

Kind = Literal["pairs", "examples"]


def is_pair_row(row: SourcedRow) -> bool:
    return "chosen" in row.data or "rejected" in row.data


def examples_kind(rows: Sequence[SourcedRow]) -> Kind:
    """The kind of a file's rows: "pairs" when every row is a pair row, "examples" when none
    is; DataError for a mix, naming the first row of each kind in file order."""
    kinds = [is_pair_row(row) for row in rows]
    if not any(kinds):
        return "examples"
    if all(kinds):
        return "pairs"
    pair, other = rows[kinds.index(True)], rows[kinds.index(False)]
    first, second = (pair, other) if kinds[0] else (other, pair)
    said = {id(pair): "a preference pair (it has 'chosen' or 'rejected')", id(other): "an example"}
    raise DataError(
        f"{first.where} is {said[id(first)]} and {second.where} {said[id(second)]}: "
        "a file holds pairs or examples, not both",
        "put the pairs and the examples in separate files",
    )


def read_examples(path: str | Path) -> tuple[list[SourcedRow], Kind]:
    """The rows of an examples file, and which kind they are."""
    rows = load_rows(path)
    return rows, examples_kind(rows)
