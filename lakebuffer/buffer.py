"""``ReplayBuffer``: the facade. It composes the parts and holds the locks; it does no tier work.

Data flows one way, push -> hot -> warm -> cold; reads see every tier. The parts:

* ``tiers/``: ``HotTier`` (RAM), ``WarmTier`` (memory-mapped Arrow IPC fragments), the WAL; ``index.KeyIndex`` (RocksDB).
* ``catalog.Catalog`` (DuckDB): views over the tiers, ``meta``, and the replay counts.
* ``engine/``: ``budget`` (RAM), ``ingest`` (push), ``writeback`` (eviction and the one
  install-fragment path), ``reads`` (get/scan), ``deletes``, ``recovery``, ``snapshots`` (the lake),
  ``tasks`` (background work), ``dirlock`` (one writer per directory).

The ordering rules that make this safe live in those modules: a batch is in the WAL and the index
before ``push`` returns, in the warm tier before it leaves RAM, and the index, the warm version
readers see and the hot tier change together under one lock (``BufferState.lock``).
"""

from __future__ import annotations

import contextlib
import html
import logging
import os
import shutil
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from . import display
from . import samplers as _samplers
from .catalog import Catalog
from .engine import deletes, priorities, reads
from .engine.budget import Budget
from .engine.deadline import bounded_call, deadline
from .engine.dirlock import DirLock
from .engine.diskbudget import DiskBudget
from .engine.ingest import Ingest
from .engine.promotion import ColdPromotion
from .engine.recovery import recover, refuse_damaged_index
from .engine.replays import ReplayLog
from .engine.retention import Retention
from .engine.snapshots import PENDING, RESTORING, Snapshots, lake_settings, open_lake
from .engine.state import BufferState
from .engine.tasks import P1, TaskQueue
from .engine.writeback import WriteBack
from .errors import ClosedError, LakeBufferError, LakeError, OptionError, SchemaError, StorageError
from .index import KeyIndex
from .lake.pages import cache_bytes_for
from .options import BufferOptions
from .results import Snapshot
from .sandbox import QUERY_MEMORY_FLOOR
from .schema import merge_schema, metadata_columns
from .tiers import HotTier, WarmTier, WriteAheadLog, warm_path
from .tiers.cold import ColdTier
from .tiers.eviction import EvictionPolicy
from .tiers.mirror import LocalMirror

log = logging.getLogger("lakebuffer")


class ReplayBuffer:
    """A tiered, persistent replay buffer of RL rollouts. Build one with ``ReplayBuffer.open``."""

    # construction -------------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        path: str | os.PathLike,
        lake: str | None = None,
        memory_limit_mb: float | None = 1024,
        snapshot_interval_s: float = 180,
        storage_options: dict | None = None,
        schema: pa.Schema | None = None,
        run_id: str | None = None,
        *,
        durability: str = "wal",
        sync: bool = False,
        push_timeout_s: float = 60.0,
        key_prefix: str | None = None,
        duckdb_threads: int | None = None,
        progress: Any = None,
        max_rows: int | None = None,
        max_policy_lag: int | None = None,
        snapshot_max_rows: int | None = None,
        snapshot_max_bytes: int | None = 512 * 2**20,
        lake_timeout_s: float | None = 120.0,
        takeover: bool = False,
        evict: str = "lru",
        disk_limit_gb: float | None = None,
        disk_free_floor_gb: float | None = None,
        promote_cold_reads: bool = False,
        restore: str = "lazy",
        create_lake: bool = False,
    ) -> ReplayBuffer:
        """Open (creating or recovering) the buffer stored in directory ``path``.

        ``lake`` is the cold tier's fsspec URL (default ``<path>/lake``). An empty or missing ``path``
        whose ``run_id`` has committed snapshots in ``lake`` resumes from the last one (``progress(done,
        total)``): ``restore="lazy"`` (default) indexes its rows as cold from the lake's metadata columns
        (``sample``/``get`` served at once) and warms them in the background within ``disk_limit_gb``;
        ``"cold"`` the same without warming; ``"eager"`` copies every row to the warm tier before ``open``
        returns. While the lake cannot be read, such an open raises ``LakeError`` (never an empty run).
        Retention: past ``max_rows`` stored rows a push deletes the oldest, and rows more than
        ``max_policy_lag`` versions behind the newest are deleted (from every tier and the lake).
        A snapshot commits at most ``snapshot_max_rows`` rows / ``snapshot_max_bytes`` bytes; a backlog
        is drained in such steps, back to back (``stats()["cold"]`` reports ``lag_rows``/``lag_s``).
        ``lake_timeout_s`` bounds one snapshot or restore: past it they raise ``LakeError`` (a snapshot's
        rows stay local and are retried).
        One buffer writes a run: another one open on the same (lake, run_id) raises ``LockedError``;
        ``takeover=True`` replaces the claim of a writer that is gone (crashed) for good.
        ``evict`` orders what leaves RAM first: ``"lru"``, ``"oldest_version"`` or a SQL keep priority
        over metadata columns, e.g. ``"policy_version * 10 + reward"`` (``lakebuffer.tiers.eviction``).
        ``disk_limit_gb`` bounds the directory's WAL, warm fragments and index; ``disk_free_floor_gb`` keeps
        that much free on its filesystem (default: 1 GB or 5 %, whichever is less). Past either, fragments
        already in the lake leave local disk and are read from the lake (the cold tier); rows not in the
        lake are snapshotted first, and if the lake cannot take them ``push`` raises ``BackpressureError``.
        ``promote_cold_reads=True`` brings each cold batch a ``get`` or ``sample`` read back to local disk
        in the background, while the disk budget has room (``engine/promotion``).
        A local ``lake`` that does not exist yet is created at the first snapshot only if its parent
        directory exists (else ``LakeError``: a typo must not scatter a lake); ``create_lake=True`` makes
        the directories. On S3 the bucket must exist; any prefix in it is fine.
        """
        options = {k: v for k, v in locals().items() if k not in ("cls", "path")}
        return cls(Path(path), BufferOptions(**options))

    @classmethod
    def open_lake(cls, url: str, storage_options: dict | None = None, run_id: str | None = None):
        """A read-only view over every run in the lake at ``url`` (same ``sql``/``sample``/``get``)."""
        from .lakeview import LakeView

        return LakeView(url, storage_options=storage_options, run_id=run_id)

    def __init__(self, path: Path, options: BufferOptions | None = None, **kwargs: Any) -> None:
        """Use ``ReplayBuffer.open`` (it documents the options)."""
        self.options = options if options is not None else BufferOptions(**kwargs)
        self.path = Path(path)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StorageError(f"cannot use {self.path} as a buffer directory ({type(e).__name__}: {e}): pass "
                               "a directory, or a path whose parent can hold one") from e
        self._dirlock = DirLock(self.path).acquire()
        self._closed = False
        try:
            self._open_parts(self.options)
        except BaseException:
            self._shutdown_parts()
            self._dirlock.release()
            raise

    def _open_parts(self, o: BufferOptions) -> None:
        refuse_damaged_index(self.path)  # read-only first: a damaged index must not delete anything
        self.index = KeyIndex(self.path / "index")
        stored_run = self.index.get_setting("run_id")
        fresh = stored_run is None
        self.run_id = o.run_id or (stored_run.decode() if stored_run else self.path.resolve().name)
        if stored_run is not None and o.run_id and o.run_id != stored_run.decode():
            raise OptionError(f"{self.path} holds run {stored_run.decode()!r}, not {o.run_id!r}: open it with "
                              f"run_id={stored_run.decode()!r} (or None), or use another directory for run {o.run_id!r}")
        self.schema = self._resolve_schema(o.schema)
        self.key_prefix = o.key_prefix or self.run_id
        self.durability = o.durability
        self.memory_limit_bytes = self._resolve_budget(o)
        self.storage_options = o.storage_options
        restored_from = self.index.get_setting("restored_from")  # a restored run keeps its source lake
        self.restored_from = restored_from.decode() if restored_from else None
        self.lake_url = o.lake or self.restored_from or str(self.path / "lake")
        # a missing bucket fails here, clearly; a damaged lake leaves self.lake None (see open_lake)
        lake_opts = lake_settings(self.memory_limit_bytes, self.path)
        shutil.rmtree(lake_opts["spill_dir"], ignore_errors=True)
        # within lake_timeout_s: a stalled endpoint must not hold the open (and the directory) forever
        self.lake, lake_error = bounded_call(lambda: open_lake(self.lake_url, o.storage_options, create=o.create_lake,
                                                               **lake_opts),
                                             deadline(o.lake_timeout_s), lambda: self._lake_overdue(o.lake_timeout_s),
                                             name="lakebuffer-open-lake")
        self.index.put_setting("lake", self.lake_url.encode())  # for fsck's repair from the lake (no secrets)
        self.meta_columns = metadata_columns(self.schema)
        # DuckDB gets half the budget (metadata table + query memory; the hot tier keeps the rest, see
        # engine/budget.py), at least QUERY_MEMORY_FLOOR, and spills past it into the buffer's own folder,
        # emptied of a crash's leftovers
        spill = self.path / "tmp" / "duckdb"
        shutil.rmtree(spill, ignore_errors=True)
        spill.parent.mkdir(exist_ok=True)  # DuckDB creates the folder itself, not its parents
        self._catalog = Catalog(self.schema, self.meta_columns, threads=o.duckdb_threads,
                                memory_limit_bytes=max(self.memory_limit_bytes // 2, QUERY_MEMORY_FLOOR), spill_dir=spill)
        # two workers: a long snapshot upload (p0) must not stall write-back (p1), or pushes would block
        self.tasks = TaskQueue(workers=2)
        self._layouts_stop = threading.Event()  # set by close: reading cold layouts ahead ends early
        self._state = s = BufferState(
            path=self.path, run_id=self.run_id, schema=self.schema, meta_columns=self.meta_columns,
            durability=o.durability, index=self.index, hot=HotTier(self.schema, EvictionPolicy(o.evict, frozenset(self.meta_columns))),
            warm=WarmTier(warm_path(self.path), self.schema, sync=o.sync),
            wal=WriteAheadLog(self.path / "wal", sync=o.sync, spares=True), catalog=self._catalog, tasks=self.tasks,
        )
        self.hot, self.warm, self.wal, self._batches = s.hot, s.warm, s.wal, s.batches
        # the metadata catalog and the cold tier's footer cache share the budget with the hot tier
        self._budget = Budget(self.memory_limit_bytes, lambda: self._catalog.memory_bytes + (s.cold.memory_bytes() if s.cold is not None else 0), s.lock,
                              rows=lambda: sum(i.rows for i in s.batches.values()))
        self._writeback = WriteBack(s, self._budget)
        self._snapshots = Snapshots(s, self.lake, self.lake_url, self._writeback.installer, o.snapshot_interval_s,
                                    lake_error=lake_error, storage_options=o.storage_options,
                                    max_rows=o.snapshot_max_rows, max_bytes=o.snapshot_max_bytes,
                                    timeout_s=o.lake_timeout_s, lake_settings=lake_opts, restore=o.restore)
        s.cold = ColdTier(self._snapshots.current_lake, self.run_id, self.schema,
                          cache_bytes=cache_bytes_for(self.memory_limit_bytes))
        s.cold.mirror = self._snapshots.mirror = LocalMirror(self.path / "mirror")  # restore="eager"'s copies
        if o.disk_limit_bytes is not None:  # spare WAL files may take 1/16 of the disk budget at most
            s.wal.spare_limit_bytes = min(s.wal.spare_limit_bytes, o.disk_limit_bytes // 16)
        self._disk = DiskBudget(s, s.cold, o.disk_limit_bytes, o.disk_free_floor_bytes,
                                snapshot=self._snapshots.snapshot_now)
        self._snapshots.disk_short = self._disk.short
        self._snapshots.after_install = self._disk.relieve  # a restore stays within the disk budget
        self._disk.snapshot_ahead = self._snapshots.submit  # past the high watermark: snapshot ahead
        self._promotion = ColdPromotion(s, self._disk, o.promote_cold_reads)
        s.on_cold_read = self._promotion.note
        self._ingest = Ingest(s, self._budget, self._writeback, key_prefix=self.key_prefix,
                              push_timeout_s=o.push_timeout_s, disk=self._disk)
        self._catalog.attach_tiers([s.hot, s.warm, s.cold], s.lock)
        self._catalog.run_in_background(self.tasks, self.index.add_sample_counts,
                                        on_flushed=self._writeback.evict_past_high_mark)
        self._catalog.persist_priorities_with(self.index.set_priorities)
        self._replays = ReplayLog(self.path / "replays", self._catalog, self.tasks)
        self._retention = Retention(s, self._budget, self._writeback, max_rows=o.max_rows,
                                    max_policy_lag=o.max_policy_lag)
        self._snapshots.claim(o.takeover)  # before anything reads or writes the run's lake side
        if fresh:  # only now: a directory refused above stays fresh (it restores when it opens)
            # the resume is pending until the lake has been read: a refusal or a crash before then
            # leaves the mark, and the next open checks the lake again instead of opening empty
            self.index.put_setting(RESTORING, PENDING)
            self.index.put_setting("run_id", self.run_id.encode())
        recover(s, self._writeback)
        self._catalog.load_priorities(self.index.priorities())
        self._replays.load()
        restoring = fresh or self.index.get_setting(RESTORING) is not None
        self._snapshots.restore(o.progress, fresh)  # or resume an interrupted one (refused if it cannot)
        if restoring and self.restored_from is None and self.index.get_setting("last_snapshot") is not None:
            self.restored_from = self.lake_url
            self.index.put_setting("restored_from", self.lake_url.encode())
        self._snapshots.refresh_cold()
        self._warm_resumed(o)
        self._read_layouts_ahead()
        self._snapshots.start_timer()

    def _lake_overdue(self, timeout_s: float | None) -> LakeError:
        return LakeError(f"cannot reach lake {self.lake_url}: no answer within lake_timeout_s={timeout_s} s "
                         "while opening it; check the endpoint and network (or raise lake_timeout_s), then open again")

    def _read_layouts_ahead(self) -> None:
        """The cold files' page layouts (footers, offset indexes: metadata) read ahead of the first cold
        call (best effort: a file it cannot read is left for the take that asks). After a resume, read
        and parsed before ``open`` returns: in the background they competed with that first call for the
        GIL (8 GB, 131 files: first call 134-166 ms so, 77-110 ms read here; BENCHMARKS.md "#23, eighth
        session"). A reopen reads them in the background."""
        cold, stop = self._state.cold, self._layouts_stop
        if cold is None or not cold.batch_ids():
            return
        resumed = bool(self._snapshots.resumed)

        def read() -> None:
            try:
                cold.read_layouts_ahead(stop=stop.is_set, decode=resumed)  # a close does not wait for all of it
            except LakeBufferError:  # the lake unreachable or gone: the first read reports it
                pass
        if resumed:
            read()
        else:
            self.tasks.submit(P1, read, name="cold layouts ahead", surface=False)

    def _warm_resumed(self, o: BufferOptions) -> None:
        """``restore="lazy"`` (and ``"eager"``, from its local copies): warm the resumed run's cold batches
        into warm fragments in the background, newest first, within the disk budget; a ``warming`` mark
        carries an unfinished warm over to the next open."""
        if o.restore not in ("lazy", "eager"):
            return
        resumed = bool(self._snapshots.resumed)
        if resumed:
            self.index.put_setting("warming", b"1")
        if resumed or self.index.get_setting("warming") is not None:
            # what is still cold: also the batches an interrupted earlier attempt of this resume indexed
            with self._state.lock:
                batches = sorted(b for b, i in self._batches.items() if i.tier == "cold")
            if not batches:
                self.index.delete_setting("warming")
            if batches:
                self._promotion.warm(reversed(batches), background=True)

    def _shutdown_parts(self) -> None:
        """Release what a failed open had started (best effort; the first error is what matters)."""
        snapshots = getattr(self, "_snapshots", None)
        if snapshots is not None:
            with contextlib.suppress(Exception):
                snapshots.release()
            snapshots.stop_timer()
        for name, stop in (("tasks", "stop"), ("_catalog", "close"), ("index", "close"), ("hot", "clear")):
            part = getattr(self, name, None)
            if part is not None:
                try:
                    getattr(part, stop)()
                except Exception:  # noqa: BLE001 - already failing; the first error is what matters
                    pass

    def _resolve_budget(self, o: BufferOptions) -> int:
        """The RAM budget: as given (and remembered), or with ``memory_limit_mb=None`` (the CLI's tools)
        the one the run was last opened with, so ``stats`` shows the run's budget, not a default."""
        if o.memory_limit_mb is None:
            stored = self.index.get_setting("memory_limit_bytes")
            if stored is not None:
                return int(stored.decode())
            return o.memory_limit_bytes
        self.index.put_setting("memory_limit_bytes", str(o.memory_limit_bytes).encode())
        return o.memory_limit_bytes

    def _resolve_schema(self, user: pa.Schema | None) -> pa.Schema:
        stored = self.index.get_setting("schema")
        wanted = merge_schema(user)
        if stored is None:
            self.index.put_setting("schema", wanted.serialize().to_pybytes())
            return wanted
        have = pa.ipc.read_schema(pa.py_buffer(stored))
        if user is not None and not have.equals(wanted, check_metadata=False):
            raise SchemaError(f"{self.path} was created with schema\n{have}\nwhich differs from the one given")
        return have

    def _check(self) -> None:
        if self._closed:
            raise ClosedError("this ReplayBuffer is closed; open it again with ReplayBuffer.open")
        self.tasks.check()

    @property
    def catalog(self) -> Catalog:
        """The metadata catalog samplers draw from (``meta``, ``rollouts``): for code that samples
        this buffer's rows itself, e.g. a shard of a ``ShardedReplayBuffer``."""
        self._check()
        return self._catalog

    def record_replays(self, keys: pa.Array) -> None:
        """Count one replay of each key (repeats count again), as ``sample`` does for what it draws:
        for keys chosen elsewhere (a sharded buffer's coordinator draws over every shard)."""
        self._check()
        self._catalog.record_replays(keys)
        self._replays.record(keys)

    # options kept as attributes (read by tools and tests) -----------------------------------
    @property
    def push_timeout_s(self) -> float:
        return self._ingest.push_timeout_s

    @property
    def snapshot_interval_s(self) -> float | None:
        return self.options.snapshot_interval_s

    # writes -------------------------------------------------------------------------------
    def push(self, batch: Any) -> pa.Array:
        """Validate and store a batch of rollouts; returns their keys (a string array).

        In ``durability="wal"`` mode the rows are on local disk when this returns. Raises
        ``SchemaError`` (nothing stored) or ``BackpressureError`` (nothing stored).
        """
        self._check()
        keys = self._ingest.push(batch)
        self._retention.after_push()
        return keys

    def extend(self, batch: Any) -> pa.Array:
        """TorchRL's name for ``push``: store a batch of rollouts, return their keys."""
        return self.push(batch)

    def update_priority(self, keys: Sequence[str] | pa.Array, priority: Any) -> int:
        """Set the priority the ``priority`` sampler uses for these rollouts (TorchRL's
        ``update_priority``): one value per key or a scalar; durable when it returns, kept across
        reopens. Returns how many keys were set; ``KeyNotFoundError`` for an unknown key."""
        self._check()
        return priorities.update_priority(self._state, keys, priority)

    def delete(self, keys: Sequence[str] | pa.Array | None = None, where: str | None = None) -> int:
        """Delete rollouts by key and/or predicate; returns how many rows were deleted."""
        self._check()
        return deletes.delete(self._state, self._budget, self._writeback, keys, where)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until queued background work (write-back, replay counts) is done and durable."""
        self._check()
        if not self.tasks.drain(timeout):
            raise TimeoutError(f"background work still queued after {timeout} s")
        self.tasks.check()
        self.index.flush()
        self._catalog.warm_now()  # queued metadata inserts applied: the next sample does not pay them

    def evict_all(self) -> None:
        """Write every hot batch to the warm tier now (e.g. before a planned shutdown)."""
        self._check()
        self._writeback.evict_all()
        self.flush()

    # reads --------------------------------------------------------------------------------
    def get(self, keys: Sequence[str] | pa.Array, columns: Sequence[str] | None = None) -> pa.Table:
        """Rows for ``keys`` in the order given, with only ``columns`` read (all if None)."""
        self._check()
        return reads.get(self._state, keys, columns)

    def sample(
        self,
        n: int,
        where: str | None = None,
        sampler: str | _samplers.Sampler | type | None = "uniform",
        columns: Sequence[str] | None = None,
        seed: int | None = 0,
        return_keys: bool = False,
        return_info: bool = False,
        **options: Any,
    ) -> pa.Table | pa.Array | tuple[pa.Table | pa.Array, dict[str, pa.Array]]:
        """Choose ``n`` rollouts matching ``where`` with ``sampler`` and fetch ``columns``.

        Deterministic given ``seed`` and the buffer's contents. Raises ``NotEnoughRowsError`` when
        the predicate matches fewer rows than asked (and ``QueryError`` for a bad predicate).
        ``return_keys=True`` returns only the keys (fetch payload later with ``get``).
        ``return_info=True`` returns ``(rows, info)`` as TorchRL does: ``info["keys"]``, and for
        the ``priority`` sampler ``info["weights"]`` (importance weights, ``beta`` a sampler
        option) and ``info["probabilities"]``.
        A ``delete`` in another thread waits for the sample (or the sample for it): the rows returned
        exist when the sample runs, never half of a delete.
        """
        self._check()
        strategy = _samplers.resolve(sampler, **options)
        catalog = self._catalog
        with self._state.gate.shared():  # no delete between the selection and the fetch (engine/readgate)
            catalog.sync()
            if strategy.needs_counts:
                keys = _samplers.draw(strategy, catalog, n, where, seed)
            else:
                with catalog.counts_deferred():
                    keys = _samplers.draw(strategy, catalog, n, where, seed)
            self.record_replays(keys)
            out = keys if return_keys else self.get(keys, columns)
        if return_info:
            return out, strategy.info(catalog, keys, where)
        return out

    def set_policy_version(self, version: int | None, step: int | None = None) -> None:
        """Say which policy version (and trainer step) replays from now on: every later ``sample``
        records it per drawn key in the ``replays`` table, so policy lag is measured at replay
        (``replay_version - policy_version``), not against the newest version pushed."""
        self._check()
        self._replays.set_policy_version(version, step)

    def scan(
        self, where: str | None = None, columns: Sequence[str] | None = None, batch_size: int | None = None
    ) -> Iterator[pa.RecordBatch]:
        """Stream matching rows as record batches from a snapshot of every tier (bounded memory).

        The snapshot is taken when iteration starts; pushes and deletes after that are not seen.
        A private DuckDB connection runs the scan, so other calls are not blocked meanwhile.
        ``batch_size`` rows per batch; by default as many as make ~1/16 of ``memory_limit_mb``
        (at most 4,096), so a scan of token columns stays within the RAM budget.
        """
        self._check()
        cols = list(columns) if columns is not None else list(self.schema.names)
        rows = batch_size or reads.scan_batch_rows(self._state, cols, self.memory_limit_bytes)
        yield from reads.scan(self._state, where, columns, rows)

    def row_bytes(self, columns: Sequence[str]) -> float | None:
        """Arrow bytes per row of ``columns`` in the newest rows (None when empty): what readers size batches by."""
        self._check()
        return reads.row_bytes(self._state, columns)

    def sql(self, query: str, params: list | dict | None = None) -> pa.Table:
        """Run one read-only DuckDB statement over ``rollouts`` (all tiers), ``hot``, ``warm`` and ``meta``
        (``ReadOnlyError`` for anything that writes; no file access: see README "What sql() may do")."""
        self._check()
        with self._state.gate.shared():  # no warm fragment leaves local disk under the query (engine/readgate)
            return self._catalog.user_query(query, params)

    def count(self, where: str | None = None) -> int:
        """How many rollouts match ``where`` (all of them if None)."""
        self._check()
        return self._catalog.count(where)  # syncs the tiers' objects only for a predicate ``meta`` cannot answer

    # cold tier ----------------------------------------------------------------------------
    def snapshot(self, wait: bool = True, progress: Any = None) -> Snapshot | None:
        """Upload what is new since the last snapshot (and deletes) to the lake as one commit.

        ``wait=True`` returns a ``Snapshot`` (id, the run's rows/files/bytes, lake; None when nothing
        was new) and raises ``LakeError`` on failure; ``wait=False`` queues it (p0) and returns None.
        """
        self._check()
        fut = self._snapshots.submit(progress)
        manifest = fut.result() if wait else None
        return Snapshot.from_manifest(manifest, self.lake_url) if manifest else None

    def compact(self, target_file_bytes: int = 256 * 2**20, progress: Any = None) -> dict:
        """Rewrite this run's lake files into files of about ``target_file_bytes`` (see ``Lake.compact``)."""
        self._check()
        return self._snapshots.compact(target_file_bytes, progress)

    # introspection ------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Rows, bytes and files per tier, queue depths and latencies."""
        self._check()
        with self._state.lock:
            hot = self.hot.stats() | {"limit_bytes": self.memory_limit_bytes, "capacity_bytes": self._budget.hot_limit()}
            warm = self.warm.stats()
            cold_only = self._state.cold.stats()
            served = dict(self._state.served)
        return {
            "run_id": self.run_id,
            "path": str(self.path),
            "rows": hot["rows"] + warm["rows"] + cold_only["rows"],
            "hot": hot,
            "warm": warm,
            # the lake (every snapshotted row) and, under "only", the rows nothing local holds any more
            "cold": self._snapshots.stats() | {"restored_from": self.restored_from, "only": cold_only},
            "tiers": {"hot": {"rows": hot["rows"], "bytes": hot["bytes"]},
                      "warm": {"rows": warm["rows"], "bytes": warm["bytes"]},
                      # local_rows: cold rows read from local copies of their lake files (restore="eager")
                      "cold": {k: cold_only[k] for k in ("rows", "bytes", "local_rows", "mirror_files", "mirror_bytes")
                               if k in cold_only}},
            "reads": {"rows_from": served,  # rows get() (and so sample) read from each tier
                      "promoted_batches": self._promotion.promoted},  # cold batches reads brought back
            "disk": self._disk.stats(),
            "wal": {"segments": len(self.wal.ids()), "bytes": self.wal.nbytes()},
            "catalog": {"bytes": self._catalog.memory_bytes},
            "queues": self.tasks.stats(),
            "durability": self.durability,
        }

    def __len__(self) -> int:
        return self._catalog.count(None, "meta")

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        """Every stored rollout once, as record batches (``scan()`` with its defaults)."""
        return self.scan()

    # lifecycle ----------------------------------------------------------------------------
    def close(self) -> None:
        """Finish background work, persist what must survive, release the directory."""
        if self._closed:
            return
        try:
            self._snapshots.stop_timer()
            self._promotion.stop()  # queued warming is optional: the rows stay cold, close does not wait for it
            self._layouts_stop.set()  # ... nor does reading layouts ahead
            self.tasks.drain()
            if self.durability == "memory":
                self.evict_all()
            if self._snapshots.periodic:
                try:
                    self._snapshots.snapshot_now()
                except LakeError as e:
                    log.warning("final snapshot on close failed (data is safe locally): %s", e)
            self.tasks.close()
            self.tasks.check()
            self.wal.drop_spares()
        finally:
            self._closed = True
            try:
                try:  # each part is closed even if another fails (a later error carries the earlier one)
                    self._snapshots.stop_timer()
                    self.tasks.stop()  # no-op after tasks.close(); after a failure above, the workers end here
                    self._catalog.close()
                finally:
                    self.hot.clear()
                    self.index.close()
            finally:
                try:
                    self._snapshots.release()
                finally:
                    try:
                        self._state.warm.close()  # open fragment files: the directory is let go whole
                    finally:
                        self._dirlock.release()

    def __enter__(self) -> ReplayBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._closed:
            return f"ReplayBuffer({str(self.path)!r}, run_id={self.run_id!r}, closed)"
        st = self.stats()
        return (f"ReplayBuffer({str(self.path)!r}, run_id={self.run_id!r}, rows={st['rows']} "
                f"(hot {st['hot']['rows']}, warm {st['warm']['rows']}, cold only {st['tiers']['cold']['rows']}), "
                f"lake={self.lake_url!r}, "
                f"memory_limit_mb={self.memory_limit_bytes / 2**20:g}, open)")

    def _repr_html_(self) -> str:
        if self._closed:
            return f"<pre>{html.escape(repr(self))}</pre>"
        return display.stats_html(f"ReplayBuffer {self.run_id} at {self.path}", self.stats())
