"""The RAM budget (``memory_limit_mb``): how much the hot tier may hold, and back-pressure.

Everything that grows with the data counts: hot rows, pushes admitted but not yet in the hot tier
(reservations), the encoded copy a write-back builds (``WRITE_BACK_RAM``) and the DuckDB metadata
catalog, which grows with every row stored (~140 B each) and is taken from the hot tier's share.
A push that does not fit waits for write-back to free room and, after ``push_timeout_s``, fails
with ``BackpressureError`` (nothing stored).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ..errors import BackpressureError
from ..lake.runtime import NativeLock

log = logging.getLogger("lakebuffer")

EVICT_HIGH = 0.75  # start write-back when resident hot bytes pass this share of the hot limit
EVICT_LOW = 0.5  # ... and write back until they are under this share
#: RAM one write-back costs per byte of hot rows it writes, beyond the hot rows themselves: the
#: concatenated copy of coalesced small batches (and, under the Lance warm tier before issue 17, its
#: encoded pages: 1.7x measured); a promoted WAL segment (a hard link) holds nothing.
WRITE_BACK_RAM = 2
CATALOG_WARN = 0.5  # warn once when the metadata catalog takes this share of the budget


class Budget:
    """Byte accounting under the engine's lock; ``space`` is notified whenever bytes are freed."""

    def __init__(self, limit_bytes: int, catalog_bytes: Callable[[], int], lock: NativeLock,
                 rows: Callable[[], int] = lambda: 0) -> None:
        self.limit_bytes = int(limit_bytes)
        self._catalog_bytes = catalog_bytes
        self._rows = rows
        self.space = threading.Condition(lock)
        self.reserved = 0  # pushes admitted, not yet in the hot tier
        self.encoding = 0  # RAM held by write-backs running now (see WRITE_BACK_RAM)
        self._warned = False

    def hot_limit(self) -> int:
        """The share left for hot rows and write-back: the budget minus the metadata catalog, so
        RAM stays within the budget as the buffer grows. The hot tier keeps at least a quarter."""
        catalog = self._catalog_bytes()
        if catalog > self.limit_bytes * CATALOG_WARN and not self._warned:
            self._warned = True
            log.warning("the metadata of %d rollouts takes %.0f MB of memory_limit_mb=%.0f: raise it (past 3/4 "
                        "of it, RAM outgrows it)", self._rows(), catalog / 2**20, self.limit_bytes / 2**20)
        return max(self.limit_bytes - catalog, self.limit_bytes // 4)

    def admit(self, nbytes: int, hot_bytes: Callable[[], int], make_room: Callable[[int], None],
              timeout_s: float, on_wait: Callable[[], None] = lambda: None) -> None:
        """Reserve ``nbytes`` for a push, waiting (and asking ``make_room``) while they do not fit."""
        deadline = time.monotonic() + timeout_s
        with self.space:
            while hot_bytes() + self.encoding + self.reserved + nbytes > self.hot_limit():
                make_room(nbytes)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BackpressureError(
                        f"hot tier full ({hot_bytes()} of {self.hot_limit()} bytes) and write-back "
                        f"did not free {nbytes} bytes within push_timeout_s={timeout_s}; batch not stored"
                    )
                self.space.wait(min(left, 0.5))
                on_wait()
            self.reserved += nbytes

    def unreserve(self, nbytes: int) -> None:
        """A reservation ends (its rows are in the hot tier now, or the push failed)."""
        with self.space:
            self.reserved -= nbytes
            self.space.notify_all()

    def hold_encoding(self, table_nbytes: int) -> int:
        """Count the RAM a write-back of ``table_nbytes`` hot bytes needs; returns it (for ``drop``)."""
        held = WRITE_BACK_RAM * table_nbytes
        with self.space:
            self.encoding += held
        return held

    def drop_encoding(self, held: int) -> None:
        with self.space:
            self.encoding -= held
            self.space.notify_all()
