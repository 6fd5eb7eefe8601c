"""A training run's data as its files hold it, read once, before torch loads.

`read_data(run)` reads what the run's objective trains on (its registry record's `data`): the
`--examples` rows (SFT rows, preference pairs, GRPO's prompts), every row's shape checked as the
objective reads it (`data.shapes`), or the text corpus (`--corpus`); `read_eval(run)` the
`--eval-examples` rows the run evaluates on. The input checks read both
(`preflight.check_data`), and the session receives what they read: nothing is read twice, and
what is trained and evaluated on is what was checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from twinrun.config.resolved import Evaluation, Examples, TextWindows, ValidRun
from twinrun.data.corpus import read_corpus
from twinrun.data.examples import SourcedRow, examples_sha256, load_rows
from twinrun.data.shapes import check_shapes
from twinrun.objectives.registry import objective


@dataclass(frozen=True)
class EvalData:
    """The `--eval-examples` rows the run evaluates on (cut to `--eval-limit`), the SHA256 of the
    file, and whether the rows go through the chat template (as the run's examples do)."""

    rows: list[SourcedRow]
    sha256: str
    templated: bool


@dataclass(frozen=True)
class RawData:
    """A run's data as its files hold it, before any tokenizer: the rows (a corpus's texts for
    `tune text`) and the SHA256 of what was read, and the evaluation rows when it has them."""

    items: Any
    sha256: str
    eval: EvalData | None = None

    @property
    def eval_sha256(self) -> str | None:
        return self.eval.sha256 if self.eval is not None else None


def read_data(run: ValidRun) -> RawData:
    """The data `run` trains on, read and shape-checked: a DataError naming the file (and row)
    that cannot be used."""
    if run.has(TextWindows):
        return RawData(*read_corpus(list(run.record(TextWindows).corpus)))
    examples = run.record(Examples)
    rows = load_rows(examples.examples)
    check_shapes(objective(run.objective).data, rows, examples.templated)
    return RawData(rows, examples_sha256(examples.examples))


def read_eval(run: ValidRun) -> EvalData | None:
    """The `--eval-examples` rows, cut to `--eval-limit` and shape-checked as SFT rows (the run's
    chat template decides which shape): a DataError naming the file and row otherwise."""
    if not run.has(Evaluation):
        return None
    path = run.record(Evaluation).eval_examples
    templated = run.has(Examples) and run.record(Examples).templated
    rows = load_rows(path)[: run.switches.eval_limit]
    check_shapes("examples", rows, templated)
    return EvalData(rows, examples_sha256(path), templated)
