"""Raw-text corpora for continued pre-training (`twinrun tune text`): plain UTF-8 files read in
order, tokenized once, and windows of N tokens drawn from the concatenated token stream.

- Each file is one document, tokenized by the tokenizer's plain rule (its own special tokens, as
  `tokenizer(text)` adds them; no chat template) and ended with eos; the documents are
  concatenated in the order the files were given.
- Window i of optimizer step s starts at `stream(seed, "window", s, i).integers(0, L - N + 1)`:
  uniform over the valid starts of the L-token stream, and keyed by what it is for, so prefetch,
  batch size and resume cannot change which windows a step trains on.
- The corpus SHA256 is the SHA256 of the files' SHA256 hex digests, one per line, in order (what
  `sha256sum A B | cut -c1-64 | sha256sum` prints): the order of the files is part of it.
"""

from __future__ import annotations

import hashlib
from typing import Any

from twinrun.core import reading
from twinrun.core.digest import sha256_file
from twinrun.core.errors import DataError
from twinrun.core.rng import stream
from twinrun.data.examples import EncodedRow

MAX_CORPUS_FILE_BYTES = 1 << 30  # one document held in memory and tokenized at once


def corpus_sha256(paths: list[str]) -> str:
    """SHA256 over the files' SHA256s, one hex digest and a newline per file, in order."""
    lines = "".join(f"{sha256_file(p)}\n" for p in paths)
    return hashlib.sha256(lines.encode("ascii")).hexdigest()


def read_corpus(paths: list[str]) -> tuple[list[str], str]:
    """The text of each file (in order) and the corpus SHA256; a DataError naming the first file
    that is missing or not UTF-8, or when every file is empty."""
    texts = []
    for p in paths:
        data = reading.read_bytes(
            p,
            "corpus file",
            MAX_CORPUS_FILE_BYTES,
            hint="check the --corpus paths",
            missing=f"corpus file {p} does not exist",
        )
        try:
            texts.append(data.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise DataError(
                f"corpus file {p} is not UTF-8 text (byte {exc.start})",
                "convert it to UTF-8",
            ) from exc
    if not any(t.strip() for t in texts):
        raise DataError("the corpus is empty (no text in any --corpus file)", "give text files")
    return texts, corpus_sha256(paths)


def tokenize_corpus(tok: Any, texts: list[str]) -> list[int]:
    """Every document's plain-rule tokens and eos, concatenated (empty documents skipped)."""
    ids: list[int] = []
    for text in texts:
        if not text.strip():
            continue
        doc = [int(i) for i in tok.hf(text, add_special_tokens=True)["input_ids"]]
        if not doc or doc[-1] != tok.eos_id:
            doc.append(int(tok.eos_id))
        ids += doc
    return ids


def check_window(tokens: int, window: int, max_length: int) -> None:
    """DataError when a window cannot be cut: longer than the corpus or the model's positions."""
    if window > max_length:
        raise DataError(
            f"--window {window} exceeds the model's {max_length} positions",
            f"use --window {max_length} or less",
        )
    if window > tokens:
        raise DataError(
            f"--window {window} is longer than the corpus ({tokens} tokens)",
            f"use --window {tokens} or less, or give more text",
        )


def window_start(seed: int, step: int, i: int, tokens: int, window: int) -> int:
    """Where window i of step `step` starts: uniform over the `tokens - window + 1` valid
    starts."""
    return stream(seed, "window", step, i).integers(0, tokens - window + 1)


def window_row(ids: list[int], start: int, window: int) -> EncodedRow:
    """The window as a row whose every token is a target but the first (nothing before it in the
    window predicts it), so a window of N tokens has N - 1 targets."""
    return EncodedRow(tuple(ids[start : start + window]), (0,) + (1,) * (window - 1))
