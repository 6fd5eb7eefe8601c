"""The diag recorder's helper process: rows handed to `DiagRecorder.record_later` are computed
(exact checksums, SHA256 digests, the JSON line) and appended to diag.jsonl by a separate
process, so the training loop's thread neither computes them nor shares its GIL with them.

The loop's thread only copies each leaf's bytes into a shared-memory segment and sends a small
message over a pipe (per leaf: a kind, and each part's dtype name, shape and offset; the step,
the phase, the segment's name). The helper (`twinrun.diag.helper_main`, a fresh interpreter
started with `subprocess` -- exec'd at once, nothing runs in a forked copy of a process with
torch's threads -- that imports numpy and twinrun.diag only) rebuilds numpy views of the parts,
computes each leaf with the very functions `record` uses, writes the line and acknowledges it.
Rows are written in the order they were handed over, with the bytes `record` writes.

What goes where:

* a torch tensor (any device) or a native numpy array whose dtype numpy has (bfloat16 as its
  raw 2-byte bits), a list of such (a multi-part leaf) and a `FlatLeaf` (its group's flat
  buffer, once per row): copied into the segment;
* plain Python values (numbers, strings, lists of numbers) and other numpy arrays: pickled into
  the message, computed by the helper exactly as `record` computes them;
* anything else (a tensor of a dtype numpy lacks, an object of some other type): computed on
  the caller's thread, as `record` would, and sent as its checksum and digest.

Segments are reused (one per row in flight, at most `MAX_SEGMENTS`; a segment too small for a
row is replaced by one twice as large). A segment's name is unlinked from /dev/shm as soon as
the helper has mapped it (its first row acknowledged), and at `close` in any case; the
multiprocessing resource tracker removes what a killed training process leaves behind.

Errors: a row the helper could not compute or write comes back as the same exception (pickled;
otherwise an OutputError naming it), raised at the next hand-over or at `flush`. A helper that
died (killed, out of memory) is an OutputError at the next hand-over or `flush`, naming the
steps whose rows were lost; every wait has a timeout and checks that the process is alive.
`TWINRUN_DIAG_HELPER=0` keeps the rows on the recorder's background thread instead, as does a
helper that cannot be started (no shared memory, no interpreter to start).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from twinrun.core.errors import OutputError
from twinrun.diag.flat import FlatLeaf
from twinrun.diag.shm import Control, Segment, nbytes_of, release_all, shm_dtype, shm_room

__all__ = ["ENV", "HelperUnavailable", "RowHelper", "enabled"]

ENV = "TWINRUN_DIAG_HELPER"  # "0": rows on the recorder's thread, not in a helper process
READY_TIMEOUT_S = 60.0  # for the helper's start-up (imports) on a busy machine
STALL_TIMEOUT_S = 600.0  # a live helper that acknowledges nothing for this long is stuck
POLL_S = 0.05  # how often a wait checks that the helper is alive
MAX_SEGMENTS = 64  # rows in flight: the helper may fall behind for a while (a busy machine)
MIN_SEGMENT = 1 << 20
ALIGN = 64
_BOOT = (
    "import sys; from twinrun.diag.helper_main import main; main(int(sys.argv[1]), "
    "int(sys.argv[2]))"
)
_HINT = f"the rows are lost; rerun (with {ENV}=0 the rows are computed on a thread instead)"


def enabled() -> bool:
    """Whether `record_later` may use a helper process (`TWINRUN_DIAG_HELPER` is not 0)."""
    off = os.environ.get(ENV, "1").strip().lower() in ("0", "false", "no", "off")
    return not off and sys.byteorder == "little" and os.name == "posix"


class HelperUnavailable(Exception):
    """The helper process could not be started here (the recorder uses its thread instead)."""


def _plain(value: Any, depth: int = 0) -> bool:
    """A value that pickles as itself and that the helper computes as `record` does."""
    if value is None or type(value) in (bool, int, float, str):
        return True
    if type(value) in (list, tuple) and depth < 8:
        return all(_plain(v, depth + 1) for v in value)
    np = sys.modules.get("numpy")
    return np is not None and type(value) is np.ndarray and value.dtype != object


def _release(proc: subprocess.Popen[bytes], segments: list[Any]) -> None:
    """Stop the helper and unlink the segments (at `close`, or when the recorder is dropped
    unclosed or the interpreter exits)."""
    for seg in segments:
        seg.close()
    segments.clear()
    if proc.poll() is None:
        proc.kill()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:  # pragma: no cover
            pass


class RowHelper:
    """The parent's side of one helper process writing `path` (see the module docstring)."""

    def __init__(self, path: Path, fsync: bool, compute: Callable[[Any], Any]) -> None:
        self.path = path
        self._compute = compute  # `leaf_value`: a leaf the helper cannot take, computed here
        if not sys.executable:
            raise HelperUnavailable("no Python interpreter to start")
        self.segments: list[Any] = []
        self.max_bytes = shm_room()
        try:
            if self.max_bytes < MIN_SEGMENT:
                raise OSError(f"{self.max_bytes} bytes free")
            self._ctl = Control()
            self.segments.append(self._ctl)
            self.segments.append(Segment(MIN_SEGMENT))  # now, not on the first step's path
        except Exception as e:  # no /dev/shm, or no room in it
            release_all(self.segments)
            raise HelperUnavailable(f"no shared memory: {e}") from e
        r_in, w_in = os.pipe()  # parent -> helper
        r_out, w_out = os.pipe()  # helper -> parent
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])  # the directory holding twinrun
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
        env["OMP_NUM_THREADS"] = "1"  # torch, if a leaf ever needs it there: one thread
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT, str(r_in), str(w_out)],
                pass_fds=(r_in, w_out), env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        except OSError as e:
            os.close(w_in)
            os.close(r_out)
            release_all(self.segments)
            raise HelperUnavailable(f"cannot start the helper: {e}") from e
        finally:
            os.close(r_in)
            os.close(w_out)
        self._tx = Connection(w_in, readable=False)
        self._rx = Connection(r_out, writable=False)
        self._finalizer = weakref.finalize(self, _release, self.proc, self.segments)
        self.started = time.perf_counter()
        self.ready_s: float | None = None  # seconds from start to the helper's "ready"
        self.sent = -1  # the last row handed over
        self.acked = -1  # the last row the helper finished (written or failed)
        self._errors_read = 0
        self.steps: dict[int, int] = {}  # row -> step, for the rows not yet acknowledged
        self.errors: list[tuple[tuple[int, int], BaseException]] = []
        self.dead: OutputError | None = None
        self.reported = False
        self._last_progress = time.perf_counter()
        self._send(("config", str(path), fsync, self._ctl.name))

    # -- start-up --------------------------------------------------------------------------

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Block until the helper has imported what it needs; HelperUnavailable if it cannot."""
        deadline = time.perf_counter() + timeout
        while self.ready_s is None:
            if self.dead is not None:
                raise HelperUnavailable(str(self.dead))
            try:
                if self._rx.poll(POLL_S):
                    msg = self._rx.recv()
                    if msg[0] == "unavailable":
                        raise HelperUnavailable(str(msg[1]))
                    self.ready_s = time.perf_counter() - self.started
                    self._ctl.unlink()  # mapped by the helper
                    continue
            except (EOFError, OSError) as e:
                raise HelperUnavailable("the helper exited while starting") from e
            if self.proc.poll() is not None:
                raise HelperUnavailable(f"the helper exited ({self.proc.returncode}) at start")
            if time.perf_counter() > deadline:
                raise HelperUnavailable(f"the helper did not start within {timeout:.0f} s")

    # -- hand-over ---------------------------------------------------------------------------

    def submit(self, step: int, phase: str, leaves: dict[str, Any]) -> None:
        """Hand one row over (copies into shared memory, one message); raises an earlier row's
        error, or the helper's death."""
        self._check()
        self._poll()
        if self.sent > self.acked and self.proc.poll() is not None:
            self._poll()
            if self.sent > self.acked:
                self._died()
        self._check()
        self._raise_errors(self.acked)
        seq = self.sent + 1
        specs: list[tuple[str, tuple[Any, ...]]] = []
        copies: list[tuple[int, Any, int]] = []
        groups: dict[int, tuple[int, int, Any, Any]] = {}  # id(group) -> (gid, offset, ...)
        size = 0

        def place(x: Any, name: str) -> tuple[str, tuple[int, ...], int]:
            nonlocal size
            nbytes = nbytes_of(x)
            offset = size
            size = -(-(offset + nbytes) // ALIGN) * ALIGN
            copies.append((offset, x, nbytes))
            return (name, tuple(x.shape), offset)

        try:
            for leaf, value in leaves.items():
                if isinstance(value, FlatLeaf) and value.group._results is None:
                    g = value.group
                    if id(g) not in groups:
                        nbytes = nbytes_of(g)
                        groups[id(g)] = (len(groups), size, g.shapes, g.counts)
                        copies.append((size, g, nbytes))
                        size = -(-(size + nbytes) // ALIGN) * ALIGN
                    specs.append((leaf, ("f", groups[id(g)][0], value.index)))
                    continue
                name = shm_dtype(value)
                if name is not None:
                    specs.append((leaf, ("t", place(value, name))))
                    continue
                if _is_parts(value):
                    names = [shm_dtype(p) for p in value]
                    if None not in names:
                        parts = [place(p, str(n)) for p, n in zip(value, names, strict=True)]
                        specs.append((leaf, ("p", parts)))
                        continue
                elif _plain(value):
                    specs.append((leaf, ("o", value)))
                    continue
                v = self._compute(value)  # as `record` computes it, here
                specs.append((leaf, ("v", v.checksum, v.digest)))
            seg = self._segment(size) if size else None
            if seg is None and size:  # too large for shared memory: computed here, as `record`
                specs = [(leaf, ("v", *_pair(self._compute(v)))) for leaf, v in leaves.items()]
                copies, groups = [], {}
            for offset, x, nbytes in copies:
                seg.copy_in(offset, x, nbytes)  # type: ignore[union-attr]  # size > 0
        except OutputError:
            raise
        except Exception as e:  # the row is not handed over; it fails where `record` would
            self.errors.append(((self.sent, 1), e))
            return
        gmeta = [(off, shapes, counts) for _, off, shapes, counts in groups.values()]
        self._send(("row", seq, step, phase, seg and seg.name, specs, gmeta))
        if seg is not None:
            if seg.first < 0:
                seg.first = seq
            seg.last = seq
        self.sent = seq
        self.steps[seq] = step

    def flush(self, again: bool = True) -> None:
        """Wait until every row handed over is written; raise the first error (a dead helper's
        error only once when `again` is False)."""
        if self.dead is None:
            self._wait(self.sent)
        if self.dead is not None and (again or not self.reported):
            self._check()
        self._raise_errors(self.sent)

    def close(self) -> None:
        """Stop the helper (after what it was handed) and release the segments."""
        if self.proc.poll() is None:
            try:
                self._tx.send(("stop",))
            except OSError:
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for conn in (self._tx, self._rx):
            conn.close()
        self._finalizer()

    # -- internals ---------------------------------------------------------------------------

    def _send(self, msg: tuple[Any, ...]) -> None:
        try:
            self._tx.send(msg)
        except OSError:  # a broken pipe: the helper is gone
            self._died()
            self._check()

    def _segment(self, need: int) -> Segment | None:
        """A segment no row in flight uses, at least `need` bytes (new, grown or waited for);
        None for a row larger than the shared memory the helper may use."""
        size = max(MIN_SEGMENT, 1 << max(0, need - 1).bit_length())
        if size > self.max_bytes:
            return None
        while True:
            rows = [s for s in self.segments if isinstance(s, Segment)]
            free = [s for s in rows if s.last <= self.acked]
            for seg in free:
                if seg.size >= need:
                    return seg
            used = sum(s.size for s in rows)
            if free and used - free[0].size + size <= self.max_bytes:  # replace a small one
                old = free[0]
                self.segments.remove(old)
                self._send(("drop", old.name))
                old.close()
                seg = Segment(min(self.max_bytes, max(size, 2 * old.size)))
            elif len(rows) < MAX_SEGMENTS and used + size <= self.max_bytes:
                seg = Segment(size)
            elif not free:
                self._wait(min(s.last for s in rows))
                continue
            else:  # free segments, all too small, and no room for a larger one
                for old in free:
                    self.segments.remove(old)
                    self._send(("drop", old.name))
                    old.close()
                continue
            self.segments.append(seg)
            return seg

    def _poll(self) -> None:
        """Take in the helper's progress (the control words; errors from the pipe)."""
        words = self._ctl.words
        acked, errors = int(words[0]), int(words[1])  # in this order (see Control)
        while self._errors_read < errors:
            try:
                msg = self._rx.recv()  # sent before the count was raised: no wait
            except (EOFError, OSError):
                self._died()
                return
            self._errors_read += 1
            self.errors.append(((int(msg[1]), 0), _exception(msg[2], msg[3], msg[4])))
        if acked > self.acked:
            self._last_progress = time.perf_counter()
            for seq in range(self.acked + 1, acked + 1):
                self.steps.pop(seq, None)
            self.acked = acked
            for seg in self.segments:  # mapped by the helper: the name is no longer needed
                if seg.named and isinstance(seg, Segment) and 0 <= seg.first <= acked:
                    seg.unlink()

    def _wait(self, seq: int) -> None:
        """Block until row `seq` is done; the helper's death or a stall raises."""
        pause = 0.0002
        while True:
            self._check()
            self._poll()
            if self.acked >= seq:
                return
            if self.proc.poll() is not None:
                self._poll()
                if self.acked < seq:
                    self._died()
                continue
            if time.perf_counter() - self._last_progress > STALL_TIMEOUT_S:
                self.proc.kill()
                self._died(f"made no progress for {STALL_TIMEOUT_S:.0f} s and was stopped")
                continue
            time.sleep(pause)
            pause = min(2 * pause, POLL_S)

    def _died(self, how: str | None = None) -> None:
        if self.dead is not None:
            return
        rc = self.proc.poll()
        if how is None:
            how = (
                "exited" if rc is None else
                f"was killed by signal {-rc}" if rc < 0 else f"exited with code {rc}"
            )  # fmt: skip
        lost = sorted(self.steps.values())
        what = (
            "" if not lost else
            f" before it wrote the row of step {lost[0]}" if len(lost) == 1 else
            f" before it wrote the rows of steps {lost[0]}..{lost[-1]}"
        )  # fmt: skip
        self.dead = OutputError(
            f"{self.path}: the diag helper process (pid {self.proc.pid}) {how}{what}", _HINT
        )

    def _check(self) -> None:
        if self.dead is not None:
            self.reported = True
            raise self.dead

    def _raise_errors(self, upto: int) -> None:
        ready = [e for e in self.errors if e[0][0] <= upto]
        if ready:
            self.errors = [e for e in self.errors if e[0][0] > upto]
            raise min(ready, key=lambda e: e[0])[1]


def _pair(v: Any) -> tuple[float, str]:
    return v.checksum, v.digest


def _is_parts(value: Any) -> bool:
    if not isinstance(value, list | tuple) or not value:
        return False
    return all(hasattr(v, "shape") and hasattr(v, "dtype") for v in value)


def _exception(blob: bytes | None, line: str, trace: str) -> BaseException:
    """The helper's exception, as the same type when it unpickles."""
    exc: BaseException | None = None
    if blob is not None:
        try:
            exc = pickle.loads(blob)
        except Exception:
            exc = None
    if not isinstance(exc, BaseException):
        exc = OutputError(f"the diag helper process could not write a row: {line}")
    exc.add_note(f"(raised in the diag helper process)\n{trace}".rstrip())
    return exc
