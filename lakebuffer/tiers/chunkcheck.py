"""A warm fragment checked chunk by chunk as a ``take`` reads it, instead of whole on first read.

Why: the first read of a fragment in a process checked the CRC32C of the whole file, so after a reopen
a ``sample`` touching 59 warm rows of 42 fragments read 422 MB to return 0.5 MB (BENCHMARKS.md "#23").
A segment's footer (``segfooter``) holds a CRC32C per 16 KiB chunk (``CHUNK_BYTES``; each footer says its own); ``ChunkCheck`` is the check
``ipcread`` runs on every range before reading it: the chunks the range lies in are read and checked
(each once while the file keeps its signature), so verification costs about what the read costs.
The IPC metadata the take parses goes through the same check. A chunk that fails is a
``ChunkDamaged`` naming the file and the chunk: nothing of it is returned.
"""

from __future__ import annotations

import os
import threading

import numpy as np

from ..pagecache import will_need
from .ipcread import LayoutError
from .segfooter import Footer


class ChunkDamaged(LayoutError):
    """A chunk of the fragment's file fails its CRC32C."""


class ChunkCheck:
    """The check of one open fragment file (``fd``): chunks that passed are remembered when
    ``remember`` (not when the file was modified too recently for its mtime to show a later write)."""

    def __init__(self, path: str, fd: int, footer: Footer, remember: bool) -> None:
        self.path, self.fd, self.footer, self.remember = path, fd, footer, remember
        self.good = np.zeros(footer.chunks, bool)
        self._lock = threading.Lock()

    def __call__(self, pos: np.ndarray, n: np.ndarray) -> None:
        self.verify(self.pending(pos, n))

    def pending(self, pos: np.ndarray, n: np.ndarray) -> list[tuple[int, int, int]]:
        """The runs of unchecked chunks the ranges lie in: (first chunk, start byte, end byte)."""
        end = self.footer.ipc_end
        if (pos < 0).any() or (pos + n > end).any():
            raise LayoutError(f"{self.path}: a range lies outside the checked bytes")
        size = self.footer.chunk_bytes
        good = self.good
        first = np.minimum(pos // size, len(good) - 1)  # (an empty range may sit at the very end)
        last = (pos + n - 1) // size
        if good[first].all() and good[np.maximum(last, first)].all() and (last - first <= 1).all():
            return []  # the usual call once a take has run: every chunk it reads already checked
        keep = n > 0
        if not keep.any():
            return []
        first, last = first[keep], last[keep]
        if (last - first).max() == 0:
            need = np.zeros(len(good), bool)
            need[first] = True
        else:  # ranges over several chunks: mark [first, last] of each
            edges = np.zeros(len(good) + 1, np.int64)
            np.add.at(edges, first, 1)
            np.add.at(edges, last + 1, -1)
            need = np.cumsum(edges[:-1]) > 0
        ids = np.flatnonzero(need & ~good)
        if not len(ids):
            return []
        return [(int(run[0]), int(run[0]) * size, min((int(run[-1]) + 1) * size, end))
                for run in np.split(ids, np.flatnonzero(np.diff(ids) != 1) + 1)]

    def announce(self, runs: list[tuple[int, int, int]]) -> None:
        """Ask the kernel to start reading ``runs`` now (``POSIX_FADV_WILLNEED``): the runs of a take
        are then read from the disk at once, not one after another as ``verify`` reaches them."""
        will_need((self.fd, a, b - a) for _c, a, b in runs)

    def verify(self, runs: list[tuple[int, int, int]]) -> None:
        """Read and check ``runs``; remember the chunks that passed."""
        if not runs:
            return
        size, end = self.footer.chunk_bytes, self.footer.ipc_end
        for c, a, b in runs:
            data = os.pread(self.fd, b - a, a)
            if len(data) != b - a:
                raise LayoutError(f"{self.path} ends at byte {a + len(data)}, before its checked bytes end")
            bad = self.footer.check(data, c)
            if bad is not None:
                raise ChunkDamaged(f"{self.path}: bytes {bad * size}-{min((bad + 1) * size, end)} (chunk {bad}) "
                                   "fail their CRC32C")
        if self.remember:
            with self._lock:
                for c, a, b in runs:
                    self.good[c:c + -(-(b - a) // size)] = True
