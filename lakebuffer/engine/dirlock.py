"""One writer per buffer directory: an exclusive ``filelock`` on ``<dir>/LOCK``.

The library gives the OS-level lock (released by the kernel if the process dies, so no stale
lock after kill -9) and the non-blocking try; this module adds what lakebuffer promises on top:
the holder's pid written into the file, and a ``LockedError`` that names it.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import filelock

from ..errors import LockedError

#: directories this process holds: a second open here must not blame "another process"
_HELD: set[Path] = set()
_HELD_LOCK = threading.Lock()


def _write_pid(fd: int) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


class DirLock:
    """The exclusive lock of one directory; ``acquire`` or raise ``LockedError`` at once."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.file = self.path / "LOCK"
        self._lock = filelock.FileLock(self.file, thread_local=False, preserve_lock_file=True, on_acquired=_write_pid)

    def acquire(self, hint: str = "one writer per buffer directory") -> DirLock:
        key = self.path.resolve()
        with _HELD_LOCK:
            if key in _HELD:
                raise LockedError(f"{self.path} is already open in this process ({hint}): close the other "
                                  "ReplayBuffer first, or share that one")
            try:
                self._lock.acquire(timeout=0)
            except filelock.Timeout:
                raise LockedError(f"{self.path} is open in another process{self._holder()} ({hint})") from None
            _HELD.add(key)
        return self

    def _holder(self) -> str:
        try:
            pid = self.file.read_text().strip()
        except OSError:
            return ""
        return f" (pid {pid})" if pid.isdigit() else ""

    def release(self) -> None:
        """Idempotent: close() calls it on every path."""
        if self._lock.is_locked:
            self._lock.release(force=True)
            with _HELD_LOCK:
                _HELD.discard(self.path.resolve())

    @property
    def held(self) -> bool:
        return self._lock.is_locked

    def __enter__(self) -> DirLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
