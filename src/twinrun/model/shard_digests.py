"""What every process of a sharded base (`--shard-base`) proves it read.

Each process reads only its own rows of the weights (`model/shards.py`), so no process but one
sees every byte, and a process that sees other bytes at the same path (another `--model` given
to one node, or its own mount of the path) would train on them. The check, in three parts:

- **Pieces.** A weights file is cut, from its header alone, into the header (the length prefix
  and the JSON) and, for each tensor in file order, the bytes of process 0's rows, process 1's
  rows, ... (`shards.owned_span`). The header's spans tile the file's data section (the reader
  refuses a gap or an overlap, as the one-process loader does), so the pieces hold every byte of
  the file exactly once.
- **Rank 0's pass** (`base_digests`, run by `distributed.from_root`): the model's SHA256 exactly
  as one process computes it (`model.loading.model_sha256`, what the sidecar records as
  `model.sha256`, whatever the process count) and, from the same bytes in the same pass, each
  piece's SHA256. Nothing is read twice; rank 0 reads the files once, as before.
- **Every process** hashes what it reads: the files beside the weights (config, tokenizer,
  index) and each weights file's header before the processes agree (`outline_sha256`, the
  agreement's `model sha256`), then, while it loads, each piece as it lands in its shard
  (`ReadCheck`: the bytes hashed are the bytes trained on). A piece whose digest is not rank 0's
  stops every process, with one line naming the rank, the file, the tensor's rows and both
  digests, before anything is written (`distributed.first_problem`).

Cost: rank 0 reads and hashes every byte once (its plain SHA256 needs that), plus a second
SHA256 of the same chunks for the pieces; every other process hashes exactly the bytes it
reads: 1/W of the weights, the header and the small files.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from twinrun.core.safetensors_io import Header
from twinrun.model.shards import owned_rows, owned_span, weight_headers


@dataclass(frozen=True)
class Piece:
    offset: int
    length: int
    label: str  # "the header", or a tensor's name and the rows the piece holds


def pieces(header: Header, world: int) -> list[Piece]:
    """The pieces of a weights file for `world` processes, in file order (they tile the file)."""
    out = [Piece(0, len(header.prefix), "the header")]
    for name, span in sorted(header.spans.items(), key=lambda kv: (kv[1].offset, kv[0])):
        for rank in range(world):
            offset, length = owned_span(span, rank, world)
            if length == 0:
                continue
            if span.shape:
                a, b = owned_rows(span.shape[0], rank, world)
                out.append(Piece(offset, length, f"{name} rows {a}..{b}"))
            else:
                out.append(Piece(offset, length, name))
    return out


class _PieceTap:
    """Fed a file's chunks in order: the SHA256 of each piece (a piece the file ends inside of
    gets the digest of what there was, which no process's full read matches)."""

    def __init__(self, cuts: list[Piece]) -> None:
        self.cuts = cuts
        self.done: dict[int, tuple[int, str, str]] = {}
        self.i = 0
        self.position = 0
        self.h = hashlib.sha256()

    def __call__(self, chunk: bytes) -> None:
        view = memoryview(chunk)
        while view and self.i < len(self.cuts):
            piece = self.cuts[self.i]
            take = min(len(view), piece.offset + piece.length - self.position)
            self.h.update(view[:take])
            self.position += take
            view = view[take:]
            if self.position == piece.offset + piece.length:
                self._close()

    def _close(self) -> None:
        piece = self.cuts[self.i]
        self.done[piece.offset] = (piece.length, self.h.hexdigest(), piece.label)
        self.h = hashlib.sha256()
        self.i += 1

    def digests(self) -> dict[int, tuple[int, str, str]]:
        if self.i < len(self.cuts):
            self._close()
        return self.done


@dataclass(frozen=True)
class BaseDigests:
    """Rank 0's pass over the base: the model's SHA256 (the 1-process digest) and, per weights
    file (named relative to the model directory), each piece's (length, SHA256, label) by its
    offset, for `world` processes."""

    sha256: str
    world: int
    pieces: dict[str, dict[int, tuple[int, str, str]]]


def base_digests(model_dir: str | os.PathLike[str], world: int) -> BaseDigests:
    """One pass over every file the loader reads: the model's SHA256 and each piece's."""
    from twinrun.model.loading import model_sha256

    root = Path(model_dir)
    taps = {path: _PieceTap(pieces(h, world)) for path, h in weight_headers(root).items()}
    sha256 = model_sha256(root, dict(taps))
    by_file = {path.relative_to(root).as_posix(): tap.digests() for path, tap in taps.items()}
    return BaseDigests(sha256, world, by_file)


def outline_sha256(model_dir: str | os.PathLike[str]) -> str:
    """What every process hashes before the processes agree: each file the loader reads whole,
    but of a weights file only its header (the pieces of its data are checked as they load)."""
    from twinrun.core.digest import sha256_file
    from twinrun.model.loading import model_files

    root = Path(model_dir)
    headers = weight_headers(root)
    h = hashlib.sha256()
    for path in model_files(root):
        header = headers.get(path)
        digest = sha256_file(path) if header is None else hashlib.sha256(header.prefix).hexdigest()
        h.update(f"{path.relative_to(root).as_posix()}\0{digest}\n".encode())
    return h.hexdigest()


class ReadCheck:
    """The pieces this process read, each hashed as read, against rank 0's digests; `problem`
    is the first that differs (None while none does)."""

    def __init__(self, expected: BaseDigests, root: str | os.PathLike[str]) -> None:
        self.expected = expected
        self.root = Path(root)
        self.problem: str | None = None
        self.bytes_checked = 0

    def header(self, path: Path, prefix: bytes) -> None:
        """The header this process parsed (of any length: another header is other bytes)."""
        name = path.relative_to(self.root).as_posix()
        length, want, label = self.expected.pieces.get(name, {}).get(0, (0, "(none)", "header"))
        if self.problem is None and len(prefix) != length:
            got = hashlib.sha256(prefix).hexdigest()
            self.problem = self._other(name, label, want, got)
            return
        self.read(path, 0, memoryview(prefix))

    @staticmethod
    def _other(name: str, label: str, want: str, got: str) -> str:
        return (
            f"read other bytes of the base than rank 0 hashed ({name}, {label}): "
            f"Expected sha256 {want}  Got {got}"
        )

    def read(self, path: Path, offset: int, data: memoryview) -> None:
        """Bytes [offset, offset + len(data)) of `path`, as this process read them: whole
        pieces (a process's rows of a tensor, or every process's rows of one read whole)."""
        if self.problem is not None:
            return
        name = path.relative_to(self.root).as_posix()
        table = self.expected.pieces.get(name, {})
        view = data.cast("B") if data.format != "B" or data.ndim != 1 else data
        position, end = offset, offset + len(view)
        while position < end:
            piece = table.get(position)
            if piece is None or position + piece[0] > end:
                self.problem = (
                    f"read bytes {position}..{end} of {name}, which rank 0's header of it "
                    "does not cut there"
                )
                return
            length, want, label = piece
            got = hashlib.sha256(view[position - offset : position - offset + length]).hexdigest()
            self.bytes_checked += length
            if got != want:
                self.problem = self._other(name, label, want, got)
                return
            position += length
