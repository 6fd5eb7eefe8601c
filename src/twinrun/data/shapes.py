"""Every row of a run's data checked as its objective will read it, without a tokenizer.

The command line calls `check_shapes` before torch loads, so a row of the wrong kind (a pair in an
SFT file, a `{text}` row, a message without a role) is refused in a second, naming the row, rather
than after the model's libraries have loaded. The checks are the encoders' own: an SFT row through
`sft_row_text`, a pair through `pair_parts`, a GRPO prompt through `conversational_prompt`; the
encoders call the same functions again on the rows they tokenize.
"""

from __future__ import annotations

from collections.abc import Iterable

from twinrun.data.examples import SourcedRow, conversational_prompt, sft_row_text
from twinrun.data.pairs import pair_parts


def check_shapes(data: str, rows: Iterable[SourcedRow], chat_template: bool) -> None:
    """DataError naming the first row of `rows` that the objective's data kind `data`
    ("examples", "pairs" or "environment", as objectives/registry.py names them) cannot read."""
    for row in rows:
        if data == "pairs":
            pair_parts(row)
        elif data == "environment":
            conversational_prompt(row, chat_template)
        else:
            sft_row_text(row, chat_template)
