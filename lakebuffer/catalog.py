"""The DuckDB catalog: one connection exposing ``rollouts`` (all tiers), per-tier views and ``meta``.

Hot tables and the warm Lance dataset are registered as Arrow objects (zero-copy scans with
projection and filter pushdown); ``meta`` is a native DuckDB table of the metadata columns only,
which is what samplers select keys on, so selection never touches payload columns.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import duckdb
import pyarrow as pa

from . import predicate
from .errors import QueryError
from .resources import render_sql, sql_text


def check_predicate(where: str | None) -> str:
    """A ``where`` is one boolean SQL expression; ``None`` or empty means every row."""
    # also receives what the samplers composed around a checked where (their own subqueries over meta)
    return predicate.check(where, composed=True)


def stream(sql: str, tables: dict[str, Any], batch_size: int, setup: list[str] = ()) -> Iterator[pa.RecordBatch]:
    """Stream ``sql``'s result over ``tables`` (Arrow objects by name) from a private connection.

    A scan may be consumed slowly (a training loop); on its own connection it never holds the
    catalog's lock, and the registered objects are a consistent snapshot the caller chose.
    """
    con = duckdb.connect()
    try:
        for name, obj in tables.items():
            con.register(name, obj)
        for stmt in setup:
            con.execute(stmt)
        try:
            reader = con.sql(sql).to_arrow_reader(batch_size)
        except duckdb.Error as e:
            raise QueryError(f"{type(e).__name__}: {e}") from e
        yield from reader
    finally:
        con.close()


class Catalog:
    """Thread-safe wrapper around one DuckDB connection (DuckDB connections are not)."""

    def __init__(
        self, schema: pa.Schema, meta_columns: list[str], threads: int | None = None, native_meta: bool = True
    ) -> None:
        """``native_meta=False`` (read-only lake views): ``meta`` and the views are defined by the caller."""
        self.schema = schema
        self.meta_columns = meta_columns
        self.lock = threading.RLock()
        self.con = duckdb.connect(":memory:")
        if threads:
            self.con.execute(f"SET threads = {int(threads)}")
        self._empty = schema.empty_table()
        meta_schema = pa.schema([schema.field(c) for c in meta_columns] + [pa.field("_batch", pa.int64())])
        self.meta_schema = meta_schema
        self._pending: list[pa.Table] = []
        self._pending_counts: list[pa.Table] = []
        self._pending_count_rows = 0
        self._local = threading.local()
        self._syncer: Callable[[], None] | None = None
        self.memory_bytes = 0  # what DuckDB holds (``meta`` above all), as of the last insert or delete
        if native_meta:
            self.con.register("meta_seed", meta_schema.empty_table())
            self.con.execute(sql_text("meta_table"))
            self.con.unregister("meta_seed")
            self.register_tiers([], None)

    # registration ------------------------------------------------------------------------
    def register_tiers(self, hot_tables: list[pa.Table], warm_dataset: Any) -> None:
        """Point the tier views at the current hot tables and warm dataset version."""
        with self.lock:
            hot = pa.concat_tables(hot_tables) if hot_tables else self._empty
            self.con.register("hot_data", hot)
            self.con.register("warm_data", warm_dataset if warm_dataset is not None else self._empty)
            self.con.execute(sql_text("tier_views"))
            self.con.execute(sql_text("rollouts_view"))

    def set_syncer(self, fn: Callable[[], None]) -> None:
        """A callback run before each query so views reflect the buffer's latest state."""
        self._syncer = fn

    def sync(self) -> None:
        if self._syncer is not None:
            self._syncer()

    # metadata table ----------------------------------------------------------------------
    def insert_meta(self, meta: pa.Table) -> None:
        """Queue metadata rows; they reach DuckDB in one INSERT before the next statement.

        A DuckDB statement costs milliseconds, a push should not: many pushes share one insert.
        """
        with self.lock:
            self._pending.append(meta)

    def _flush_pending(self) -> None:
        if not self._pending:
            return
        batch = pa.concat_tables(self._pending) if len(self._pending) > 1 else self._pending[0]
        self.con.register("meta_new", batch)
        try:
            self.con.execute(sql_text("meta_insert"))
        finally:
            self.con.unregister("meta_new")
        self._pending.clear()
        self._measure_memory()

    def _measure_memory(self) -> None:
        """Refresh ``memory_bytes`` (~0.6 ms): the buffer counts the catalog against its RAM budget."""
        self.memory_bytes = int(self.con.execute(sql_text("catalog_memory")).fetchall()[0][0] or 0)

    def delete_meta(self, keys: pa.Array) -> None:
        with self.lock:
            self._flush_pending()
            self.con.register("meta_gone", pa.table({"key": keys}))
            self.con.execute(sql_text("meta_delete"))
            self.con.unregister("meta_gone")
            self._measure_memory()

    def add_sample_counts(self, counts: pa.Table) -> None:
        """Queue replays (columns key, n); they reach ``meta`` in one UPDATE before a statement needs them.

        The UPDATE joins all of ``meta`` (~0.3 s at 10M rows), so it must not run after every
        sample: samplers that do not read ``sample_count`` run with counts deferred.
        """
        with self.lock:
            self._pending_counts.append(counts)
            self._pending_count_rows += counts.num_rows

    @property
    def pending(self) -> tuple[int, int]:
        """Metadata rows and replay counts queued for DuckDB (the buffer flushes big queues early)."""
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
        """Apply every queued insert and replay count now."""
        with self.lock:
            self._flush_pending()
            self._flush_counts()

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
                if not getattr(self._local, "defer", False):
                    self._flush_counts()
                for name, obj in tables.items():
                    self.con.register(name, obj)
                rel = self.con.sql(sql, params=params) if params is not None else self.con.sql(sql)
                return rel.to_arrow_table() if rel is not None else pa.table({})
            except duckdb.Error as e:
                raise QueryError(f"{type(e).__name__}: {e}") from e
            finally:
                for name in tables:
                    self.con.unregister(name)

    def source_for(self, where: str | None) -> str:
        """``meta`` if the predicate only needs metadata columns, else ``rollouts`` (all columns)."""
        pred = check_predicate(where)
        if pred == "TRUE":
            return "meta"
        with self.lock:
            self._flush_pending()
            try:
                self.con.execute(self.render("probe_predicate", source="meta", where=pred))
                return "meta"
            except duckdb.BinderException:
                return "rollouts"
            except duckdb.Error as e:
                raise QueryError(f"{type(e).__name__}: {e}") from e

    def render(self, name: str, **fields: Any) -> str:
        """An ``sql/<name>.sql`` template with ``{field}`` placeholders filled."""
        return render_sql(name, **fields)

    def count(self, where: str | None, source: str | None = None) -> int:
        source = source or self.source_for(where)
        t = self.query(self.render("count_where", source=source, where=check_predicate(where)))
        return int(t.column(0)[0].as_py())

    def close(self) -> None:
        with self.lock:
            self.con.close()
