"""The DuckDB catalog: one connection exposing ``rollouts`` (all tiers), per-tier views and ``meta``.

Hot tables and the warm tier's dataset of memory-mapped IPC fragments are registered as Arrow objects (zero-copy scans with
projection and filter pushdown); ``meta`` is a native DuckDB table of the metadata columns only,
which is what samplers select keys on, so selection never touches payload columns.

The catalog keeps its views current itself: the engine attaches the tiers (``attach_tiers``) and
``sync`` re-registers their Arrow sources when a tier's version moved, under the engine's lock
so hot and warm are seen in one consistent state.

It is also the one owner of replay counts: they are queued here (``record_replays``), handed to
the index for persistence in the background, applied to ``meta`` in one UPDATE when a statement
needs them or the queue is large, and merged into fetched rows (``live_counts``). Priorities set
by ``update_priority`` follow the same path (index for persistence, a ``priorities`` table here),
but synchronously: a priority update is rare next to a replay and must hold when the call returns.
Replay events (who replayed what, when: ``engine/replays``) sit beside the counts in a ``replays``
table, queued the same way and inserted before the next statement.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import predicate
from .engine.tasks import P0, P1, TaskQueue
from .errors import LakeBufferError, error_boundary, query_error
from .lake import runtime
from .resources import render_sql, sql_text
from .sandbox import check_read_only, sandbox

if TYPE_CHECKING:
    from .tiers import Tier


def check_predicate(where: str | None) -> str:
    """A ``where`` is one boolean SQL expression; ``None`` or empty means every row."""
    # also receives what the samplers composed around a checked where (their own subqueries over meta)
    return predicate.check(where, composed=True)


def stream(sql: str, tables: dict[str, Any], batch_size: int, setup: list[str] = (),
           memory_limit_bytes: int | None = None, spill_dir: Any = None) -> Iterator[pa.RecordBatch]:
    """Stream ``sql``'s result over ``tables`` (Arrow objects by name) from a private connection.

    A scan may be consumed slowly (a training loop); on its own connection it never holds the
    catalog's lock, and the registered objects are a consistent snapshot the caller chose.
    """
    with runtime.native_call("DuckDB scan"):
        con = duckdb.connect()
        # one thread: DuckDB works only inside a fetch (below, bracketed for the exit hook), never
        # between fetches on worker threads that may call into Python sources at exit (issue 24)
        con.execute("SET threads = 1")
        con = sandbox(con, memory_limit_bytes, spill_dir)
    reader = None
    try:
        try:
            with runtime.native_call("DuckDB scan"):
                for name, obj in tables.items():
                    con.register(name, obj)
                for stmt in setup:
                    con.execute(stmt)
                reader = con.sql(sql).to_arrow_reader(batch_size)
            while True:  # each fetch is one bracketed native call: the exit hook waits for it (issue 24)
                with runtime.native_call("DuckDB scan"):
                    try:
                        batch = reader.read_next_batch()
                    except StopIteration:
                        break
                yield batch
        except LakeBufferError:
            raise
        except (duckdb.Error, pa.ArrowException, OSError) as e:  # a source's error comes back as a plain OSError
            raise query_error(e) from e
    finally:  # close and free inside the bracket: their destructors release the GIL (issue 24)
        with runtime.native_call("DuckDB scan", refuse=False):
            reader = None
            con.close()
            con = None
            tables.clear()  # the sources too (a pyarrow Dataset's destructor releases the GIL as well)


#: Queued metadata inserts / replay counts are applied in the background past these (see ``_maybe_flush``).
_QUEUED_META_ROWS = 8192
#: Writes quiet this long (seconds): the catalog applies queued inserts and re-registers its views (``warm_soon``).
WARM_QUIET_S: float | None = 0.05
_QUEUED_COUNT_ROWS = 262_144
#: Replay events wait for a statement that reads ``replays`` or this many rows (then a background insert)
_QUEUED_REPLAY_ROWS = 65_536
#: Predicate binding shapes whose source (``source_for``: ``meta`` or ``rollouts``) is remembered
SOURCE_SHAPES = 1024
#: DuckDB's memory is read at most this often (``Catalog._measure_memory``) ...
MEMORY_MEASURE_EVERY_S = 0.25
#: ... unless ``meta`` changed by more rows than this (~100-300 B a row) since the last reading
MEMORY_MEASURE_ROWS = 4096
#: A statement that may read the ``replays`` table (a false match only inserts the queued events early)
_READS_REPLAYS = re.compile(r"\breplays\b", re.IGNORECASE)


def _duckdb_error(_: Catalog, e: BaseException) -> LakeBufferError | None:
    return query_error(e) if isinstance(e, duckdb.Error) else None


@error_boundary(_duckdb_error)
class Catalog:
    """Thread-safe wrapper around one DuckDB connection (DuckDB connections are not)."""

    def __init__(
        self, schema: pa.Schema, meta_columns: list[str], threads: int | None = None, native_meta: bool = True,
        memory_limit_bytes: int | None = None, spill_dir: Any = None,
    ) -> None:
        """``native_meta=False`` (read-only lake views): ``meta`` and the views are defined by the caller.

        ``memory_limit_bytes`` bounds DuckDB (the ``meta`` table and every query's working memory); past
        it DuckDB spills to ``spill_dir`` (``sandbox.default_spill_dir()`` if None)."""
        self.memory_limit_bytes = memory_limit_bytes
        self.spill_dir = spill_dir
        self.schema = schema
        self.meta_columns = meta_columns
        self.lock = runtime.NativeLock("DuckDB query")  # the exit hook waits for a query in flight
        self.con = duckdb.connect(":memory:")
        if threads:
            self.con.execute(f"SET threads = {int(threads)}")
        # no file or network access, no SET: the views read only what is registered
        sandbox(self.con, memory_limit_bytes, spill_dir)
        self._empty = schema.empty_table()
        meta_schema = pa.schema([schema.field(c) for c in meta_columns] + [pa.field("_batch", pa.int64())])
        self.meta_schema = meta_schema
        self._pending: list[pa.Table] = []
        self._pending_lock = threading.Lock()  # guards ``_pending`` and ``meta_rows_hint``
        # one lake registration at a time (``register_lake``); a holder counts as a lake call in flight, so a
        # thread inside one when the process exits finishes it rather than being parked with the lock held
        self._lake_views = runtime.NativeLock("lake views", refuse=False)
        self._pending_counts: list[pa.Table] = []
        self._pending_count_rows = 0
        self._pending_replays: list[pa.Table] = []
        self._pending_replay_rows = 0
        self._local = threading.local()
        self._tiers: Sequence[Tier] = ()
        self._tiers_lock: Any = threading.RLock()
        self._synced: tuple[int, ...] = ()
        self._tasks: TaskQueue | None = None
        self._persist: Callable[[list[str], list[int]], None] | None = None
        self._on_flushed: Callable[[], None] = lambda: None
        self._flush_queued = False
        self._view_statements: list[str] = []
        self._sources: dict[str, str] = {}  # predicate shape -> "meta" / "rollouts" (``source_for``)
        self._warm_guard = threading.Lock()
        self._warm_queued = False
        self._last_write = 0.0
        self._closed = False
        self.warmed = 0  # warm-ups run (stats, tests)
        #: rows given to insert_meta minus keys deleted: sizes the samplers' first guesses, no query needed
        self.meta_rows_hint = 0
        self._persist_priorities: Callable[[list[str], list[float]], None] | None = None
        self.keeps_priorities = native_meta
        self.memory_bytes = 0  # what DuckDB holds (``meta`` above all), as of the last insert or delete
        self._measured_at = -MEMORY_MEASURE_EVERY_S  # monotonic time of the last duckdb_memory() reading
        self._unmeasured_rows = 0  # rows inserted, deleted or re-prioritized since
        if native_meta:
            self.con.register("meta_seed", meta_schema.empty_table())
            self.con.execute(sql_text("meta_table"))
            self.con.unregister("meta_seed")
            self.con.execute(sql_text("priority_table"))
            self.con.execute(sql_text("replay_table"))
            self._register_sources({"hot_data": self._empty, "warm_data": self._empty, "cold_data": self._empty,
                                    "cold_batches": pa.table({"_batch": pa.array([], pa.int64())})})

    # registration ------------------------------------------------------------------------
    def attach_tiers(self, tiers: Sequence[Tier], lock: Any) -> None:
        """Serve ``<tier.name>`` views from these tiers; ``lock`` is the one their changes hold."""
        self._tiers, self._tiers_lock, self._synced = tuple(tiers), lock, ()
        self.sync()

    def sync(self) -> None:
        """Re-register the tiers' Arrow sources if any tier changed since the last sync."""
        if not self._tiers:
            return
        with self._tiers_lock:
            state = tuple(t.version for t in self._tiers)
            if state != self._synced:
                sources: dict[str, Any] = {}
                for t in self._tiers:  # a tier with more than one object (the cold tier) names them itself
                    sources.update(t.sources() if hasattr(t, "sources") else {f"{t.name}_data": t.arrow_source()})
                self._register_sources(sources)
                self._synced = state

    def _register_sources(self, sources: dict[str, Any]) -> None:
        """Register the tiers' objects; the views over them are (re)defined only when their SQL changed:
        a view binds the registered name at query time, so a new object needs no new view (half of
        a sync's ~4 ms, paid by the first statement after every push)."""
        statements = [self.render("tier_views", cold_columns=self.columns_sql()), sql_text("rollouts_view")]
        if statements == self._view_statements:
            self.define_views(sources, [])
        else:
            self.define_views(sources, statements)
            self._view_statements = statements

    def columns_sql(self) -> str:
        """The buffer's columns, quoted, in order (the cold rows' projection: the lake adds partition columns)."""
        return ", ".join('"' + c.replace('"', '""') + '"' for c in self.schema.names)

    def define_views(self, sources: dict[str, Any], statements: Sequence[str]) -> None:
        """Register Arrow objects by name, then run the statements that define views over them."""
        with self.lock:
            for name, obj in sources.items():
                self.con.register(name, obj)
            for stmt in statements:
                self.con.execute(stmt)
            if statements:
                self._sources.clear()  # ``meta`` may have other columns now

    def register_lake(self, lake: Any, run_id: str) -> None:
        """Point the ``cold`` (this run) and ``lake`` (all runs) views at the lake's snapshots. The Delta
        log is read before the connection's lock is taken: a push queues its metadata under that lock,
        and waited for the log's read (a third of a paced push's time, p99 12x its p50). Registrations
        follow one another (``_lake_views``), so a newer snapshot's views are never replaced by older ones."""
        with self._lake_views:
            views = [lake.view_of("cold", run_id=run_id), lake.view_of("lake")]
            with self.lock:
                for view in views:
                    view.apply(self.con)

    # metadata table ----------------------------------------------------------------------
    def insert_meta(self, meta: pa.Table) -> None:
        """Queue metadata rows; they reach DuckDB in one INSERT before the next statement.

        A DuckDB statement costs milliseconds, a push should not: many pushes share one insert.
        """
        with self._pending_lock:  # not the connection's lock: a push never waits for a statement
            self._pending.append(meta)
            self.meta_rows_hint += meta.num_rows
        self._maybe_flush()
        self.warm_soon()

    def warm_soon(self) -> None:
        """Once writes have been quiet for ``WARM_QUIET_S``, apply the queued metadata inserts on the
        p1 worker, so the next statement (the first ``sample`` after an ingest) does not pay them
        (issue 26). While writes keep coming it waits (many pushes share one insert).

        It does not re-register the tiers' objects (``sync``): a registration keeps the hot tables
        it names alive, and hot batches written back after it would stay in RAM outside the budget
        until the next sync (measured: +38 MB over a 64 MB budget in a push-only run). A sync costs
        the next statement ~2 ms (objects only; the views are not redefined)."""
        if self._tasks is None or WARM_QUIET_S is None:
            return
        self._last_write = time.monotonic()
        with self._warm_guard:
            if self._warm_queued:
                return
            self._warm_queued = True
        self._schedule_warm(WARM_QUIET_S)

    def _schedule_warm(self, delay_s: float) -> None:
        try:
            self._tasks.submit_later(P1, self._warm, delay_s, name="catalog warm-up", surface=False)
        except LakeBufferError:  # the queue is stopping (close): nothing left to warm for
            with self._warm_guard:
                self._warm_queued = False

    def _warm(self) -> None:
        quiet = time.monotonic() - self._last_write
        if quiet < WARM_QUIET_S:  # written since it was queued: wait for the writes to stop
            self._schedule_warm(WARM_QUIET_S - quiet)
            return
        with self._warm_guard:
            self._warm_queued = False
        self.warm_now()

    def warm_now(self) -> None:
        """Apply queued metadata inserts now (``flush()``, the warm-up)."""
        if self._closed:
            return
        self.flush_inserts()
        self.warmed += 1

    def _flush_pending(self) -> None:
        """Insert the queued metadata (the caller holds the connection's lock); kept queued if it fails."""
        with self._pending_lock:
            if not self._pending:
                return
            taken, self._pending = self._pending, []
        batch = pa.concat_tables(taken) if len(taken) > 1 else taken[0]
        self.con.register("meta_new", batch)
        try:
            self.con.execute(sql_text("meta_insert"))
        except BaseException:
            with self._pending_lock:
                self._pending[:0] = taken
            raise
        finally:
            self.con.unregister("meta_new")
        self._measure_memory(batch.num_rows)

    def _measure_memory(self, changed_rows: int) -> None:
        """Refresh ``memory_bytes`` after ``changed_rows`` rows went in or out: the buffer counts the
        catalog against its RAM budget.

        Reading DuckDB's own figure costs ~0.5 ms, and it followed every insert and delete: a push then a
        query or a delete paid it twice (every TransferQueue clear; a ``sample`` after each push). So it is
        read again only after ``MEMORY_MEASURE_EVERY_S`` or once more than ``MEMORY_MEASURE_ROWS`` rows (or a
        tenth of ``meta``) changed since the last reading: the figure lags by at most that many rows.
        """
        self._unmeasured_rows += changed_rows
        now = time.monotonic()
        if (now - self._measured_at < MEMORY_MEASURE_EVERY_S
                and self._unmeasured_rows <= max(MEMORY_MEASURE_ROWS, self.meta_rows_hint // 10)):
            return
        self.memory_bytes = int(self.con.execute(sql_text("catalog_memory")).fetchall()[0][0] or 0)
        self._measured_at, self._unmeasured_rows = now, 0

    def delete_meta(self, keys: pa.Array) -> None:
        with self.lock:
            self._flush_pending()
            with self._pending_lock:
                self.meta_rows_hint = max(0, self.meta_rows_hint - len(keys))
            self.con.register("meta_gone", pa.table({"key": keys}))
            self.con.execute(sql_text("meta_delete"))
            if self.keeps_priorities:
                self.con.execute(render_sql("priority_delete", table="meta_gone"))
            self.con.unregister("meta_gone")
            self._measure_memory(len(keys))

    def add_sample_counts(self, counts: pa.Table) -> None:
        """Queue replays (columns key, n); they reach ``meta`` in one UPDATE before a statement needs them.

        The UPDATE joins all of ``meta`` (~0.3 s at 10M rows), so it must not run after every
        sample: samplers that do not read ``sample_count`` run with counts deferred.
        """
        with self.lock:
            self._pending_counts.append(counts)
            self._pending_count_rows += counts.num_rows

    def add_replay_events(self, events: pa.Table) -> None:
        """Queue replay events (``engine.replays.REPLAY_SCHEMA``): inserted before the next statement that
        reads ``replays``, or in the background past ``_QUEUED_REPLAY_ROWS`` -- not on every ``sample``,
        where the insert cost 5-40 ms per call at 0.5-10M rows (BENCHMARKS.md, issue 17)."""
        with self.lock:
            self._pending_replays.append(events)
            self._pending_replay_rows += events.num_rows
        self._maybe_flush()

    def flush_replays(self) -> None:
        """Insert queued replay events into ``replays`` now."""
        with self.lock:
            self._flush_replays()

    def _flush_replays(self) -> None:
        if not self._pending_replays:
            return
        self.con.register("replays_new", pa.concat_tables(self._pending_replays))
        try:
            self.con.execute("INSERT INTO replays SELECT * FROM replays_new")
        finally:
            self.con.unregister("replays_new")
        self._pending_replays.clear()
        self._pending_replay_rows = 0

    @property
    def pending(self) -> tuple[int, int]:
        """Metadata rows and replay counts queued for DuckDB (the buffer flushes big queues early)."""
        with self._pending_lock:
            return sum(t.num_rows for t in self._pending), self._pending_count_rows

    def _flush_counts(self) -> None:
        if not self._pending_counts:
            return
        counts = pa.concat_tables(self._pending_counts)  # repeated keys are summed by the UPDATE
        self._flush_pending()
        self.con.register("meta_counts", counts)
        try:
            self.con.execute(sql_text("meta_add_counts"))
        finally:
            self.con.unregister("meta_counts")
        self._pending_counts.clear()
        self._pending_count_rows = 0

    def queued_counts(self) -> pa.Table | None:
        """Replays not yet applied to ``meta`` (columns key, n; a key may repeat)."""
        with self.lock:
            return pa.concat_tables(self._pending_counts) if self._pending_counts else None

    def flush(self) -> None:
        """Apply every queued insert, replay count and replay event now."""
        with self.lock:
            self._flush_pending()
            self._flush_counts()
            self._flush_replays()

    def flush_inserts(self) -> None:
        """Apply queued metadata inserts now (replay counts stay queued)."""
        with self.lock:
            self._flush_pending()

    @contextmanager
    def counts_deferred(self) -> Iterator[None]:
        """Within this block (this thread), queries do not wait for queued replay counts."""
        self._local.defer = True
        try:
            yield
        finally:
            self._local.defer = False

    # replay counts and background flushes -------------------------------------------------
    def run_in_background(self, tasks: TaskQueue, persist_counts: Callable[[list[str], list[int]], None],
                          on_flushed: Callable[[], None] = lambda: None) -> None:
        """Persist replay counts with ``persist_counts`` and apply big queues on ``tasks``;
        ``on_flushed`` runs after a background flush (the catalog grew: the budget shrank)."""
        self._tasks, self._persist, self._on_flushed = tasks, persist_counts, on_flushed

    def load_replays(self, counts: dict[str, int]) -> None:
        """Replays persisted before this open (key -> count since push)."""
        if counts:
            self.add_sample_counts(pa.table({"key": list(counts), "n": list(counts.values())}))

    def record_replays(self, keys: pa.Array) -> None:
        """Add one to ``sample_count`` of each key (repeats count): queued, persisted in the background (p0)."""
        if len(keys) == 0:
            return
        vc = pc.value_counts(keys)
        counts = pa.table({"key": vc.field("values"), "n": vc.field("counts")})
        self.add_sample_counts(counts)  # queued; applied before anything reads sample_count
        if self._tasks is not None and self._persist is not None:
            persist = self._persist
            self._tasks.submit(P0, lambda: persist(counts.column("key").to_pylist(), counts.column("n").to_pylist()),
                               name="persist replay counts")
        self._maybe_flush()

    # priorities (update_priority) --------------------------------------------------------
    def persist_priorities_with(self, persist: Callable[[list[str], list[float]], None]) -> None:
        """``persist(keys, priorities)`` makes set priorities durable (the index) before they apply."""
        self._persist_priorities = persist

    def set_priorities(self, keys: pa.Array, priorities: pa.Array, persist: bool = True) -> None:
        """Replace the priority of each key (keys unique); persisted first, then visible to samplers."""
        if len(keys) == 0:
            return
        if persist and self._persist_priorities is not None:
            self._persist_priorities(keys.to_pylist(), priorities.to_pylist())
        new = pa.table({"key": keys.cast(pa.string()), "priority": priorities.cast(pa.float64())})
        with self.lock:
            self.con.register("priority_new", new)
            try:
                self.con.execute("BEGIN")
                self.con.execute(render_sql("priority_delete", table="priority_new"))
                self.con.execute(sql_text("priority_insert"))
                self.con.execute("COMMIT")
            except BaseException:
                self.con.execute("ROLLBACK")
                raise
            finally:
                self.con.unregister("priority_new")
            self._measure_memory(new.num_rows)

    def load_priorities(self, priorities: dict[str, float]) -> None:
        """Priorities persisted before this open."""
        if priorities:
            self.set_priorities(pa.array(list(priorities), pa.string()), pa.array(list(priorities.values())),
                                persist=False)

    def priority_sql(self, default: str, source: str) -> str:
        """SQL for a row's priority: the one ``update_priority`` set, else the ``default`` expression."""
        if not self.keeps_priorities:
            return f"({default})::DOUBLE"
        # one line: templates may quote a field inside a -- comment
        return render_sql("priority_of", source=source, default=default).strip()

    def live_counts(self, table: pa.Table) -> pa.Table:
        """``table`` with its ``sample_count`` replaced by the live count: ``meta``'s plus replays queued."""
        with self.counts_deferred():  # do not wait for the queued UPDATE: add the queue here
            live = self.query(sql_text("live_sample_counts"), sync=False, wanted=table.select(["key"]))
            queued = self.queued_counts()
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

    def _maybe_flush(self) -> None:
        """Move queued metadata inserts / replay counts into DuckDB in the background (p1).

        Inserts go at 8k rows: queued tables keep slices of hot batches alive (8k measured 20 MB
        less peak RSS than 64k). Replay counts wait for 256k: their UPDATE joins all of ``meta``
        (~0.3 s at 10M rows) and holds the catalog: at 8k it stalled one 256-key sample in 30.
        Replay events go at 64k rows (their queue is the only bound on them between analysis queries).
        """
        if self._tasks is None:
            return
        meta_rows, count_rows = self.pending
        replay_rows = self._pending_replay_rows
        if (meta_rows > _QUEUED_META_ROWS or count_rows > _QUEUED_COUNT_ROWS or replay_rows > _QUEUED_REPLAY_ROWS) \
                and not self._flush_queued:
            self._flush_queued = True

            def flush() -> None:
                try:
                    if replay_rows > _QUEUED_REPLAY_ROWS:
                        self.flush_replays()
                    if count_rows > _QUEUED_COUNT_ROWS:
                        self.flush()
                    elif meta_rows > _QUEUED_META_ROWS:
                        self.flush_inserts()
                finally:
                    self._flush_queued = False
                self._on_flushed()

            self._tasks.submit(P1, flush, name="catalog flush")

    # queries -----------------------------------------------------------------------------
    def query(self, sql: str, params: list | dict | None = None, *, sync: bool = True, **tables: Any) -> pa.Table:
        """Run ``sql`` and return an Arrow table; DuckDB errors become ``QueryError``.

        Keyword arguments register Arrow objects under those names for the query's duration.
        """
        if sync:
            self.sync()
        with self.lock:
            try:
                self._flush_pending()
                if self._pending_replays and _READS_REPLAYS.search(sql):
                    self._flush_replays()
                if not getattr(self._local, "defer", False):
                    self._flush_counts()
                for name, obj in tables.items():
                    self.con.register(name, obj)
                rel = self.con.sql(sql, params=params) if params is not None else self.con.sql(sql)
                try:
                    return rel.to_arrow_table() if rel is not None else pa.table({})
                finally:
                    rel = None  # freed under the lock: its destructor is native code too (exit safety)
            except duckdb.Error as e:
                raise query_error(e) from e
            finally:
                for name in tables:
                    self.con.unregister(name)
                tables.clear()  # freed under the lock (exit safety: a Dataset's destructor is native code)

    def user_query(self, sql: str, params: list | dict | None = None) -> pa.Table:
        """A user's ``sql()``: one read-only statement (``sandbox.check_read_only``), then ``query``."""
        return self.query(check_read_only(sql), params)

    def source_for(self, where: str | None, *, checked: bool = False) -> str:
        """``meta`` if the predicate only needs metadata columns, else ``rollouts`` (all columns).
        ``checked``: ``where`` is already ``predicate.check``'s output (not parsed a second time)."""
        pred = (where or "TRUE") if checked else check_predicate(where)
        if pred == "TRUE":
            return "meta"
        # which columns a predicate binds to does not depend on its literals: one probe per shape (a
        # TransferQueue clear's ``tq_index IN (...)`` of 16 indexes is one shape; a probe costs ~3 ms)
        shape = predicate.binding_shape(pred)
        known = self._sources.get(shape)
        if known is not None:
            return known
        with self.lock:
            try:
                self.con.execute(self.render("probe_predicate", source="meta", where=pred))
                found = "meta"
            except duckdb.BinderException:
                found = "rollouts"
            except duckdb.Error as e:
                raise query_error(e) from e
        if len(self._sources) >= SOURCE_SHAPES:
            self._sources.clear()
        self._sources[shape] = found
        return found

    def render(self, name: str, **fields: Any) -> str:
        """An ``sql/<name>.sql`` template with ``{field}`` placeholders filled."""
        return render_sql(name, **fields)

    def count(self, where: str | None, source: str | None = None) -> int:
        """Rows matching a user's ``where`` (the strict predicate check: no subqueries or statements)."""
        t = self.query_where("count_where", predicate.check(where), source)
        return int(t.column(0)[0].as_py())

    def query_where(self, template: str, pred: str, source: str | None = None) -> pa.Table:
        """``template`` (``{source}``, ``{where}``) over the relation the checked ``pred`` needs. ``meta`` is
        a DuckDB table: a statement over it alone re-registers no tier's objects (after every push that
        sync cost a small delete or count ~3 ms)."""
        source = source or self.source_for(pred, checked=True)
        return self.query(self.render(template, source=source, where=pred), sync=source != "meta")

    def close(self) -> None:
        self._closed = True
        with self.lock:
            self.con.close()
