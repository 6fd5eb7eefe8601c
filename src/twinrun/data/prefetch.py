"""Background prefetch: prepare the batches of the next N steps on a thread (padding, masks,
tensors) while the current step trains.

It never changes a byte of the result: what a step's batch contains is decided by keyed draws
(`stream(seed, "shuffle", epoch)`), not by when or on which thread it is prepared, and the
consumer takes batches strictly in step order.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

T = TypeVar("T")
_DONE = object()


class Prefetcher(Generic[T]):
    """`get(step)` returns `produce(step)`, computed up to `depth` steps ahead (0: inline)."""

    def __init__(self, produce: Callable[[int], T], steps: Iterable[int], depth: int) -> None:
        self.produce = produce
        self.depth = depth
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if depth > 0:
            self._queue: queue.Queue[tuple[int, object]] = queue.Queue(maxsize=depth)
            self._thread = threading.Thread(
                target=self._work, args=(list(steps),), name="twinrun-prefetch", daemon=True
            )
            self._thread.start()

    def _work(self, steps: list[int]) -> None:
        for step in steps:
            if self._stop.is_set():
                return
            try:
                item: object = self.produce(step)
            except BaseException as exc:  # handed to the consumer, raised there
                item = exc
            while not self._stop.is_set():
                try:
                    self._queue.put((step, item), timeout=0.1)
                    break
                except queue.Full:
                    continue
            if isinstance(item, BaseException):
                return

    def get(self, step: int) -> T:
        if self._thread is None:
            return self.produce(step)
        got, item = self._queue.get()
        while got < step and not isinstance(item, BaseException):  # steps before a resume point
            got, item = self._queue.get()
        if got != step:
            raise RuntimeError(f"prefetch out of order: wanted step {step}, got {got}")
        if isinstance(item, BaseException):
            raise item
        return item  # type: ignore[return-value]  # the producer's T: exceptions are raised above

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
