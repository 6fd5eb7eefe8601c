"""Reading and hashing what the replay checks trust, with the work spread over threads.

A replay (and `twinrun explain`) hashes three big things: the payload file, the payload's
logical batch (a second SHA256 over the same rows, big-endian, in another order — by design, so
it cannot share the file digest's pass) and the initial adapter, plus the model directory.
hashlib releases the GIL while it hashes, so these run at once:

- `Hashes`: the adapter and the model directory, on a background thread from the start;
- `PayloadDigests`: the payload, read once into a private buffer; then its file SHA256 on the
  calling thread while a second thread decodes it and computes its logical digest.

Nothing is trusted early: the results are used in the checks' order, and a decode or logical
digest of a payload whose file digest then fails is never looked at. Every digest is the one the
single-threaded code computes (`hashlib.sha256(bytes)`, `logical_sha256(decode(bytes).arrays)`).
"""

from __future__ import annotations

import hashlib
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from twinrun.capture.digests import logical_sha256
from twinrun.capture.payload import Decoded, decode
from twinrun.core import reading
from twinrun.core.digest import sha256_file
from twinrun.core.errors import DataError
from twinrun.model.loading import model_sha256

MAX_SMALL_BYTES = 256 << 20  # a manifest, an adapter config, a trainer state
READ_CHUNK = 64 << 20  # bytes per read call (a bound on one syscall, not a buffer size)


def _missing(what: str, path: Path) -> str:
    return f"cannot read {what} {path}: No such file or directory"


def read_hashed(path: Path, what: str) -> tuple[bytes, str]:
    """A small file's bytes (read once, kept for decoding) and their SHA256."""
    data = reading.read_bytes(path, what, MAX_SMALL_BYTES, missing=_missing(what, path))
    return data, hashlib.sha256(data).hexdigest()


def read_whole(path: Path, what: str) -> memoryview:
    """A large file's bytes, read once into a private buffer (a read-only view): what is hashed
    is what is decoded, whatever happens to the file afterwards. The buffer is not zero-filled
    first (that alone costs as much as copying the file)."""
    import numpy as np

    try:
        with reading.open_regular(path, what, missing=_missing(what, path)) as fh:
            buf = np.empty(os.fstat(fh.fileno()).st_size, dtype=np.uint8)
            view, pos = buf.data.cast("B"), 0
            while pos < len(view) and (n := fh.readinto(view[pos : pos + READ_CHUNK])):
                pos += n
            tail = []  # bytes appended since the file was opened: read all the same
            while more := fh.read(READ_CHUNK):
                tail.append(more)
    except OSError as exc:
        raise DataError(f"cannot read {what} {path}: {exc.strerror}", "check the path") from exc
    if tail:
        view, pos = memoryview(b"".join([view[:pos], *tail])), pos + sum(map(len, tail))
    return view[:pos].toreadonly()


class PayloadDigests:
    """A payload's file SHA256 (computed on the calling thread, in the constructor) and, on a
    second thread started first, its decoding and logical digest. `decoded()` and `logical()`
    wait for that thread and raise what `decode` or `logical_sha256` raised."""

    def __init__(self, data: memoryview, where: str) -> None:
        self.data = data
        self._decoded: Future[Decoded] = Future()
        self._logical: Future[str] = Future()
        # a daemon: a replay refused at the file digest does not wait for a digest it ignores
        threading.Thread(
            target=self._decode_and_digest, args=(where,), name="twinrun-logical", daemon=True
        ).start()
        self.sha256 = hashlib.sha256(data).hexdigest()

    def _decode_and_digest(self, where: str) -> None:
        try:
            decoded = decode(self.data, where)
        except BaseException as exc:  # re-raised by decoded() / logical() on the checks' thread
            self._decoded.set_exception(exc)
            self._logical.set_exception(exc)
            return
        self._decoded.set_result(decoded)
        try:
            self._logical.set_result(logical_sha256(decoded.arrays))
        except BaseException as exc:
            self._logical.set_exception(exc)

    def decoded(self) -> Decoded:
        return self._decoded.result()

    def logical(self) -> str:
        return self._logical.result()


class Hashes:
    """File and directory digests the checks will need, started on a background thread at
    once: hashing only reads bytes (nothing is parsed or trusted early), and the big adapter and
    model files then hash while the payload is checked. Results are used in check order."""

    def __init__(self, files: list[Path], dirs: list[Path]) -> None:
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="twinrun-hash")
        self.jobs = {p: self.pool.submit(sha256_file, p) for p in files if p.is_file()}
        self.jobs |= {d: self.pool.submit(model_sha256, d) for d in dirs if d.is_dir()}

    def file(self, path: Path) -> str:
        job = self.jobs.get(path)
        return job.result() if job is not None else sha256_file(path)

    def dir(self, path: Path) -> str:
        job = self.jobs.get(path)
        return job.result() if job is not None else model_sha256(path)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
