"""The local disk budget: ``disk_limit_gb`` over the buffer directory, and a free-space floor.

What counts: the WAL, the warm fragments, the local mirror of lake files (``tiers/mirror``, what
``restore="eager"`` copies) and the key index (the directory's own data; a local lake
inside the directory is the lake's budget, and DuckDB's spill folder is the query's). The floor keeps
``disk_free_floor_gb`` free on the filesystem (default: 1 GB or 5 % of it, whichever is less).

When a push would pass either, mirror copies leave first (their rows are in the lake by construction,
so nothing is recorded: reads of those rows go to the lake again), then warm fragments whose rows are ALL committed to the lake leave local
disk, oldest first (fragment ids grow with time): the index first records where each of their rows
is in the lake (``ColdTier.locate``, then ``KeyIndex.set_cold`` in one write), then the file is
removed. A crash in between leaves a fragment whose every key the index places elsewhere, which
recovery drops (``recovery.unexplained_fragments``): nothing is lost or seen twice.

A batch not yet in the lake never leaves: the push first snapshots (so its predecessors become
droppable); if the lake cannot take it (unreachable, damaged) and the budget is still passed, the
push raises ``BackpressureError`` and stores nothing.

That synchronous path is the back-pressure, not the steady state: past a high watermark
(``HIGH_WATER`` of ``disk_limit_gb``) a push queues the same relief on a background worker (p1, once
at a time), which moves committed fragments out down to the low watermark (``LOW_WATER``) and, when
too little is committed to get there, starts a snapshot (p0) and checks again when it lands. So while
the lake keeps up, a push finds room waiting and does not wait for the lake (issue 23 item 4).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import BackpressureError, LakeBufferError, WorkerError
from ..index import BatchInfo
from ..tiers.cold import ColdTier
from .state import BufferState
from .tasks import P1

log = logging.getLogger("lakebuffer")

GB = 2**30
#: the default free-space floor: this much, or FLOOR_FRACTION of the filesystem when that is less
FLOOR_BYTES = 1 * GB
FLOOR_FRACTION = 0.05
#: past this share of ``disk_limit_gb`` committed fragments start leaving in the background ...
HIGH_WATER = 0.75
#: ... until usage is back under this share
LOW_WATER = 0.55
#: the key index's bytes (RocksDB's directory, ~100 files at 8 GB) are listed at most this often by the
#: checks a push makes (twice a push, ~0.2 ms a listing); ``stats`` lists them every time
INDEX_BYTES_TTL_S = 1.0


def dir_bytes(path: Path) -> int:
    """Bytes of the regular files under ``path`` (recursively; vanished files skipped)."""
    total = 0
    stack = [str(path)]
    while stack:
        try:
            it = os.scandir(stack.pop())
        except OSError:
            continue
        with it:
            for e in it:
                try:
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
                    elif e.is_file(follow_symlinks=False):
                        total += e.stat(follow_symlinks=False).st_size
                except OSError:
                    pass
    return total


def cold_plan(s: BufferState, batch_id: int) -> tuple[int, list[dict], np.ndarray, np.ndarray] | None:
    """Where the lake's live files hold the rows of one batch: (live rows, file entries, file index and
    row in file per position in the batch, -1 for a deleted slot), or None if a row is not in the lake."""
    meta = s.index.batch_meta(batch_id)
    keys = meta.column("key").to_pylist() if meta is not None else []
    _, pos, found = s.index.lookup(keys)
    files, file_idx, row, located = s.cold.locate(keys)
    if not (found.all() and located.all()):
        return None
    size = int(pos.max()) + 1 if len(pos) else 0
    fi, rw = np.full(size, -1, np.int64), np.full(size, -1, np.int64)
    fi[pos], rw[pos] = file_idx, row
    return len(keys), files, fi, rw


class DiskBudget:
    """Keeps the buffer directory under ``limit_bytes`` and the filesystem above its free floor."""

    def __init__(self, s: BufferState, cold: ColdTier, limit_bytes: int | None, floor_bytes: int | None,
                 snapshot: Callable[[], object]) -> None:
        self.s = s
        self.cold = cold
        self.limit = limit_bytes
        if floor_bytes is None:
            floor_bytes = min(FLOOR_BYTES, int(shutil.disk_usage(s.path).total * FLOOR_FRACTION))
        self.floor = floor_bytes
        self._snapshot = snapshot
        self.snapshot_ahead: Callable[[], Any] | None = None  # queue a snapshot (a future), set by the buffer
        self._ahead_lock = threading.Lock()
        self._ahead_queued = False
        self._snap_future: Any = None  # the snapshot started ahead, while it runs
        self.ahead_runs = 0  # background reliefs run (stats)
        self.waits = 0  # pushes that found no room and relieved (or snapshotted) on their own thread
        self.moved_fragments = 0
        self._scores: dict[int, float | None] = {}  # fragment -> keep priority (evict=), scored once
        self._index_listed: tuple[float, int] | None = None  # (when, bytes) of the index's last listing

    # measuring -------------------------------------------------------------------------------
    def usage(self, fresh: bool = False) -> int:
        """Local bytes of WAL, warm fragments and index (the index's listed within ``INDEX_BYTES_TTL_S``
        unless ``fresh``: it grows by a few KB a push, and listing it cost a push ~10%)."""
        s = self.s
        mirror = self.cold.mirror
        return (s.wal.nbytes() + s.warm.stats()["bytes"] + self._index_bytes(fresh)
                + (mirror.nbytes() if mirror is not None else 0))

    def _index_bytes(self, fresh: bool) -> int:
        now = time.monotonic()
        listed = self._index_listed
        if fresh or listed is None or now - listed[0] > INDEX_BYTES_TTL_S:
            listed = self._index_listed = (now, dir_bytes(self.s.path / "index"))
        return listed[1]

    def short(self, extra: int = 0) -> int:
        """How many bytes must leave for ``extra`` more to fit (0 when they fit)."""
        need = 0
        if self.limit is not None:
            need = max(need, self.usage() + extra - self.limit)
        if self.floor:
            need = max(need, self.floor + extra - shutil.disk_usage(self.s.path).free)
        return need

    def stats(self) -> dict:
        return {"limit_bytes": self.limit, "free_floor_bytes": self.floor, "used_bytes": self.usage(fresh=True),
                "free_bytes": shutil.disk_usage(self.s.path).free, "fragments_moved_to_lake": self.moved_fragments,
                "background_reliefs": self.ahead_runs, "pushes_waited": self.waits}

    # ahead of the limit (watermarks) ----------------------------------------------------------
    def ahead(self, extra: int = 0) -> None:
        """After a push: past the high watermark, queue one background relief (see the module)."""
        if self.limit is None or self.usage() + extra <= HIGH_WATER * self.limit:
            return
        with self._ahead_lock:
            if self._ahead_queued:
                return
            self._ahead_queued = True
        try:
            self.s.tasks.submit(P1, self._relieve_ahead, name="disk relief ahead", surface=False)
        except WorkerError:  # closing: the next push's admission does it synchronously
            with self._ahead_lock:
                self._ahead_queued = False

    def _relieve_ahead(self) -> None:
        try:
            low = int(LOW_WATER * self.limit)
            self.s.wal.drop_spares()
            self._drop_mirror(lambda: self.usage() > low)
            for frag, infos in self.droppable():
                if self.usage() <= low:
                    break
                self.demote(frag, infos)
            self.ahead_runs += 1
            if self.usage() > low and self.snapshot_ahead is not None:
                fut = self._snap_future
                if fut is None or fut.done():  # too little is committed: start the next snapshot now
                    self._snap_future = fut = self.snapshot_ahead()
                    fut.add_done_callback(lambda f: f.exception() is None and self.ahead())  # then look again
        except Exception as e:  # noqa: BLE001 - optional work: the push's admission still enforces the limit
            log.warning("background disk relief failed (the next push relieves synchronously): %s", e)
        finally:
            with self._ahead_lock:
                self._ahead_queued = False

    # the push's admission ----------------------------------------------------------------------
    def admit(self, nbytes: int) -> None:
        """Make room for a push of ``nbytes`` (see the module); ``BackpressureError`` if there is none."""
        if not self.short(nbytes):
            return
        self.waits += 1
        try:
            self.relieve(nbytes)
            if not self.short(nbytes):
                return
            fut = self._snap_future
            if fut is not None and not fut.done():  # a snapshot started ahead: its commit frees the most
                try:
                    fut.result()
                except Exception:  # noqa: BLE001 - the synchronous snapshot below reports the lake's error
                    pass
                self.relieve(nbytes)
                if not self.short(nbytes):
                    return
            self._snapshot()  # what is not in the lake cannot leave: put it there first
            self.relieve(nbytes)
        except LakeBufferError as e:
            raise BackpressureError(
                f"the buffer directory {self.s.path} is past its disk budget ({self._describe()}) and the lake "
                f"failed ({e}), so nothing can leave local disk; the batch was not stored. Push again once the lake "
                "is reachable, or raise disk_limit_gb / free disk space") from e
        if self.short(nbytes):
            raise BackpressureError(
                f"the buffer directory {self.s.path} is past its disk budget ({self._describe()}) and nothing more can "
                "leave local disk (hot batches' WAL and the index stay); the batch was not stored: raise "
                "disk_limit_gb, lower memory_limit_mb, or free disk space")

    def _describe(self) -> str:
        lim = f"{self.usage()} of disk_limit {self.limit} bytes used" if self.limit is not None else "no disk_limit"
        return f"{lim}, {shutil.disk_usage(self.s.path).free} bytes free, floor {self.floor}"

    # moving fragments to the cold tier ---------------------------------------------------------
    def droppable(self) -> list[tuple[int, list[BatchInfo]]]:
        """Warm fragments whose batches are all committed to the lake, with their batches, in the order
        they leave: lowest keep priority first under an ``evict=`` priority, else (and on ties) oldest first."""
        s = self.s
        with s.lock:
            by_frag: dict[int, list[BatchInfo]] = {}
            blocked: set[int] = set()
            for info in s.batches.values():
                if info.tier != "warm":
                    continue
                by_frag.setdefault(info.fragment, []).append(info)
                if info.snapshot is None or info.snapshot < 0:
                    blocked.add(info.fragment)
            out = [(f, by_frag[f]) for f in sorted(by_frag) if f not in blocked]
        policy = s.hot.policy
        if policy.by_recency:
            return out
        scores = {f: self._score(f, infos) for f, infos in out}
        return sorted(out, key=lambda fi: (scores[fi[0]] is not None, scores[fi[0]] or 0.0, fi[0]))

    def _score(self, frag: int, infos: list[BatchInfo]) -> float | None:
        """A fragment's keep priority: its best batch's (``EvictionPolicy.score``), computed once."""
        if frag not in self._scores:
            got = [self.s.hot.policy.score(m) for m in (self.s.index.batch_meta(i.batch_id) for i in infos) if m is not None]
            got = [g for g in got if g is not None]
            self._scores[frag] = max(got) if got else None
        return self._scores[frag]

    def relieve(self, extra: int = 0) -> int:
        """Move committed fragments to the cold tier until ``extra`` more bytes fit; bytes freed."""
        if not self.short(extra):
            return 0
        freed = self.s.wal.drop_spares()  # removed segments kept to be written over: the first to go
        if not self.short(extra):
            return freed
        freed += self._drop_mirror(lambda: self.short(extra) > 0)
        for frag, infos in self.droppable():
            need = self.short(extra)
            if not need:
                break
            freed += self.demote(frag, infos)
        return freed

    def _drop_mirror(self, more: Callable[[], bool]) -> int:
        """Remove mirror copies, oldest first, while ``more()`` says room is still needed; bytes freed."""
        mirror = self.cold.mirror
        freed = 0
        for rel in mirror.paths() if mirror is not None else []:
            if not more():
                break
            freed += self.drop_mirror([rel])
        return freed

    def drop_mirror(self, paths: list[str]) -> int:
        """Remove these mirror copies (their rows are read from the lake from now on); bytes freed.
        Exclusive on the read gate, as ``demote``: a running query that registered a copy finishes first."""
        mirror = self.cold.mirror
        if mirror is None or not paths:
            return 0
        gate = contextlib.nullcontext() if self.s.gate.held() else self.s.gate.exclusive()
        with gate:
            freed = sum(mirror.remove(p) for p in paths)
        if freed:
            with self.s.lock:
                self.cold.touch()  # the SQL view's sources change (the files move to the lake's side)
        return freed

    def demote(self, frag: int, infos: list[BatchInfo]) -> int:
        """Record every row of fragment ``frag`` as cold (its lake location), then remove the file.

        The lake is read outside the engine's lock; under it, a batch changed meanwhile (a delete)
        keeps the fragment for a later round."""
        s = self.s
        plans = []
        for info in infos:
            plan = cold_plan(s, info.batch_id)
            if plan is None:
                log.warning("fragment %d stays local: rows of batch %d were not found in the lake", frag, info.batch_id)
                return 0
            plans.append((info, *plan))
        # exclusive: a query that registered this fragment (sql over ``warm``) finishes before its file goes
        gate = contextlib.nullcontext() if s.gate.held() else s.gate.exclusive()
        with gate, s.lock:
            for info, n, *_ in plans:
                now = s.batches.get(info.batch_id)
                if now is None or now.tier != "warm" or now.fragment != frag or now.rows != n:
                    return 0
            nbytes = s.warm.fragment_bytes(frag)
            total = max(1, sum(n for _i, n, *_ in plans))
            moves = []
            for info, n, files, fi, rw in plans:  # a coalesced fragment's bytes shared by rows
                cold = BatchInfo(**{**info.__dict__, "tier": "cold", "fragment": None, "offset": 0,
                                    "files": [f["path"] for f in files], "checksum": None,
                                    "nbytes": nbytes * n // total})
                moves.append((cold, files, fi, rw))
            s.index.set_cold(moves)  # first: a crash now leaves a fragment recovery drops
            for cold, files, _fi, _rw in moves:
                s.batches[cold.batch_id] = cold
                self.cold.admit(cold.batch_id, cold.rows, cold.nbytes, files)
            s.warm.drop_fragments([frag])
            self.moved_fragments += 1
        return nbytes
