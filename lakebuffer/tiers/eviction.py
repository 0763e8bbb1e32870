"""Which batches leave a tier first (``evict=``): recency, or what the samplers want to keep close.

A tier moves whole batches, so a policy scores a batch once, when it enters the tier, from the
batch's own metadata columns: ``"lru"`` (no score; least recently used first, today's behaviour),
``"oldest_version"`` (its newest ``policy_version``: stale policies leave first, the order a
freshness sampler wants) or a SQL expression over metadata columns giving a keep priority per row,
e.g. ``"policy_version * 10 + reward"`` or ``"verified"`` (a batch keeps its most valuable row's
priority: ``max`` over the batch, so one wanted row keeps its batch). Lowest score leaves first;
ties, and every batch under ``"lru"``, go least recently used first.

Scoring at entry instead of querying the catalog when room is needed keeps eviction off the
catalog's lock (eviction runs under the engine's lock, the catalog's background flush takes them the
other way round) and costs one small DuckDB query per batch (its metadata only). Values that change
after entry (``sample_count``, priorities) are seen as they were when the batch arrived.
"""

from __future__ import annotations

import threading

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from .. import predicate
from ..errors import OptionError, QueryError
from ..sandbox import sandbox

NAMED = ("lru", "oldest_version")


class EvictionPolicy:
    """Scores batches for one ``evict=`` setting; ``None`` means "by recency only"."""

    def __init__(self, evict: str = "lru", columns: frozenset[str] | None = None) -> None:
        if not isinstance(evict, str) or not evict.strip():
            raise OptionError(f"evict must be 'lru', 'oldest_version' or a SQL expression over metadata, not {evict!r}")
        self.evict = evict.strip()
        self._expr: str | None = None
        self._lock = threading.Lock()
        self._con: duckdb.DuckDBPyConnection | None = None
        if self.evict not in NAMED:
            try:
                self._expr = predicate.check_expression(self.evict, "evict")
                used = predicate.parse(self.evict, "evict").columns
            except (QueryError, ValueError) as e:
                raise OptionError(f"evict={evict[:200]!r} is not a valid SQL expression: {e}") from e
            if columns is not None and used and not used <= columns:
                raise OptionError(f"evict={evict!r} uses {sorted(used - columns)}, which are not metadata columns "
                                  f"(it may use {sorted(columns)})")

    @property
    def by_recency(self) -> bool:
        return self.evict == "lru"

    def score(self, table: pa.Table) -> float | None:
        """The batch's keep priority (higher stays longer); ``None`` under ``"lru"`` or for no rows."""
        if self.by_recency or table.num_rows == 0:
            return None
        if self.evict == "oldest_version":
            v = pc.max(table.column("policy_version")).as_py()
            return None if v is None else float(v)
        with self._lock:
            if self._con is None:
                self._con = sandbox(duckdb.connect())
            self._con.register("batch", table)
            try:
                v = self._con.execute(f"SELECT max({self._expr})::DOUBLE FROM batch").fetchall()[0][0]
            except duckdb.Error as e:
                raise QueryError(f"evict={self.evict!r} failed on a batch: {type(e).__name__}: {e}") from e
            finally:
                self._con.unregister("batch")
        return None if v is None else float(v)
