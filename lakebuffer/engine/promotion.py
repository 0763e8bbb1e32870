"""Read-through promotion: cold batches that reads touch come back to local disk (``promote_cold_reads``).

A ``get`` (or a ``sample`` that returns rows) served from the lake names the cold batches it read;
with the option on, each is queued once on the write-back worker (p1, off the read's path), which
reads the whole batch from the lake (every column, verified like any cold read), writes it as a
new warm fragment and flips the batch to warm in the index. The batch keeps its snapshot id: it is
in the lake already and is never uploaded again, so the disk budget may move it out once more
(oldest fragment first: a promoted batch is the newest, so it stays longest).

Nothing is promoted when it would not fit the disk budget (promotion never evicts), for a batch
with deleted rows (its positions have holes; it stays cold), or when the batch changed while it
was read (a delete or relocation: the next read queues it again).

Crash safety is the tier move's: the fragment is written before the index names it, and a
fragment no batch refers to whose keys the index places elsewhere is dropped on open
(``recovery.unexplained_fragments``); the index flip is one write.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import replace

import numpy as np

from ..errors import WorkerError
from ..tiers import Location
from .diskbudget import DiskBudget
from .state import BufferState
from .tasks import P1

#: a background warm waits while cold reads run or ran this recently, ``YIELD_TIMES`` times at most per
#: batch (20 x 0.5 s: a resumed run's first read from S3 took 3-7 s)
YIELD_S, YIELD_TIMES = 0.5, 20

log = logging.getLogger("lakebuffer")


class ColdPromotion:
    """Queues and performs cold -> warm moves of whole batches (see the module)."""

    def __init__(self, s: BufferState, disk: DiskBudget, enabled: bool) -> None:
        self.s = s
        self.disk = disk
        self.enabled = enabled
        self.promoted = 0  # batches moved back to the warm tier by this process
        self._queued: set[int] = set()
        self._lock = threading.Lock()
        self._stopped = False

    def stop(self) -> None:
        """The buffer is closing: queued promotions end at once (their batches stay cold, nothing lost)."""
        self._stopped = True

    def note(self, batch_ids: Iterable[int]) -> None:
        """Cold batches a read was served from: queue each one's promotion (once while queued)."""
        if self.enabled:
            self.warm(batch_ids)

    def warm(self, batch_ids: Iterable[int], background: bool = False) -> None:
        """Queue the promotion of these cold batches, in this order, whatever ``enabled`` says (a lazy
        resume warms its batches in the background, ``engine/resume``); each one only if it fits.
        ``background``: each waits while cold reads are running (``_run``), a read's promotion does not."""
        with self._lock:
            new = [b for b in dict.fromkeys(int(b) for b in batch_ids) if b not in self._queued]
            self._queued.update(new)
        yields = YIELD_TIMES if background else 0
        if background:  # a resumed run's first reads come right after its open: warming waits for them
            self.s.last_cold_read = max(self.s.last_cold_read, time.monotonic())
        for bid in new:
            try:
                self.s.tasks.submit(P1, lambda bid=bid: self._run(bid, yields), name="promote cold batch", surface=False)
            except WorkerError:  # the buffer is closing: the rows stay cold, nothing is lost
                with self._lock:
                    self._queued.discard(bid)

    def _run(self, batch_id: int, yields: int = 0) -> None:
        """Promote one batch; a background warm (``yields`` > 0) first waits, on the queue's timer, while
        cold reads run or ran in the last ``YIELD_S`` (at most ``yields`` times): warming decodes whole
        row groups, and on 2 cores it tripled a resumed run's first ``sample + get`` calls."""
        busy = self.s.cold_reads_running > 0 or time.monotonic() - self.s.last_cold_read < YIELD_S
        if yields and not self._stopped and busy:
            try:
                self.s.tasks.submit_later(P1, lambda: self._run(batch_id, yields - 1), YIELD_S,
                                          name="promote cold batch", surface=False)
                return
            except WorkerError:
                pass
        try:
            if not self._stopped:
                self.promote(batch_id)
        except Exception as e:  # noqa: BLE001 - optional work: the rows stay cold and readable, a later read retries
            log.warning("cold batch %d stays in the lake: %s", batch_id, e)
        finally:
            with self._lock:
                self._queued.discard(batch_id)

    def promote(self, batch_id: int) -> bool:
        """Move one cold batch to the warm tier now; False when it is not moved (see the module)."""
        s = self.s
        with s.lock:
            info = s.batches.get(batch_id)
            if info is None or info.tier != "cold":
                return False
            seen = (info.rows, tuple(info.files))
            nbytes = info.nbytes
        if self.disk.short(nbytes):  # a first guess (the batch's share of the fragment it left)
            return False
        meta = s.index.batch_meta(batch_id)
        locs = s.index.cold_locations(batch_id)
        if meta is None or locs is None:
            return False
        keys = meta.column("key").to_pylist()
        _, pos, found = s.index.lookup(keys)
        if not found.all() or not np.array_equal(np.sort(pos), np.arange(len(keys))) or (locs[1] < 0).any():
            return False  # deleted slots: the fragment's rows would not line up with the positions
        order = np.argsort(pos)
        keys = [keys[i] for i in order.tolist()]
        files, file_idx, rows = locs
        numbers = np.array([s.cold.number(e) for e in files], np.int64)
        where = Location(numbers[file_idx], rows.astype(np.int64))
        table = s.cold.take_checked(where, list(s.schema.names), keys)
        staged = s.warm.stage(table)
        committed = False
        with s.lock:
            try:
                now = s.batches.get(batch_id)
                if now is not info or now.tier != "cold" or (now.rows, tuple(now.files)) != seen:
                    return False  # a delete or relocation meanwhile: the next read queues it again
                if self.disk.short(staged.nbytes):  # the real size, under the lock
                    return False
                warm = replace(info, tier="warm", fragment=staged.part, offset=0, files=list(staged.files),
                               checksum=staged.checksum, nbytes=staged.nbytes)
                s.index.set_warm(warm)  # one write: a crash before it leaves a fragment recovery drops
                committed = True
                s.batches[batch_id] = warm
                s.warm.publish(staged)
                s.cold.forget(batch_id)
                self.promoted += 1
            finally:
                if not committed:
                    s.warm.drop_fragments([staged.part])
        # a local mirror copy (restore="eager") no cold batch reads any more leaves (outside the lock: the gate first)
        self.disk.drop_mirror(s.cold.unreferenced_mirror(seen[1]))
        return True
