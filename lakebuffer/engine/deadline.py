"""Bound a blocking stream or call by an overall deadline.

A lake read can stall inside one batch (an S3 endpoint that accepts the connection and never
answers), where a check between batches never runs. The stream is pulled on a helper thread and
the caller waits for each item at most until the deadline: past it the caller gets ``overdue()``
at once, and the helper, still stuck in the read, stops at its next step and closes the stream.
What the helper reads is handed over through a queue of one item, so at most two items (one
queued, one being read) are in memory.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

_END = object()


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


def bounded_iter(items: Iterator[T], deadline: float | None, overdue: Callable[[], BaseException],
                 name: str = "lakebuffer-read") -> Iterator[T]:
    """The items of ``items`` in order; raises ``overdue()`` when ``time.monotonic()`` passes
    ``deadline`` while waiting for one (``deadline=None``: no bound, no helper thread)."""
    if deadline is None:
        yield from items
        return
    handoff: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()

    def offer(item: Any) -> bool:
        while not stop.is_set():
            try:
                handoff.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def pump() -> None:
        try:
            for item in items:
                if not offer(item):
                    return
            offer(_END)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, raised there
            offer(_Failed(e))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:  # noqa: BLE001 - the stream is abandoned; its error was not asked for
                    pass

    helper = threading.Thread(target=pump, name=name, daemon=True)
    helper.start()
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise overdue()
            try:
                item = handoff.get(timeout=left)
            except queue.Empty:
                raise overdue() from None
            if item is _END or isinstance(item, _Failed):
                # the helper has left ``items`` and is returning: joined, so no thread of this call outlives it
                helper.join(max(0.0, deadline - time.monotonic()))
                if item is _END:
                    return
                raise item.error
            yield item
    finally:
        stop.set()


def deadline(timeout_s: float | None) -> float | None:
    """The ``time.monotonic()`` deadline ``timeout_s`` from now (None: no bound)."""
    return None if timeout_s is None else time.monotonic() + timeout_s


def bounded_call(fn: Callable[[], T], deadline: float | None, overdue: Callable[[], BaseException],
                 name: str = "lakebuffer-read") -> T:
    """``fn()``, or ``overdue()`` once ``deadline`` passes while it runs (it keeps running on its
    helper thread until it returns; use it for reads only, whose late result is simply dropped)."""
    stream = bounded_iter(_once(fn), deadline, overdue, name)
    try:
        result = next(stream)
        for _ in stream:  # the end of the stream: its helper thread is joined before this returns
            pass
        return result
    finally:
        stream.close()


def _once(fn: Callable[[], T]) -> Iterator[T]:
    yield fn()
