"""The one place benches write their section of docs/benchmarks.md: the text between
`<!-- NAME:begin -->` and `<!-- NAME:end -->` is replaced, or the section is appended (with its
heading and intro) when it is not there yet. Everything else in the file is kept."""

from __future__ import annotations

from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


def update_docs_section(name: str, heading: str, intro: str, body: str, docs: Path = DOCS) -> None:
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = f"{begin}\n{body.rstrip(chr(10))}\n{end}"
    text = docs.read_text(encoding="utf-8") if docs.exists() else "# Benchmarks\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + f"\n\n## {heading}\n\n{intro}\n\n{block}\n"
    docs.parent.mkdir(parents=True, exist_ok=True)
    docs.write_text(text, encoding="utf-8")
