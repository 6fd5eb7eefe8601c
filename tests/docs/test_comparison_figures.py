"""No figure in docs/comparison.md was typed by hand: on every line that cites a
`bench/results/NAME.md`, each bold figure (`**...**`) occurs in that file, as the benchmark script
wrote it. When a benchmark is re-run and its figures move, this test says which line to update."""

from __future__ import annotations

import re
from pathlib import Path

from .conftest import REPO

PAGE = REPO / "docs" / "comparison.md"
CITED = re.compile(r"bench/results/[\w.-]+\.md")
BOLD = re.compile(r"\*\*(.+?)\*\*")


def unsupported(text: str, root: Path) -> list[str]:
    """(line, figure, file) for every bold figure not found in a file its paragraph cites."""
    problems = []
    for block in re.split(r"\n\s*\n", text):
        files = CITED.findall(block)
        figures = [b for b in BOLD.findall(block) if re.search(r"\d", b)]
        if figures and not files:
            problems += [f"{f!r}: cites no bench/results file" for f in figures]
            continue
        sources = [(root / f).read_text(encoding="utf-8") for f in files if (root / f).exists()]
        for figure in figures:
            if not any(figure in source for source in sources):
                problems.append(f"{figure!r} is not in {files}")
    return problems


def test_every_figure_is_in_the_results_it_cites() -> None:
    problems = unsupported(PAGE.read_text(encoding="utf-8"), REPO)
    assert not problems, "\n".join(problems)


def test_the_check_finds_a_typed_number(tmp_path: Path) -> None:
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench/results/x.md").write_text("| ratio | **1.35×** |\n")
    text = (
        "Fast: **1.35×** (`bench/results/x.md`).\n\n"
        "Faster: **2.00×** (`bench/results/x.md`).\n\n"
        "Typed: **3.1** with no source."
    )
    assert unsupported(text, tmp_path) == [
        "'2.00×' is not in ['bench/results/x.md']",
        "'3.1': cites no bench/results file",
    ]
