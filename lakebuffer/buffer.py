"""``ReplayBuffer``: the facade that composes the tiers, the index, the catalog and the samplers.

Data flows one way, push -> hot -> warm -> cold; reads see every tier. The buffer owns the
ordering rules that make that safe: a batch is in the WAL and the index before ``push`` returns,
in the warm tier before it leaves RAM, and the index, the warm version readers see and the hot
tier change together under one lock, so no reader ever sees a row twice or not at all.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import samplers as _samplers
from .catalog import Catalog, check_predicate, stream
from .errors import (
    BackpressureError,
    ClosedError,
    KeyNotFoundError,
    LakeError,
    LockedError,
    SchemaError,
)
from .hot import HotTier, table_bytes
from .index import BatchInfo, KeyIndex
from .lake import Lake
from .resources import sql_text
from .schema import conform, key_list, merge_schema, metadata_columns, projection, to_table
from .tasks import P0, P1, TaskQueue
from .wal import WriteAheadLog
from .warm import WarmTier

log = logging.getLogger("lakebuffer")

_EVICT_HIGH = 0.75  # start write-back when resident hot bytes pass this share of the budget
_EVICT_LOW = 0.5  # ... and write back until they are under this share
_FRAGMENT_BYTES = 8 << 20  # small evicted batches are coalesced into fragments of about this size
_DURABILITY = ("wal", "memory")
#: RAM one write-back costs per byte of hot rows it writes, beyond the hot rows themselves. Lance
#: builds encoded pages and write buffers before the file is closed: writing 3, 6, 12 and 24 MB
#: fragments here peaked at 1.7x the rows (+4 MB), so the budget reserves 2x while one runs.
_WRITE_BACK_RAM = 2
_CATALOG_WARN = 0.5  # warn once when the metadata catalog takes this share of the budget
_QUEUED_META_ROWS = 8192  # queued catalog inserts / replay counts applied in the background past these
_QUEUED_COUNT_ROWS = 262_144


_SNAPSHOT_THREAD: ThreadPoolExecutor | None = None
_SNAPSHOT_THREAD_LOCK = threading.Lock()


def _renice(niceness: int = 10) -> None:
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + niceness))
    except (OSError, AttributeError):  # not Linux or not allowed: normal priority
        pass


def _at_low_priority(fn: Any) -> Any:
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


def _now_us() -> np.datetime64:
    return np.datetime64(time.time_ns() // 1000, "us")


class ReplayBuffer:
    """A tiered, persistent replay buffer of RL rollouts. Build one with ``ReplayBuffer.open``."""

    # construction -------------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        path: str | os.PathLike,
        lake: str | None = None,
        memory_limit_mb: float = 1024,
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
    ) -> ReplayBuffer:
        """Open (creating or recovering) the buffer stored in directory ``path``.

        ``lake`` is the cold tier's fsspec URL (default ``<path>/lake``). An empty or missing ``path``
        whose ``run_id`` has committed snapshots in ``lake`` is restored from the last one, eagerly
        (every row written to the warm tier before ``open`` returns; ``progress(done, total)``).
        """
        options = {k: v for k, v in locals().items() if k not in ("cls", "path")}
        return cls(Path(path), **options)

    @classmethod
    def open_lake(cls, url: str, storage_options: dict | None = None, run_id: str | None = None):
        """A read-only view over every run in the lake at ``url`` (same ``sql``/``sample``/``get``)."""
        from .lakeview import LakeView

        return LakeView(url, storage_options=storage_options, run_id=run_id)

    def __init__(self, path: Path, **options: Any) -> None:
        """Use ``ReplayBuffer.open`` (it documents the options)."""
        if options["durability"] not in _DURABILITY:
            raise ValueError(f"durability must be one of {_DURABILITY}, not {options['durability']!r}")
        if options["memory_limit_mb"] <= 0:
            raise ValueError("memory_limit_mb must be positive")
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        self._lockfile = self._acquire_dir_lock(path)
        self._closed = False
        try:
            self._open_parts(**options)
        except BaseException:
            self._shutdown_parts()
            self._release_dir_lock()
            raise

    @staticmethod
    def _acquire_dir_lock(path: Path):
        f = open(path / "LOCK", "a+")
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            raise LockedError(f"{path} is open in another process (one writer per buffer directory)") from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        return f

    def _release_dir_lock(self) -> None:
        if self._lockfile is not None:
            fcntl.flock(self._lockfile.fileno(), fcntl.LOCK_UN)
            self._lockfile.close()
            self._lockfile = None

    def _open_parts(self, *, lake, memory_limit_mb, snapshot_interval_s, storage_options, schema, run_id,
                    durability, sync, push_timeout_s, key_prefix, duckdb_threads, progress) -> None:
        self.index = KeyIndex(self.path / "index")
        stored_run = self.index.get_setting("run_id")
        fresh = stored_run is None
        self.run_id = run_id or (stored_run.decode() if stored_run else self.path.resolve().name)
        if stored_run is None:
            self.index.put_setting("run_id", self.run_id.encode())
        elif run_id and run_id != stored_run.decode():
            raise ValueError(f"{self.path} holds run {stored_run.decode()!r}, not {run_id!r}")
        self.schema = self._resolve_schema(schema)
        self.key_prefix = key_prefix or self.run_id
        self.durability = durability
        self.push_timeout_s = push_timeout_s
        self.memory_limit_bytes = int(memory_limit_mb * 2**20)
        self.snapshot_interval_s = snapshot_interval_s
        self.storage_options = storage_options
        self.lake_url = lake or str(self.path / "lake")
        self.lake = Lake(self.lake_url, storage_options)  # a missing bucket fails here, clearly
        self.index.put_setting("lake", self.lake_url.encode())  # for fsck's repair from the lake (no secrets)
        self._snap_lock = threading.Lock()
        self._snapshot_pending = False
        self._last_snapshot: dict[str, Any] = {"id": None, "at": None, "error": None, "rows": 0, "files": 0, "bytes": 0}
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None
        self.meta_columns = metadata_columns(self.schema)
        self._lock = threading.RLock()
        self._space = threading.Condition(self._lock)
        self._reserved = 0
        self._encoding = 0  # RAM held by write-backs running now (see _WRITE_BACK_RAM)
        self._evictions_paused = 0
        self._catalog_warned = False
        self.hot = HotTier()
        self.warm = WarmTier(self.path / "warm" / "rollouts.lance", self.schema)
        self.wal = WriteAheadLog(self.path / "wal", sync=sync)
        self._catalog = Catalog(self.schema, self.meta_columns, threads=duckdb_threads)
        self._catalog.set_syncer(self._sync_catalog)
        self._synced = (-1, -1)
        self._catalog_flush_queued = False
        # two workers: a long snapshot upload (p0) must not stall write-back (p1), or pushes would block
        self.tasks = TaskQueue(workers=2)
        self._batches: dict[int, BatchInfo] = {}
        self._recover()
        if fresh:
            self._restore_from_lake(progress)
        self._refresh_cold()
        if snapshot_interval_s and snapshot_interval_s > 0:
            self._timer = threading.Thread(target=self._snapshot_timer, name="lakebuffer-snapshots", daemon=True)
            self._timer.start()

    def _shutdown_parts(self) -> None:
        """Release what a failed open had started (best effort)."""
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()
        for name in ("tasks", "_catalog", "index"):
            part = getattr(self, name, None)
            if part is not None:
                try:
                    part.close()
                except Exception:  # noqa: BLE001 - already failing; the first error is what matters
                    pass

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

    # recovery -----------------------------------------------------------------------------
    def _recover(self) -> None:
        """Bring index, WAL and warm tier into agreement, then load the metadata catalog."""
        batches = self.index.batches()
        referenced = {b.fragment for b in batches.values() if b.tier == "warm"}
        orphans = [f for f in self.warm.fragment_ids() if f not in referenced]
        if orphans:
            log.warning("dropping %d warm fragment(s) no index entry refers to: %s", len(orphans), orphans)
            self.warm.drop_fragments(orphans)
        self.wal.remove_torn()
        wal_ids = set(self.wal.ids())
        for bid, info in sorted(batches.items()):
            if info.tier == "warm":
                self._batches[bid] = info
                continue
            if bid in wal_ids:
                self.hot.add(bid, self.wal.read(bid))
                self._batches[bid] = info
            else:
                meta = self.index.batch_meta(bid)
                keys = meta.column("key").to_pylist() if meta is not None else []
                log.warning("batch %d (%d rows) was only in RAM (durability='memory') and is lost", bid, len(keys))
                self.index.drop_batch(bid, keys)
        hot_ids = {b for b, i in self._batches.items() if i.tier == "hot"}
        for stale in wal_ids - hot_ids:
            # a push that crashed before it was acknowledged, or a write-back that crashed after
            # its index update but before the segment was removed
            self.wal.remove(stale)
        metas = []
        for bid, meta in self.index.all_meta():
            if bid in self._batches:
                metas.append(meta.append_column("_batch", pa.array(np.full(meta.num_rows, bid, dtype=np.int64))))
        if metas:
            self._catalog.insert_meta(pa.concat_tables(metas).select(self._catalog.meta_schema.names))
        counts = self.index.sample_counts()
        if counts:
            self._catalog.add_sample_counts(pa.table({"key": list(counts), "n": list(counts.values())}))
        low = int(self._hot_limit() * _EVICT_LOW)
        while self.hot.nbytes > low:
            victims = self.hot.choose_victims(low)
            if not victims:
                break
            self._write_back([v.batch_id for v in victims])

    # helpers ------------------------------------------------------------------------------
    def _check(self) -> None:
        if self._closed:
            raise ClosedError("this ReplayBuffer is closed; open it again with ReplayBuffer.open")
        self.tasks.check()

    def _hot_limit(self) -> int:
        """The share of ``memory_limit_mb`` left for hot rows and write-back: the budget minus the
        metadata catalog, which grows with every row stored (~140 B each in DuckDB), so RAM stays
        within the budget as the buffer grows. The hot tier keeps at least a quarter of it."""
        catalog = self._catalog.memory_bytes
        if catalog > self.memory_limit_bytes * _CATALOG_WARN and not self._catalog_warned:
            self._catalog_warned = True
            log.warning("the metadata of %d rollouts takes %.0f MB of memory_limit_mb=%.0f: raise it (past 3/4 "
                        "of it, RAM outgrows it)", sum(i.rows for i in self._batches.values()), catalog / 2**20,
                        self.memory_limit_bytes / 2**20)
        return max(self.memory_limit_bytes - catalog, self.memory_limit_bytes // 4)

    def _meta_of(self, batch_id: int, table: pa.Table) -> pa.Table:
        meta = table.select(self.meta_columns)
        return meta.append_column("_batch", pa.array(np.full(table.num_rows, batch_id, dtype=np.int64)))

    def _sync_catalog(self) -> None:
        with self._lock:
            ds = self.warm.dataset
            state = (self.hot.version, ds.version if ds is not None else -1)
            if state != self._synced:
                self._catalog.register_tiers(self.hot.tables(), ds)
                self._synced = state

    def _generate_keys(self, n: int) -> pa.Array:
        seq = self.index.reserve_keys(n)
        nums = pc.cast(pa.array(np.arange(seq, seq + n, dtype=np.int64)), pa.string())
        return pc.binary_join_element_wise(self.key_prefix, pc.utf8_lpad(nums, 10, "0"), "-")

    def _conform(self, data: Any) -> pa.Table:
        table = to_table(data)
        n = table.num_rows
        if "key" in table.column_names and table.column("key").null_count < n:
            given = table.column("key")
            missing = given.null_count
            keys = self._generate_keys(n) if missing else None
            table = conform(table, self.schema, run_id=self.run_id, now=_now_us(), keys=keys)
            user_keys = pc.drop_null(given).cast(pa.string())
            if pc.count_distinct(table.column("key")).as_py() != n:
                raise SchemaError("column 'key' has duplicate values within the batch")
            _, _, found = self.index.lookup(user_keys.to_pylist())
            if found.any():
                dup = user_keys[int(np.flatnonzero(found)[0])].as_py()
                raise SchemaError(f"column 'key': key {dup!r} is already stored (keys are unique)")
            return table
        return conform(table, self.schema, run_id=self.run_id, now=_now_us(), keys=self._generate_keys(n))

    # push ---------------------------------------------------------------------------------
    def push(self, batch: Any) -> pa.Array:
        """Validate and store a batch of rollouts; returns their keys (a string array).

        In ``durability="wal"`` mode the rows are on local disk when this returns. Raises
        ``SchemaError`` (nothing stored) or ``BackpressureError`` (nothing stored).
        """
        self._check()
        table = self._conform(batch)
        if table.num_rows and pc.any(pc.not_equal(table.column("run_id"), self.run_id)).as_py():
            raise SchemaError(f"column 'run_id' must be this buffer's run {self.run_id!r} (or absent)")
        if table.num_rows == 0:
            return pa.array([], pa.string())
        table = table.combine_chunks()
        nbytes = table_bytes(table)
        if nbytes > self._hot_limit() * _EVICT_LOW:
            self._push_direct(table)
        else:
            self._push_hot(table, nbytes)
        return table.column("key").combine_chunks()

    def _push_hot(self, table: pa.Table, nbytes: int) -> None:
        deadline = time.monotonic() + self.push_timeout_s
        with self._space:
            while self.hot.nbytes + self._encoding + self._reserved + nbytes > self._hot_limit():
                self._schedule_eviction(extra=nbytes)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BackpressureError(
                        f"hot tier full ({self.hot.nbytes} of {self._hot_limit()} bytes) and write-back "
                        f"did not free {nbytes} bytes within push_timeout_s={self.push_timeout_s}; batch not stored"
                    )
                self._space.wait(min(left, 0.5))
                self.tasks.check()
            self._reserved += nbytes
        bid = self.index.reserve_batch()
        try:
            if self.durability == "wal":
                self.wal.write(bid, table)
            info = BatchInfo(batch_id=bid, tier="hot", rows=table.num_rows, nbytes=nbytes)
            meta = self._meta_of(bid, table)
            self.index.record_batch(info, table.column("key").to_pylist(), meta.drop_columns(["_batch"]))
        except BaseException:
            with self._space:
                self._reserved -= nbytes
                self._space.notify_all()
            self.wal.remove(bid)
            raise
        with self._space:
            self._reserved -= nbytes
            self.hot.add(bid, table)
            self._batches[bid] = info
            self._catalog.insert_meta(meta)
            self._evict_past_high_mark()
        self._maybe_flush_catalog()

    def _push_direct(self, table: pa.Table) -> None:
        """A batch larger than the hot budget allows goes to the warm tier in chunks, synchronously."""
        chunk_rows = max(1, int(table.num_rows * (self._hot_limit() / 4) / table_bytes(table)))
        written: list[int] = []
        try:
            for start in range(0, table.num_rows, chunk_rows):
                part = table.slice(start, chunk_rows)
                bid = self.index.reserve_batch()
                frag, ds = self.warm.append(part)
                info = BatchInfo(batch_id=bid, tier="warm", rows=part.num_rows, fragment=frag.fragment_id,
                                 files=list(frag.files), checksum=frag.checksum, nbytes=frag.nbytes)
                meta = self._meta_of(bid, part)
                self.index.record_batch(info, part.column("key").to_pylist(), meta.drop_columns(["_batch"]))
                written.append(bid)
                with self._lock:
                    self.warm.publish(ds)
                    self._batches[bid] = info
                    self._catalog.insert_meta(meta)
        except BaseException:
            self._rollback(written)
            raise

    def _rollback(self, batch_ids: list[int]) -> None:
        """Undo the batches of a push that failed half way (nothing of it stays stored)."""
        with self._lock:
            for bid in batch_ids:
                info = self._batches.pop(bid)
                meta = self.index.batch_meta(bid)
                keys = meta.column("key") if meta is not None else pa.array([], pa.string())
                self.warm.drop_fragments([info.fragment])
                self.index.drop_batch(bid, keys.to_pylist())
                self._catalog.delete_meta(keys)

    # eviction -----------------------------------------------------------------------------
    def _evict_past_high_mark(self) -> None:
        """Start write-back once resident hot bytes pass the high mark (the caller holds the lock)."""
        if self.hot.resident_bytes() > self._hot_limit() * _EVICT_HIGH:
            self._schedule_eviction()

    def _schedule_eviction(self, extra: int = 0) -> None:
        """Hand least recently used batches to write-back (p1), in fragment-sized groups."""
        if self._evictions_paused:
            return
        target = int(self._hot_limit() * _EVICT_LOW) - extra - self._reserved
        victims = self.hot.choose_victims(max(target, 0))
        group: list[int] = []
        size = 0
        for v in victims:
            group.append(v.batch_id)
            size += v.nbytes
            if size >= _FRAGMENT_BYTES:
                self._submit_write_back(group)
                group, size = [], 0
        if group:
            self._submit_write_back(group)

    def _submit_write_back(self, group: list[int]) -> None:
        ids = list(group)
        self.tasks.submit(P1, lambda: self._write_back(ids), name=f"write-back {ids[0]}..{ids[-1]}")

    def _write_back(self, batch_ids: list[int]) -> None:
        """Write hot batches to one warm fragment, then move them there in one step."""
        with self._lock:
            tables = [self.hot.get(b, touch=False).table for b in batch_ids]
            # Lance's pages and write buffers are RAM the budget must cover too
            encoding = _WRITE_BACK_RAM * sum(table_bytes(t) for t in tables)
            self._encoding += encoding
        try:
            frag, ds = self.warm.append(pa.concat_tables(tables) if len(tables) > 1 else tables[0])
        except BaseException:
            with self._space:
                self._encoding -= encoding
                for b in batch_ids:
                    hb = self.hot.get(b, touch=False)
                    if hb is not None:
                        hb.evicting = False
                self._space.notify_all()
            raise
        with self._space:
            self._encoding -= encoding
            infos = []
            offset = 0
            for b, t in zip(batch_ids, tables):
                info = self._batches[b]
                info.tier, info.fragment, info.offset = "warm", frag.fragment_id, offset
                info.files, info.checksum, info.nbytes = list(frag.files), frag.checksum, frag.nbytes
                infos.append(info)
                offset += t.num_rows
            self.index.set_batches(infos)
            self.warm.publish(ds)
            for b in batch_ids:
                self.hot.remove(b)
                self.wal.remove(b)
            self._space.notify_all()

    # reads --------------------------------------------------------------------------------
    def get(self, keys: Sequence[str] | pa.Array, columns: Sequence[str] | None = None) -> pa.Table:
        """Rows for ``keys`` in the order given, with only ``columns`` read (all if None)."""
        self._check()
        keys = key_list(keys)
        cols, fetch = projection(self.schema, columns)
        out_schema = pa.schema([self.schema.field(c) for c in fetch])
        if not keys:
            return pa.schema([self.schema.field(c) for c in cols]).empty_table()
        parts: list[pa.Table] = []
        order: list[np.ndarray] = []
        warm_reads: list[tuple[int, np.ndarray, np.ndarray]] = []
        with self._lock:
            batch, pos, found = self.index.lookup(keys)
            if not found.all():
                raise KeyNotFoundError(f"key {keys[int(np.flatnonzero(~found)[0])]!r} is not in the buffer")
            sort = np.argsort(batch, kind="stable")
            bounds = np.flatnonzero(np.diff(batch[sort])) + 1
            for idx in np.split(sort, bounds):
                bid = int(batch[idx[0]])
                hb = self.hot.get(bid)
                if hb is not None:
                    parts.append(hb.table.select(fetch).take(pa.array(pos[idx])))
                    order.append(idx)
                else:
                    info = self._batches[bid]
                    warm_reads.append((info.fragment, info.offset + pos[idx], idx))
            ds_warm = self.warm
        if warm_reads:
            frags = np.concatenate([np.full(len(r), f, dtype=np.int64) for f, r, _ in warm_reads])
            rows = np.concatenate([r for _, r, _ in warm_reads])
            parts.append(ds_warm.take(frags, rows, fetch).select(fetch))
            order.append(np.concatenate([i for _, _, i in warm_reads]))
        table = pa.concat_tables([p.cast(out_schema) for p in parts])
        inverse = np.argsort(np.concatenate(order))
        table = table.take(pa.array(inverse))
        if "sample_count" in cols:
            table = self._with_live_counts(table)
        return table.select(cols)

    def _with_live_counts(self, table: pa.Table) -> pa.Table:
        """Replace the pushed ``sample_count`` by the live count: ``meta``'s plus replays still queued."""
        with self._catalog.counts_deferred():  # do not wait for the queued UPDATE: add the queue here
            live = self._catalog.query(sql_text("live_sample_counts"), wanted=table.select(["key"]))
            queued = self._catalog.queued_counts()
        keys = table.column("key")
        pos = pc.index_in(keys, value_set=live.column("key"))
        counts = live.column("sample_count").combine_chunks().take(pos)
        idx = table.column_names.index("sample_count")
        counts = pc.coalesce(counts, table.column(idx))
        if queued is not None:
            # sum queued replays per wanted key without Acero (its group_by runs out of thread
            # slots when called from many short-lived threads): index into the wanted keys, bincount
            slot = pc.index_in(queued.column("key"), value_set=keys).to_numpy(zero_copy_only=False)
            hit = ~np.isnan(slot.astype(np.float64))
            if hit.any():
                n = queued.column("n").to_numpy()[hit]
                extra = np.bincount(slot[hit].astype(np.int64), weights=n, minlength=len(keys)).astype(np.int64)
                counts = pc.add(counts.cast(pa.int64()), pa.array(extra)).cast(pa.int32())
        return table.set_column(idx, table.schema.field(idx), counts)

    def sample(
        self,
        n: int,
        where: str | None = None,
        sampler: str | _samplers.Sampler | type | None = "uniform",
        columns: Sequence[str] | None = None,
        seed: int | None = 0,
        return_keys: bool = False,
        **options: Any,
    ) -> pa.Table | pa.Array:
        """Choose ``n`` rollouts matching ``where`` with ``sampler`` and fetch ``columns``.

        Deterministic given ``seed`` and the buffer's contents. Raises ``NotEnoughRowsError`` when
        the predicate matches fewer rows than asked (and ``QueryError`` for a bad predicate).
        ``return_keys=True`` returns only the keys (fetch payload later with ``get``).
        """
        self._check()
        strategy = _samplers.resolve(sampler, **options)
        catalog = self._catalog_for_sampling()
        if strategy.needs_counts:
            keys = _samplers.draw(strategy, catalog, n, where, seed)
        else:
            with catalog.counts_deferred():
                keys = _samplers.draw(strategy, catalog, n, where, seed)
        self._count_replays(keys)
        if return_keys:
            return keys
        return self.get(keys, columns)

    def _catalog_for_sampling(self) -> Catalog:
        self._sync_catalog()
        return self._catalog

    def _count_replays(self, keys: pa.Array) -> None:
        """Add one to ``sample_count`` of each sampled key, persisted in the background (p0)."""
        if len(keys) == 0:
            return
        vc = pc.value_counts(keys)
        counts = pa.table({"key": vc.field("values"), "n": vc.field("counts")})
        self._catalog.add_sample_counts(counts)  # queued; applied before anything reads sample_count
        self.tasks.submit(
            P0,
            lambda: self.index.add_sample_counts(counts.column("key").to_pylist(), counts.column("n").to_pylist()),
            name="persist replay counts",
        )
        self._maybe_flush_catalog()

    def _maybe_flush_catalog(self) -> None:
        """Move queued metadata inserts / replay counts into DuckDB in the background (p1).

        Inserts go at 8k rows: queued tables keep slices of hot batches alive (8k measured 20 MB
        less peak RSS than 64k). Replay counts wait for 256k: their UPDATE joins all of ``meta``
        (~0.3 s at 10M rows) and holds the catalog: at 8k it stalled one 256-key sample in 30.
        """
        meta_rows, count_rows = self._catalog.pending
        if (meta_rows > _QUEUED_META_ROWS or count_rows > _QUEUED_COUNT_ROWS) and not self._catalog_flush_queued:
            self._catalog_flush_queued = True

            def flush() -> None:
                try:
                    if count_rows > _QUEUED_COUNT_ROWS:
                        self._catalog.flush()
                    else:
                        self._catalog.flush_inserts()
                finally:
                    self._catalog_flush_queued = False
                with self._lock:  # the catalog grew, so the hot tier's share shrank: evict to it now
                    self._evict_past_high_mark()

            self.tasks.submit(P1, flush, name="catalog flush")

    def scan(
        self, where: str | None = None, columns: Sequence[str] | None = None, batch_size: int = 4096
    ) -> Iterator[pa.RecordBatch]:
        """Stream matching rows as record batches from a snapshot of hot + warm (bounded memory).

        The snapshot is taken when iteration starts; pushes and deletes after that are not seen.
        A private DuckDB connection runs the scan, so other calls are not blocked meanwhile.
        """
        self._check()
        pred = check_predicate(where)
        cols = list(columns) if columns is not None else list(self.schema.names)
        with self._lock:
            hot = pa.concat_tables(self.hot.tables()) if len(self.hot) else self.schema.empty_table()
            warm = self.warm.dataset if self.warm.dataset is not None else self.schema.empty_table()
        sql = self._catalog.render("scan", columns=", ".join(f'"{c}"' for c in cols), where=pred)
        yield from stream(sql, {"hot_data": hot, "warm_data": warm}, batch_size)

    def sql(self, query: str, params: list | dict | None = None) -> pa.Table:
        """Run DuckDB SQL over ``rollouts`` (all tiers), ``hot``, ``warm`` and ``meta``."""
        self._check()
        return self._catalog.query(query, params)

    # deletes ------------------------------------------------------------------------------
    def delete(self, keys: Sequence[str] | pa.Array | None = None, where: str | None = None) -> int:
        """Delete rollouts by key and/or predicate; returns how many rows were deleted."""
        self._check()
        if keys is None and where is None:
            raise ValueError("delete needs keys=..., where=... or both (to delete everything, where='TRUE')")
        with self._lock:
            self._evictions_paused += 1
        try:
            self.tasks.drain()
            self.tasks.check()
            with self._space:
                return self._delete_locked(keys, where)
        finally:
            with self._lock:
                self._evictions_paused -= 1

    def _delete_locked(self, keys, where) -> int:
        wanted: list[str] = []
        if keys is not None:
            wanted = keys.to_pylist() if isinstance(keys, (pa.Array, pa.ChunkedArray)) else list(keys)
        if where is not None:
            source = self._catalog.source_for(where)
            t = self._catalog.query(self._catalog.render("select_keys", source=source, where=check_predicate(where)))
            matched = t.column("key").to_pylist()
            wanted = matched if keys is None else sorted(set(wanted) & set(matched))
        if not wanted:
            return 0
        batch, pos, found = self.index.lookup(wanted)
        gone = [k for k, f in zip(wanted, found) if f]
        warm_gone: list[str] = []
        for bid in np.unique(batch[found]).tolist():
            sel = found & (batch == bid)
            removed = [wanted[i] for i in np.flatnonzero(sel)]
            info = self._batches[bid]
            meta = self.index.batch_meta(bid)
            keep_mask = pc.invert(pc.is_in(meta.column("key"), pa.array(removed)))
            new_meta = meta.filter(keep_mask)
            info.rows = new_meta.num_rows
            hb = self.hot.get(bid, touch=False)
            positions: dict[str, int] = {}
            if hb is not None:
                kept = hb.table.filter(pc.invert(pc.is_in(hb.table.column("key"), pa.array(removed))))
                positions = dict(zip(kept.column("key").to_pylist(), range(kept.num_rows)))
                if kept.num_rows:
                    if self.durability == "wal":
                        self.wal.write(bid, kept)
                    self.hot.replace(bid, kept)
                else:
                    self.hot.remove(bid)
                    self.wal.remove(bid)
            else:
                warm_gone.extend(removed)
            if info.snapshot is not None:
                self.index.add_tombstones(removed)  # the lake holds them: the next snapshot hides them
            self.index.rewrite_batch(info, removed, positions, new_meta)
            if info.rows == 0:
                self._batches.pop(bid)
        self.warm.delete_keys(warm_gone)
        self._catalog.delete_meta(pa.array(gone, pa.string()))
        return len(gone)

    # durability ---------------------------------------------------------------------------
    def flush(self, timeout: float | None = None) -> None:
        """Wait until queued background work (write-back, replay counts) is done and durable."""
        self._check()
        if not self.tasks.drain(timeout):
            raise TimeoutError(f"background work still queued after {timeout} s")
        self.tasks.check()
        self.index.flush()

    def evict_all(self) -> None:
        """Write every hot batch to the warm tier now (e.g. before a planned shutdown)."""
        self._check()
        with self._lock:
            victims = self.hot.choose_victims(0)
        for i in range(0, len(victims), 64):
            self._write_back([v.batch_id for v in victims[i : i + 64]])
        self.flush()

    # cold tier --------------------------------------------------------------------------
    def snapshot(self, wait: bool = True, progress: Any = None) -> dict | None:
        """Upload what is new since the last snapshot (and deletes) to the lake as one commit.

        ``wait=True`` returns the committed manifest (None when nothing was new) and raises
        ``LakeError`` on failure; ``wait=False`` queues it (p0) and returns None at once.
        """
        self._check()
        fut = self.tasks.submit(P0, lambda: self._snapshot_now(progress), name="snapshot", surface=False)
        if not wait:
            return None
        return fut.result()

    def _snapshot_timer(self) -> None:
        """Queue a snapshot every ``snapshot_interval_s``; a failure is retried at the next tick."""
        while not self._stop.wait(self.snapshot_interval_s):
            with self._lock:
                if self._snapshot_pending:
                    continue
                self._snapshot_pending = True
            try:
                self.tasks.submit(P0, self._periodic_snapshot, name="periodic snapshot", surface=False)
            except Exception:  # noqa: BLE001 - the queue is closing
                return

    def _periodic_snapshot(self) -> None:
        try:
            self._snapshot_now()
        finally:
            with self._lock:
                self._snapshot_pending = False

    def _snapshot_now(self, progress: Any = None) -> dict | None:
        with self._snap_lock:
            try:
                return _at_low_priority(lambda: self._snapshot_locked(progress))
            except LakeError as e:
                self._last_snapshot["error"] = str(e)
                log.error("snapshot to %s failed (it is retried at the next one): %s", self.lake_url, e)
                raise
            except BaseException as e:
                self._last_snapshot["error"] = f"{type(e).__name__}: {e}"
                raise

    def _snapshot_locked(self, progress: Any) -> dict | None:
        self._reconcile_with_lake()
        with self._lock:
            pending = sorted(b for b, i in self._batches.items() if i.snapshot is None)
            tombstones = self.index.tombstones()
            next_seq = self.index.next_seq
        if not pending and not tombstones:
            return None
        total = sum(self._batches[b].rows for b in pending if b in self._batches)
        done = 0
        included: list[int] = []

        def rows():
            nonlocal done
            for bid in pending:
                t = self._read_batch(bid)
                if t is None:
                    continue
                included.append(bid)
                done += t.num_rows
                if progress is not None:
                    progress(done, total)
                yield t

        manifest = self.lake.commit_snapshot(
            self.run_id, rows(), tombstones, meta={"batches": pending, "next_seq": next_seq}, force=bool(tombstones)
        )
        with self._lock:
            infos = []
            for bid in included:
                info = self._batches.get(bid)
                if info is not None:
                    info.snapshot = manifest["snapshot_id"] if manifest else -1
                    infos.append(info)
            self.index.set_batches(infos)
            self.index.clear_tombstones(tombstones)
        if manifest:
            self.index.put_setting("last_snapshot", str(manifest["snapshot_id"]).encode())
            self._last_snapshot.update(id=manifest["snapshot_id"], at=time.time(), error=None)
            self._refresh_cold()
        return manifest

    def _read_batch(self, bid: int) -> pa.Table | None:
        """Every live row of one batch, all columns, with live replay counts (for snapshots)."""
        with self._lock:
            info = self._batches.get(bid)
            if info is None:
                return None
            hb = self.hot.get(bid, touch=False)
            if hb is not None:
                table = hb.table
            else:
                meta = self.index.batch_meta(bid)
                keys = meta.column("key").to_pylist()
                _, pos, _ = self.index.lookup(keys)
                frag, offset = info.fragment, info.offset
        if hb is None:
            table = self.warm.take(frag, offset + pos, list(self.schema.names))
        return self._with_live_counts(table)

    def _reconcile_with_lake(self) -> None:
        """Mark batches a committed snapshot holds although the index missed it (crash after commit)."""
        last = self.index.get_setting("last_snapshot")
        seen = int(last.decode()) if last else 0
        newer = [sid for sid in self.lake.snapshots(self.run_id) if sid > seen]
        if not newer:
            return
        with self._lock:
            infos = []
            for sid in newer:
                for bid in self.lake.manifest(self.run_id, sid).get("meta", {}).get("batches", []):
                    info = self._batches.get(bid)
                    if info is not None and info.snapshot is None:
                        info.snapshot = sid
                        infos.append(info)
            self.index.set_batches(infos)
            self.index.put_setting("last_snapshot", str(newer[-1]).encode())

    def _restore_from_lake(self, progress: Any) -> None:
        """Fill a fresh directory with this run's rows as of its last committed snapshot."""
        try:
            manifest = self.lake.latest_manifest(self.run_id)
        except LakeError as e:
            log.warning("cannot check the lake for run %r to restore: %s", self.run_id, e)
            return
        if manifest is None:
            return
        total = sum(int(f["rows"]) for f in manifest["files"])
        done = 0
        names = list(self.schema.names)
        for rb in self.lake.scan_batches(self.run_id, snapshot_id=manifest["snapshot_id"]):
            table = pa.Table.from_batches([rb])
            table = table.select([c for c in names if c in table.column_names])
            table = conform(table, self.schema, run_id=self.run_id, now=_now_us(), keys=None)
            bid = self.index.reserve_batch()
            frag, ds = self.warm.append(table)
            info = BatchInfo(batch_id=bid, tier="warm", rows=table.num_rows, fragment=frag.fragment_id,
                             files=list(frag.files), checksum=frag.checksum, nbytes=frag.nbytes,
                             snapshot=manifest["snapshot_id"])
            meta = self._meta_of(bid, table)
            self.index.record_batch(info, table.column("key").to_pylist(), meta.drop_columns(["_batch"]))
            with self._lock:
                self.warm.publish(ds)
                self._batches[bid] = info
                self._catalog.insert_meta(meta)
            done += table.num_rows
            if progress is not None:
                progress(done, total)
        self.index.set_next_seq(int(manifest.get("meta", {}).get("next_seq", 0)))
        self.index.put_setting("last_snapshot", str(manifest["snapshot_id"]).encode())
        self._last_snapshot.update(id=manifest["snapshot_id"], at=None, error=None)
        log.info("restored %d rollouts of run %r from %s (snapshot %s)", done, self.run_id, self.lake_url,
                 manifest["snapshot_id"])

    def _refresh_cold(self) -> None:
        """Point the ``cold`` (this run) and ``lake`` (all runs) views at the committed snapshots."""
        try:
            st = self.lake.stats(self.run_id)
            with self._catalog.lock:
                self.lake.register(self._catalog.con, "cold", run_id=self.run_id)
                self.lake.register(self._catalog.con, "lake")
        except LakeError as e:
            log.warning("lake %s is not readable now: %s", self.lake_url, e)
            return
        self._last_snapshot.update(rows=st["rows"], files=st["files"], bytes=st["bytes"])
        if self._last_snapshot["id"] is None:
            self._last_snapshot["id"] = st["last_snapshot_id"].get(self.run_id)

    def _cold_stats(self) -> dict[str, Any]:
        ls = self._last_snapshot
        return {
            "rows": ls["rows"], "files": ls["files"], "bytes": ls["bytes"], "last_snapshot_id": ls["id"],
            "last_snapshot_age_s": (time.time() - ls["at"]) if ls["at"] else None,
            "last_error": ls["error"], "url": self.lake_url,
        }

    def compact(self, target_file_bytes: int = 256 * 2**20, progress: Any = None) -> dict:
        """Rewrite this run's lake files into files of about ``target_file_bytes`` (see ``Lake.compact``)."""
        self._check()
        with self._snap_lock:
            res = self.lake.compact(self.run_id, target_file_bytes=target_file_bytes, progress=progress)
            # files replaced more than an hour ago (by earlier compactions) are no reader's any more
            res["gc_removed"] = self.lake.gc(older_than_s=3600)
        self._refresh_cold()
        return res

    # introspection ------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Rows, bytes and files per tier, queue depths and latencies."""
        self._check()
        with self._lock:
            hot = {"rows": self.hot.rows, "bytes": self.hot.nbytes, "limit_bytes": self.memory_limit_bytes,
                   "capacity_bytes": self._hot_limit(), "batches": len(self.hot)}
            warm = self.warm.stats()
        wal_ids = self.wal.ids()
        return {
            "run_id": self.run_id,
            "path": str(self.path),
            "rows": hot["rows"] + warm["rows"],
            "hot": hot,
            "warm": warm,
            "cold": self._cold_stats(),
            "wal": {"segments": len(wal_ids), "bytes": self.wal.nbytes()},
            "catalog": {"bytes": self._catalog.memory_bytes},
            "queues": self.tasks.stats(),
            "durability": self.durability,
        }

    def __len__(self) -> int:
        return self._catalog.count(None, "meta")

    # lifecycle ----------------------------------------------------------------------------
    def close(self) -> None:
        """Finish background work, persist what must survive, release the directory."""
        if self._closed:
            return
        try:
            self._stop.set()
            if self._timer is not None:
                self._timer.join()
            self.tasks.drain()
            if self.durability == "memory":
                self.evict_all()
            if self.snapshot_interval_s and self.snapshot_interval_s > 0:
                try:
                    self._snapshot_now()
                except LakeError as e:
                    log.warning("final snapshot on close failed (data is safe locally): %s", e)
            self.tasks.close()
            self.tasks.check()
        finally:
            self._closed = True
            self._catalog.close()
            self.index.close()
            self._release_dir_lock()

    def __enter__(self) -> ReplayBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"ReplayBuffer({str(self.path)!r}, run_id={self.run_id!r}, {state})"
