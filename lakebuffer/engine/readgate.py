"""The gate between reads that select then fetch (``sample``, ``get``, ``sql``) and what removes rows or
files under them (``delete``, a warm fragment leaving local disk).

A sample selects keys on the catalog, then fetches their rows; a delete between the two made the
fetch fail with ``KeyNotFoundError`` for a key just drawn, or read a warm row a delete was blanking.
Reads hold the gate shared for the whole call, a delete holds it exclusive while it removes rows,
so a sample sees the buffer either before or after a delete, never half of it.

Deletes are preferred: once one waits, new reads wait behind it (a stream of samples cannot
starve it), while a read the same thread already holds goes on (``sample`` calls ``get``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class ReadGate:
    """Shared (reads) / exclusive (deletes), exclusive preferred, shared re-entrant per thread."""

    def __init__(self) -> None:
        self._cv = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0
        self._mine = threading.local()

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        depth = getattr(self._mine, "depth", 0)
        if depth == 0:
            with self._cv:
                while self._writer or self._writers_waiting:
                    self._cv.wait()
                self._readers += 1
        self._mine.depth = depth + 1
        try:
            yield
        finally:
            self._mine.depth = depth
            if depth == 0:
                with self._cv:
                    self._readers -= 1
                    if self._readers == 0:
                        self._cv.notify_all()

    def held(self) -> bool:
        """Whether this thread is inside a read (it cannot wait for the exclusive side)."""
        return bool(getattr(self._mine, "depth", 0))

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        if getattr(self._mine, "depth", 0):
            raise RuntimeError("a delete inside a read of the same thread would wait for itself")
        with self._cv:
            self._writers_waiting += 1
            try:
                while self._writer or self._readers:
                    self._cv.wait()
            finally:
                self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cv:
                self._writer = False
                self._cv.notify_all()
