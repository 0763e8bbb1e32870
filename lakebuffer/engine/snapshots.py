"""Snapshots to the cold lake, reconciliation after a crash, and restore of a fresh directory.

A snapshot uploads what is new since the last one (and the deletes' tombstones) as one lake
commit. Its path: a timer thread (periodic) or ``snapshot()`` queues a p0 task, so ``flush``,
``delete`` and ``close`` wait for it like for any background work; the task runs the encoding on
the process's one snapshot thread at a lower CPU priority (``at_low_priority``). Each of the
three stays for a reason: the queue gives ordering and error surfacing, the timer is the only
periodic trigger, and the snapshot thread is what can be reniced without slowing the pushes that
share the queue's workers.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from ..errors import CorruptionError, LakeError
from ..lake import Lake
from ..schema import conform_restored
from .reads import read_batch
from .state import BufferState
from .tasks import P0
from .writeback import FragmentInstaller

log = logging.getLogger("lakebuffer")

_SNAPSHOT_THREAD: ThreadPoolExecutor | None = None
_SNAPSHOT_THREAD_LOCK = threading.Lock()


def _renice(niceness: int = 10) -> None:
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + niceness))
    except (OSError, AttributeError):  # not Linux or not allowed: normal priority
        pass


def at_low_priority(fn: Any) -> Any:
    """Run ``fn`` on the process's one snapshot thread, at a lower CPU priority, and wait for it.

    A snapshot encodes Parquet for seconds; on a small machine it must not take the cores from the
    trainer's pushes and samples. Linux schedules threads one by one (the lake's encoder threads
    inherit the priority). One long-lived thread, not one per snapshot: Arrow's Acero engine gives
    every thread that ever calls it a slot and never frees it.
    """
    global _SNAPSHOT_THREAD
    with _SNAPSHOT_THREAD_LOCK:
        if _SNAPSHOT_THREAD is None:
            _SNAPSHOT_THREAD = ThreadPoolExecutor(1, thread_name_prefix="lakebuffer-snapshot", initializer=_renice)
        pool = _SNAPSHOT_THREAD
    return pool.submit(fn).result()


class Snapshots:
    """The cold side of one buffer: snapshot, reconcile, restore, compact, and the lake's stats."""

    def __init__(self, state: BufferState, lake: Lake, lake_url: str, installer: FragmentInstaller,
                 interval_s: float | None) -> None:
        self.s = state
        self.lake = lake
        self.lake_url = lake_url
        self.installer = installer
        self.interval_s = interval_s
        self._snap_lock = threading.Lock()
        self._pending = False
        self._last: dict[str, Any] = {"id": None, "at": None, "error": None, "rows": 0, "files": 0, "bytes": 0}
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None
        self.writer_id: str | None = None  # set by claim(): this buffer's id as the run's writer

    @property
    def periodic(self) -> bool:
        return bool(self.interval_s and self.interval_s > 0)

    # the run's one writer (lake/claims.py) ----------------------------------------------
    def claim(self, takeover: bool) -> None:
        """Become the run's writer on the lake (``LockedError`` naming the current one)."""
        s = self.s
        wid = s.index.get_setting("writer_id")
        if wid is None:
            wid = uuid.uuid4().hex.encode()
            s.index.put_setting("writer_id", wid)
        self.writer_id = wid.decode()
        self.lake.claims.claim(s.run_id, self.writer_id, str(s.path.resolve()), takeover=takeover)

    def release(self) -> None:
        if self.writer_id:
            self.lake.claims.release(self.s.run_id, self.writer_id)

    # timer -------------------------------------------------------------------------------
    def start_timer(self) -> None:
        if self.periodic:
            self._timer = threading.Thread(target=self._tick, name="lakebuffer-snapshots", daemon=True)
            self._timer.start()

    def stop_timer(self) -> None:
        self._stop.set()
        if self._timer is not None:
            self._timer.join()

    def _tick(self) -> None:
        """Queue a snapshot every ``interval_s``; a failure is retried at the next tick."""
        while not self._stop.wait(self.interval_s):
            with self.s.lock:
                if self._pending:
                    continue
                self._pending = True
            try:
                self.s.tasks.submit(P0, self._periodic, name="periodic snapshot", surface=False)
            except Exception:  # noqa: BLE001 - the queue is closing
                return

    def _periodic(self) -> None:
        try:
            self.snapshot_now()
        finally:
            with self.s.lock:
                self._pending = False

    # snapshot ------------------------------------------------------------------------------
    def submit(self, progress: Any = None):
        """Queue a snapshot (p0); the future holds its manifest or its error."""
        return self.s.tasks.submit(P0, lambda: self.snapshot_now(progress), name="snapshot", surface=False)

    def snapshot_now(self, progress: Any = None) -> dict | None:
        with self._snap_lock:
            try:
                return at_low_priority(lambda: self._snapshot_locked(progress))
            except LakeError as e:
                self._last["error"] = str(e)
                log.error("snapshot to %s failed (it is retried at the next one): %s", self.lake_url, e)
                raise
            except BaseException as e:
                self._last["error"] = f"{type(e).__name__}: {e}"
                raise

    def _snapshot_locked(self, progress: Any) -> dict | None:
        s = self.s
        self.reconcile()
        with s.lock:
            pending = sorted(b for b, i in s.batches.items() if i.snapshot is None)
            tombstones = s.index.tombstones()
            next_seq = s.index.next_seq
        if not pending and not tombstones:
            return None
        self.lake.claims.check(s.run_id, str(self.writer_id))  # another buffer took the run over: refuse
        total = sum(s.batches[b].rows for b in pending if b in s.batches)
        done = 0
        included: list[int] = []

        def rows():
            nonlocal done
            for bid in pending:
                t = read_batch(s, bid)
                if t is None:
                    continue
                included.append(bid)
                done += t.num_rows
                if progress is not None:
                    progress(done, total)
                yield t

        manifest = self.lake.commit_snapshot(
            s.run_id, rows(), tombstones, meta={"batches": pending, "next_seq": next_seq, "writer": self.writer_id}, force=bool(tombstones)
        )
        with s.lock:
            infos = []
            for bid in included:
                info = s.batches.get(bid)
                if info is not None:
                    info.snapshot = manifest["snapshot_id"] if manifest else -1
                    infos.append(info)
            s.index.set_batches(infos)
            s.index.clear_tombstones(tombstones)
        if manifest:
            s.index.put_setting("last_snapshot", str(manifest["snapshot_id"]).encode())
            self._last.update(id=manifest["snapshot_id"], at=time.time(), error=None)
            self.refresh_cold()
        return manifest

    def reconcile(self) -> None:
        """Mark batches a committed snapshot holds although the index missed it (crash after commit)."""
        s = self.s
        last = s.index.get_setting("last_snapshot")
        seen = int(last.decode()) if last else 0
        newer = [sid for sid in self.lake.snapshots(s.run_id) if sid > seen]
        if not newer:
            return
        with s.lock:
            infos = []
            for sid in newer:
                meta = self.lake.manifest(s.run_id, sid).get("meta", {})
                if meta.get("writer", self.writer_id) != self.writer_id:
                    continue  # another writer's batch ids say nothing about ours
                for bid in meta.get("batches", []):
                    info = s.batches.get(bid)
                    if info is not None and info.snapshot is None:
                        info.snapshot = sid
                        infos.append(info)
            s.index.set_batches(infos)
            s.index.put_setting("last_snapshot", str(newer[-1]).encode())

    # restore -------------------------------------------------------------------------------
    def restore(self, progress: Any) -> None:
        """Fill a fresh directory with this run's rows as of its last committed snapshot."""
        s = self.s
        try:
            manifest = self.lake.latest_manifest(s.run_id)
        except LakeError as e:
            log.warning("cannot check the lake for run %r to restore: %s", s.run_id, e)
            return
        if manifest is None:
            return
        total = sum(int(f["rows"]) for f in manifest["files"])
        done = 0
        for rb in self.lake.scan_batches(s.run_id, snapshot_id=manifest["snapshot_id"]):
            table = conform_restored(pa.Table.from_batches([rb]), s.schema, s.run_id)
            self.installer.install(table, snapshot=manifest["snapshot_id"])
            done += table.num_rows
            if progress is not None:
                progress(done, total)
        s.index.set_next_seq(int(manifest.get("meta", {}).get("next_seq", 0)))
        s.index.put_setting("last_snapshot", str(manifest["snapshot_id"]).encode())
        self._last.update(id=manifest["snapshot_id"], at=None, error=None)
        log.info("restored %d rollouts of run %r from %s (snapshot %s)", done, s.run_id, self.lake_url,
                 manifest["snapshot_id"])

    # the lake's views and stats ---------------------------------------------------------
    def refresh_cold(self) -> None:
        """Point the ``cold`` (this run) and ``lake`` (all runs) views at the committed snapshots."""
        try:
            st = self.lake.stats(self.s.run_id)
            self.s.catalog.register_lake(self.lake, self.s.run_id)
        except (LakeError, CorruptionError) as e:  # the local tiers stay usable; stats() shows why
            log.warning("lake %s is not readable now: %s", self.lake_url, e)
            self._last["error"] = str(e)
            return
        self._last.update(rows=st["rows"], files=st["files"], bytes=st["bytes"])
        if self._last["id"] is None:
            self._last["id"] = st["last_snapshot_id"].get(self.s.run_id)

    def stats(self) -> dict[str, Any]:
        ls = self._last
        return {
            "rows": ls["rows"], "files": ls["files"], "bytes": ls["bytes"], "last_snapshot_id": ls["id"],
            "last_snapshot_age_s": (time.time() - ls["at"]) if ls["at"] else None,
            "last_error": ls["error"], "url": self.lake_url,
        }

    def compact(self, target_file_bytes: int, progress: Any) -> dict:
        """Rewrite this run's lake files (see ``Lake.compact``), then gc files replaced > 1 h ago."""
        with self._snap_lock:
            res = self.lake.compact(self.s.run_id, target_file_bytes=target_file_bytes, progress=progress)
            # files replaced more than an hour ago (by earlier compactions) are no reader's any more
            res["gc_removed"] = self.lake.gc(older_than_s=3600)
        self.refresh_cold()
        return res
