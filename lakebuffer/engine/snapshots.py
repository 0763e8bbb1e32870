"""Snapshots to the cold lake, reconciliation after a crash, and restore of a fresh directory.

A snapshot uploads what is new since the last one (and deletes the keys deleted since) as one
Delta commit of the lake. Its path: a timer thread (periodic) or ``snapshot()`` queues a p0 task, so ``flush``,
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
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from ..errors import CorruptionError, LakeError, OptionError
from ..lake import Lake, runtime
from ..lake.location import require_parent
from . import resume
from .deadline import bounded_call, bounded_iter
from .lakeaudit import LakeAudit, Missing, Reupload
from .reads import read_batch
from .state import BufferState
from .tasks import P0
from .writeback import FragmentInstaller

log = logging.getLogger("lakebuffer")

RESTORING = "restoring"  # index setting: the snapshot id of a restore not yet complete
PENDING = b"pending"  # its value before a fresh directory has read the lake (which snapshot is unknown yet)

_SNAPSHOT_THREAD: ThreadPoolExecutor | None = None
_SNAPSHOT_THREAD_LOCK = threading.Lock()


def _renice(niceness: int = 10) -> None:
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + niceness))
    except (OSError, AttributeError):  # not Linux or not allowed: normal priority
        pass


def at_low_priority(fn: Any, timeout_s: float | None = None) -> Any:
    """Run ``fn`` on the process's one snapshot thread, at a lower CPU priority, and wait for it
    (at most ``timeout_s``: then ``concurrent.futures.TimeoutError``, ``fn`` still running).

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
    return runtime.submit(pool, fn).result(timeout_s)


def lake_settings(memory_limit_bytes: int, buffer_dir: Any) -> dict[str, Any]:
    """The buffer's ``Lake`` options: a snapshot, restore or compaction holds at most half the buffer's
    budget (32 MiB to 256 MiB) of rows and file bytes, so it stays within the memory bound (``budget x
    1.3 + 300 MB``, DESIGN.md) with the hot tier full; files for an object store are encoded under
    ``<buffer>/tmp/lake`` (emptied at open: a crash's leftovers)."""
    mem = min(256 << 20, max(32 << 20, int(memory_limit_bytes) // 2))
    return {"memory_bytes": mem, "spill_dir": os.path.join(os.fspath(buffer_dir), "tmp", "lake")}


def open_lake(url: str, storage_options: dict | None, *, create: bool = False,
              **settings: Any) -> tuple[Lake | None, CorruptionError | None]:
    """The buffer's lake, or (None, the error) when its stored files are damaged.

    A damaged lake must not lock the user out of intact local tiers: the buffer opens without it,
    reports the error in ``stats()["cold"]`` and retries at each snapshot. An unreachable or missing
    lake still raises (``LakeError``): that is a configuration the user must see at once. So does a
    new local lake whose parent directory does not exist, unless ``create`` (``lake/location.py``).
    """
    try:
        lake = Lake(url, storage_options, **settings)
        require_parent(lake, create)
        return lake, None
    except CorruptionError as e:
        log.error("the lake %s is damaged; the buffer opens on its local tiers only: %s", url, e)
        return None, e


def damaged_lake(url: str, e: CorruptionError) -> LakeError:
    return LakeError(
        f"the lake {url} is damaged ({e}); the rows stay in the local tiers and snapshots are retried: "
        "restore the damaged file from a copy of the lake, then snapshot again")


class Snapshots:
    """The cold side of one buffer: snapshot, reconcile, restore, compact, and the lake's stats."""

    def __init__(self, state: BufferState, lake: Lake | None, lake_url: str, installer: FragmentInstaller,
                 interval_s: float | None, *, lake_error: CorruptionError | None = None,
                 storage_options: dict | None = None, max_rows: int | None = None,
                 max_bytes: int | None = None, timeout_s: float | None = None,
                 lake_settings: dict[str, Any] | None = None, restore: str = "eager") -> None:
        self.s = state
        self.restore_mode = restore  # "eager": verified local copies; "lazy"/"cold": rows in the lake (engine/resume)
        self.resumed: list[int] = []  # cold batches a resume indexed (the buffer warms them, lazy/eager)
        self.mirror: Any = None  # the local mirror an eager restore copies into (tiers/mirror), set by the buffer
        self.disk_short: Any = lambda extra: 0  # bytes over the disk budget with ``extra`` more (engine/diskbudget)
        self.lake_settings = dict(lake_settings or {})
        self.lake = lake
        self.lake_url = lake_url
        self.storage_options = storage_options
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s  # the overall deadline of one snapshot() or restore
        self.installer = installer
        self.interval_s = interval_s
        self._snap_lock = threading.Lock()
        self._pending = False
        self._last: dict[str, Any] = {"id": None, "at": None, "error": None, "rows": 0, "files": 0, "bytes": 0}
        if lake_error is not None:
            self._last["error"] = str(damaged_lake(lake_url, lake_error))
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None
        self.writer_id: str | None = None  # set by claim(): this buffer's id as the run's writer
        self._claimed = False  # whether this buffer holds the run's claim on the lake
        self.after_install: Any = lambda: None  # called after each fragment a restore installs (disk budget)
        self.audit = LakeAudit(state)  # committed rows another writer removed from the lake (engine/lakeaudit)
        self._audit_error: str | None = None

    @property
    def periodic(self) -> bool:
        return bool(self.interval_s and self.interval_s > 0)

    def current_lake(self) -> Lake:
        """The lake for reads of the cold tier (``LakeError`` while it is damaged)."""
        return self._lake()

    def _lake(self) -> Lake:
        """The lake, reopened if it was damaged at open (``LakeError`` while it still is)."""
        if self.lake is None:
            try:
                self.lake = Lake(self.lake_url, self.storage_options, **self.lake_settings)
            except CorruptionError as e:
                raise damaged_lake(self.lake_url, e) from e
        return self.lake

    # the run's one writer (lake/claims.py) ----------------------------------------------
    def claim(self, takeover: bool) -> None:
        """Become the run's writer on the lake (``LockedError`` naming the current one)."""
        s = self.s
        wid = s.index.get_setting("writer_id")
        if wid is None:
            wid = uuid.uuid4().hex.encode()
            s.index.put_setting("writer_id", wid)
        self.writer_id = wid.decode()
        if self.lake is None:  # a damaged lake (reported in stats): snapshots claim it once it is fixed
            return
        try:
            self.lake.claims.claim(s.run_id, self.writer_id, str(s.path.resolve()), takeover=takeover)
        except CorruptionError as e:  # a damaged claim file: like any damaged lake file, no lockout
            log.error("the lake %s is damaged; the buffer opens on its local tiers only: %s", self.lake_url, e)
            self._last["error"] = str(damaged_lake(self.lake_url, e))
            return
        self._claimed = True

    def release(self) -> None:
        """Give the run's claim back (best effort, within ``lake_timeout_s``: a stalled lake must not
        hold ``close()``; a claim left behind is this directory's own and is taken again at its next open)."""
        if self.writer_id and self.lake is not None and self._claimed:
            lake, run, wid = self.lake, self.s.run_id, self.writer_id
            deadline = time.monotonic() + self.timeout_s if self.timeout_s else None
            try:
                bounded_call(lambda: lake.claims.release(run, wid), deadline, lambda: self._overdue("releasing the claim"),
                             name="lakebuffer-release")
            except LakeError as e:
                log.warning("could not release the run's writer claim on %s: %s", self.lake_url, e)

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
                self.s.tasks.submit(P0, self._periodic, name="periodic snapshot", surface=False,
                                        kind="snapshot")
            except Exception:  # noqa: BLE001 - the queue is closing
                return

    def _periodic(self) -> None:
        """One bounded step; if the lake is still behind after it, the next step is queued at once
        (back to back) instead of at the next tick, so a backlog drains as fast as the lake takes it."""
        again = False
        try:
            self.snapshot_now(steps=1)
            again = self.behind() and not self._stop.is_set()
        finally:
            if again:
                try:
                    self.s.tasks.submit(P0, self._periodic, name="periodic snapshot", surface=False,
                                        kind="snapshot")
                except Exception:  # noqa: BLE001 - the queue is closing
                    again = False
            if not again:
                with self.s.lock:
                    self._pending = False

    def behind(self) -> bool:
        """Whether a stored batch is not in the lake yet."""
        with self.s.lock:
            return any(i.snapshot is None for i in self.s.batches.values())

    # snapshot ------------------------------------------------------------------------------
    def submit(self, progress: Any = None):
        """Queue a snapshot (p0); the future holds its manifest or its error."""
        return self.s.tasks.submit(P0, lambda: self.snapshot_now(progress), name="snapshot", surface=False,
                                   kind="snapshot")

    def snapshot_now(self, progress: Any = None, steps: int | None = None) -> dict | None:
        """Commit what is new, in steps of bounded size (``steps=None``: until every batch stored
        when it started is in the lake); the last step's manifest (None when nothing was new)."""
        cancel = threading.Event()
        with self._snap_lock:
            try:
                try:
                    return at_low_priority(lambda: self._snapshot_steps(progress, steps, cancel), self.timeout_s)
                except FutureTimeout:
                    # the upload stops at its next batch; if its commit still lands, reconcile() sees it
                    cancel.set()
                    raise self._overdue("snapshot") from None
            except runtime.LakeExitingError as e:  # the exit refused its next piece of work (``runtime.submit``)
                self._last["error"] = str(e)
                self._cut_by_exit()
                raise
            except LakeError as e:
                self._last["error"] = str(e)
                log.error("snapshot to %s failed (it is retried at the next one): %s", self.lake_url, e)
                raise
            except BaseException as e:
                self._last["error"] = f"{type(e).__name__}: {e}"
                raise

    def _cut_by_exit(self) -> None:
        """A snapshot the process's exit cut short: nothing is lost (the rows are in the local WAL and
        warm tier, and go to the lake at the next open), which the user should read instead of a failure."""
        log.warning("lakebuffer: the process exited during a snapshot to %s; the rows not in the lake yet stay "
                    "in %s and go to the lake at the next open (close() the buffer before exit to finish it)",
                    self.lake_url, self.s.path)

    def _overdue(self, what: str) -> LakeError:
        return LakeError(
            f"{what} to/from lake {self.lake_url} did not finish within lake_timeout_s={self.timeout_s:g} s (is the "
            "endpoint stalled?); the rows are safe locally and a snapshot is retried at the next one: check the "
            "endpoint, or open with a larger lake_timeout_s")

    def _snapshot_steps(self, progress: Any, steps: int | None, cancel: threading.Event) -> dict | None:
        with self.s.lock:
            last = max(self.s.batches, default=-1)
        result = None
        n = 0
        while True:
            if cancel.is_set():
                raise self._overdue("snapshot")
            manifest, more = self._snapshot_locked(progress, upto=last, cancel=cancel)
            result = manifest or result
            n += 1
            if manifest is None or not more or (steps is not None and n >= steps):
                return result

    def _step(self, pending: list[int]) -> list[int]:
        """The first batches of ``pending`` within the per-snapshot bounds (at least one)."""
        rows = nbytes = 0
        for i, bid in enumerate(pending):
            info = self.s.batches[bid]
            rows += info.rows
            nbytes += info.nbytes
            if i and ((self.max_rows and rows > self.max_rows) or (self.max_bytes and nbytes > self.max_bytes)):
                return pending[:i]
        return pending

    def _snapshot_locked(self, progress: Any, upto: int | None = None,
                         cancel: threading.Event | None = None) -> tuple[dict | None, bool]:
        """One bounded commit; (its manifest, whether batches up to ``upto`` are still behind)."""
        s = self.s
        self.reconcile()  # a damaged manifest is reported as the lake's (damaged_lake), the index's as its own
        found = self._audit()
        again = Reupload(s, found) if found is not None else None  # rows another writer removed
        with s.lock:
            behind = sorted(b for b, i in s.batches.items() if i.snapshot is None and (upto is None or b <= upto))
            pending = self._step(behind)
            tombstones = s.index.tombstones()
            next_seq = s.index.next_seq
            s.uploading.update(pending)  # a delete meanwhile tombstones their rows (engine/deletes)
        try:
            return self._upload(progress, pending, tombstones, next_seq, len(pending) < len(behind), cancel, found, again)
        finally:
            with s.lock:
                s.uploading.difference_update(pending)

    def _upload(self, progress: Any, pending: list[int], tombstones: list, next_seq: int, more: bool,
                cancel: threading.Event | None, found: Missing | None = None,
                again: Reupload | None = None) -> tuple[dict | None, bool]:
        s = self.s
        if not pending and not tombstones and (again is None or not again.wanted):
            return None, False
        lake = self._lake()
        if self._claimed:  # another buffer took the run over since: refuse
            lake.claims.check(s.run_id, str(self.writer_id))
        else:  # the lake was damaged at open: claim it now that it reads
            try:
                lake.claims.claim(s.run_id, str(self.writer_id), str(s.path.resolve()), takeover=False)
            except CorruptionError as e:
                raise damaged_lake(self.lake_url, e) from e
            self._claimed = True
        total = sum(s.batches[b].rows for b in pending if b in s.batches) + (found.rows if found is not None else 0)
        done = 0
        included: list[int] = []

        def rows():
            nonlocal done
            for bid in pending:
                if cancel is not None and cancel.is_set():
                    raise self._overdue("snapshot")  # before the commit: nothing is committed
                try:
                    t = read_batch(s, bid)
                except CorruptionError as e:
                    local.append(e)  # a damaged local copy: its own error, not the lake's
                    raise
                if t is None:
                    continue
                included.append(bid)
                done += t.num_rows
                if progress is not None:
                    progress(done, total)
                yield t
            for t in again.tables() if again is not None else ():
                done += t.num_rows
                if progress is not None:
                    progress(done, total)
                yield t

        local: list[CorruptionError] = []
        try:
            manifest = self._lake().commit_snapshot(
                s.run_id, rows(), tombstones, meta={"batches": pending, "next_seq": next_seq, "writer": self.writer_id}, force=bool(tombstones)
            )
        except CorruptionError as e:
            if e in local or (again is not None and e is again.damage):
                raise
            raise damaged_lake(self.lake_url, e) from e
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
            done_again = (again.rows, again.lost) if again is not None else (0, None)
            self.audit.committed(found, int(manifest["version"]), *done_again)
        elif found is not None:
            self.audit.settle(found)
        if manifest:
            s.index.put_setting("last_snapshot", str(manifest["snapshot_id"]).encode())
            self._last.update(id=manifest["snapshot_id"], at=time.time(), error=None)
            self.refresh_cold()
        return manifest, more

    def _audit(self) -> Missing | None:
        """``LakeAudit.check`` on the lake; its failure is reported (``stats()["cold"]["audit_error"]``)
        and retried at the next snapshot, but never holds up the snapshot itself."""
        try:
            found = self.audit.check(self._lake())
        except (LakeError, CorruptionError) as e:
            self._audit_error = f"{type(e).__name__}: {e}"
            log.warning("could not check lake %s for rows of run %r removed by another writer: %s",
                        self.lake_url, self.s.run_id, e)
            return None
        self._audit_error = None
        return found

    def reconcile(self) -> None:
        """Mark batches a committed snapshot holds although the index missed it (crash after commit).

        The lake is read first (a damaged manifest raises ``damaged_lake``), then the index is
        updated (its own errors, named as the index's, pass through unchanged)."""
        s = self.s
        last = s.index.get_setting("last_snapshot")
        seen = int(last.decode()) if last else 0
        lake = self._lake()
        try:
            docs = lake.snapshot_docs(s.run_id)
        except CorruptionError as e:  # a damaged log of the lake
            raise damaged_lake(self.lake_url, e) from e
        newer = sorted(sid for sid in docs if sid > seen)
        metas = [(sid, docs[sid].get("meta", {})) for sid in newer]
        if not newer:
            return
        with s.lock:
            infos = []
            for sid, meta in metas:
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
    def restore(self, progress: Any, fresh: bool) -> None:
        """Fill a fresh directory with this run's rows as of its last committed snapshot, or finish
        a restore that was interrupted (the ``restoring`` marker), before anything is served.

        The marker (the snapshot id) is written before the first fragment and removed after the
        last, and the key sequence is moved past the lake's keys before any fragment: a reopen
        after an outage or a crash mid-restore resumes it (skipping rows already installed) or,
        while the lake cannot be read, refuses to open, never serving part of the run.
        """
        s = self.s
        marker = s.index.get_setting(RESTORING)
        if not fresh and marker is None:
            return
        if marker == PENDING:  # a fresh directory that has not read the lake yet
            marker, fresh = None, True
        deadline = time.monotonic() + self.timeout_s if self.timeout_s else None
        overdue = lambda: self._overdue("restore")  # noqa: E731
        try:
            lake = self._lake()
            if marker is None:
                manifest = bounded_call(lambda: lake.latest_manifest(s.run_id), deadline, overdue)
            else:
                manifest = bounded_call(lambda: lake.manifest(s.run_id, int(marker.decode())), deadline, overdue)
        except (LakeError, CorruptionError) as e:
            if marker is not None:
                raise self._interrupted(None, None, e) from e
            raise self._unreadable(e) from e
        if manifest is None:
            if s.index.get_setting(RESTORING) == PENDING:
                s.index.delete_setting(RESTORING)  # the lake holds nothing of the run: a new run
            return
        sid = manifest["snapshot_id"]
        if self.restore_mode == "eager":
            self._check_room(manifest)  # before any mark: a refused directory stays as it was
        s.index.set_next_seq(int(manifest.get("meta", {}).get("next_seq", 0)))  # before any push
        s.index.put_setting(RESTORING, str(sid).encode())
        total = sum(int(f["rows"]) for f in manifest["files"])
        if self.restore_mode == "eager":  # verified copies of the files, indexed from the copies (tiers/mirror)
            items = resume.copy_and_read_meta(lake, self.mirror, manifest, s.meta_columns)
        else:  # engine/resume: the metadata columns only, rows stay cold (in the lake)
            items = resume.read_meta(lake, manifest, s.meta_columns)
        groups = bounded_iter(items, deadline, overdue, name="lakebuffer-resume")
        try:  # nothing is served until it completes; only what the lake raised is the lake's
            self.resumed = resume.index_cold(s, resume.lake_side(groups), sid, total, progress, first=marker is None)
        except resume.LakeSide as e:
            raise self._interrupted(None, total, e.error) from e.error
        except CorruptionError as e:
            raise self._local_damage(e) from e
        finally:
            groups.close()
        self._restored(sid, total)

    def _check_room(self, manifest: dict) -> None:
        """An eager restore copies the run's lake files to local disk: refuse, before copying anything,
        when they do not fit ``disk_limit_gb`` (and the free-space floor)."""
        need = resume.bytes_to_copy(self.mirror, manifest)
        over = self.disk_short(need)
        if over:
            raise OptionError(
                f"restore='eager' copies run {self.s.run_id!r}'s lake files ({need} bytes) to {self.s.path}, "
                f"{over} bytes more than its disk budget (disk_limit_gb and the free-space floor) allows; nothing "
                "was copied. Open with restore='lazy' (rows are served from the lake at once and warmed within the "
                "budget) or 'cold', or raise disk_limit_gb")

    def _restored(self, sid: int, rows: int) -> None:
        s = self.s
        s.index.put_setting("last_snapshot", str(sid).encode())
        s.index.delete_setting(RESTORING)
        self._last.update(id=sid, at=None, error=None)
        log.info("restored %d rollouts of run %r from %s (snapshot %s, %s)", rows, s.run_id, self.lake_url, sid,
                 self.restore_mode)

    def _interrupted(self, done: int | None, total: int | None, e: Exception) -> LakeError | CorruptionError:
        """The refusal of a restore the lake interrupted; a damaged lake file stays a ``CorruptionError``."""
        where = f" after {done} of {total} rows" if done is not None else ""
        damaged = isinstance(e, CorruptionError)
        when = "once the damaged lake file is restored from a copy" if damaged else "once the lake is reachable"
        return (CorruptionError if damaged else LakeError)(
            f"the restore of run {self.s.run_id!r} into {self.s.path} from {self.lake_url} was interrupted{where} "
            f"({e}); nothing is served until it completes: open the buffer again {when} "
            f"(the restore resumes where it stopped), or delete {self.s.path} to give it up")

    def _unreadable(self, e: Exception) -> LakeError:
        """The refusal of a fresh directory's resume while the lake cannot be read (issue 24): opening
        empty would serve none of the run's rows and generate keys the lake already holds."""
        what = "is damaged" if isinstance(e, CorruptionError) else "cannot be read"
        return LakeError(
            f"cannot resume run {self.s.run_id!r} into {self.s.path}: the lake {self.lake_url} {what} ({e}), so "
            "which rows and keys the run already has is unknown. Nothing is served and no key is generated until "
            "the lake reads: repair or restore its _delta_log from a copy (`lakebuffer fsck` names damaged files) "
            f"or make it reachable, then open again (the directory stays a fresh resume); or open with another "
            "run_id to start a new run")

    def _local_damage(self, e: CorruptionError) -> CorruptionError:
        """The refusal of a restore whose local side (the key index, the warm tier) is damaged: the
        lake is fine, so the message names the local part and its fix, not the lake."""
        return CorruptionError(
            f"{e} [while restoring run {self.s.run_id!r} into {self.s.path}; the lake {self.lake_url} is not at fault. "
            f"Nothing is served until the restore completes: after `lakebuffer fsck --repair {self.s.path}` opening "
            f"again resumes it; or delete {self.s.path} (it holds only rows restored from the lake) and open again]")

    # the lake's views and stats ---------------------------------------------------------
    def refresh_cold(self) -> None:
        """Point the ``cold`` (this run) and ``lake`` (all runs) views at the committed snapshots."""
        try:
            lake = self._lake()
            st = lake.stats(self.s.run_id)
            self.s.catalog.register_lake(lake, self.s.run_id)
            if self.s.cold is not None:
                self.s.cold.invalidate()
            if self.s.cold is not None and self.s.cold.batch_ids():
                m = lake.latest_manifest(self.s.run_id)
                self.s.cold.refresh(m["files"] if m else [])
        except (LakeError, CorruptionError) as e:
            log.warning("lake %s is not readable now: %s", self.lake_url, e)
            self._last["error"] = str(damaged_lake(self.lake_url, e) if isinstance(e, CorruptionError) else e)
            return
        self._last.update(rows=st["rows"], files=st["files"], bytes=st["bytes"])
        if self._last["id"] is None:
            self._last["id"] = st["last_snapshot_id"].get(self.s.run_id)

    def stats(self) -> dict[str, Any]:
        ls = self._last
        with self.s.lock:
            behind = [i for i in self.s.batches.values() if i.snapshot is None]
        now = time.time()
        return {
            "lag_rows": sum(i.rows for i in behind),
            "lag_s": max(0.0, now - min(i.created_at for i in behind)) if behind else 0.0,
            "rows": ls["rows"], "files": ls["files"], "bytes": ls["bytes"], "last_snapshot_id": ls["id"],
            "last_snapshot_age_s": (time.time() - ls["at"]) if ls["at"] else None,
            "last_error": ls["error"], "url": self.lake_url,
            **self.audit.stats(), "audit_error": self._audit_error,
        }

    def compact(self, target_file_bytes: int, progress: Any) -> dict:
        """Rewrite this run's lake files (see ``Lake.compact``), then gc files replaced > 1 h ago."""
        with self._snap_lock:
            lake = self._lake()
            res = lake.compact(self.s.run_id, target_file_bytes=target_file_bytes, progress=progress)
            # files replaced more than an hour ago (by earlier compactions) are no reader's any more
            res["gc_removed"] = lake.gc(older_than_s=3600)
        self.refresh_cold()
        return res
