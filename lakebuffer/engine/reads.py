"""Reads by key (``get``) and streaming scans across the hot and warm tiers.

``get`` resolves keys in the index, groups them by tier and asks each tier for its rows with one
vectorised ``take`` (no per-row Python), then restores the caller's order; ``sample_count`` comes
back live from the catalog, which owns replay counts.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa

from .. import predicate
from ..catalog import stream
from ..errors import KeyNotFoundError, QueryError
from ..schema import key_list, projection
from ..tiers import Location
from ..tiers.base import gather
from .state import BufferState


def get(s: BufferState, keys: Sequence[str] | pa.Array, columns: Sequence[str] | None) -> pa.Table:
    """Rows for ``keys`` in the order given, with only ``columns`` read (all if None)."""
    keys = key_list(keys)
    cols, fetch = projection(s.schema, columns)
    if cols and "sample_count" not in cols:
        fetch = cols  # rows come back by position; ``key`` is read only to join live replay counts
    out_schema = pa.schema([s.schema.field(c) for c in fetch])
    if not keys:
        return pa.schema([s.schema.field(c) for c in cols]).empty_table()
    with s.lock:
        batch, pos, found = s.index.lookup(keys)
        if not found.all():
            raise KeyNotFoundError(f"key {keys[int(np.flatnonzero(~found)[0])]!r} is not in the buffer")
        uniq, first = np.unique(batch, return_inverse=True)
        in_hot = np.array([s.hot.get(int(b)) is not None for b in uniq.tolist()], dtype=bool)
        hot_rows = np.flatnonzero(in_hot[first])
        warm_rows = np.flatnonzero(~in_hot[first])
        parts: list[pa.Table] = []
        order: list[np.ndarray] = []
        if len(hot_rows):
            parts.append(s.hot.take(Location.of(batch[hot_rows], pos[hot_rows]), fetch))
            order.append(hot_rows)
        if len(warm_rows):
            frag = np.empty(len(uniq), dtype=np.int64)
            offset = np.zeros(len(uniq), dtype=np.int64)
            for i in np.flatnonzero(~in_hot).tolist():
                info = s.batches[int(uniq[i])]
                frag[i], offset[i] = info.fragment, info.offset
            where = Location.of(frag[first[warm_rows]], offset[first[warm_rows]] + pos[warm_rows])
        warm = s.warm
    if len(warm_rows):
        parts.append(warm.take(where, fetch).select(fetch))
        order.append(warm_rows)
    table = _in_order([p.cast(out_schema) for p in parts], order, out_schema)
    if "sample_count" in cols:
        table = s.catalog.live_counts(table)
    return table.select(cols)


def _in_order(parts: list[pa.Table], order: list[np.ndarray], schema: pa.Schema) -> pa.Table:
    """Rows of ``parts`` put back in the caller's order (``order[i][j]``: where row j of part i goes).

    ``tiers.gather`` (zero-copy slices, one concat per column): a pyarrow ``take`` of list columns
    costs ~10x more at 256 rows (measured, issue 17). One part is already in order.
    """
    if len(parts) == 1:
        return parts[0]
    src = np.concatenate([np.full(len(o), i, np.int64) for i, o in enumerate(order)])
    row = np.concatenate([np.arange(len(o), dtype=np.int64) for o in order])
    dest = np.argsort(np.concatenate(order))
    return gather(parts, src[dest], row[dest], schema.names)


def read_batch(s: BufferState, bid: int) -> pa.Table | None:
    """Every live row of one batch, all columns, with live replay counts (for snapshots)."""
    with s.lock:
        info = s.batches.get(bid)
        if info is None:
            return None
        hb = s.hot.get(bid, touch=False)
        if hb is not None:
            table = hb.table
        else:
            meta = s.index.batch_meta(bid)
            _, pos, _ = s.index.lookup(meta.column("key").to_pylist())
            where = Location.of(info.fragment, info.offset + pos)
    if hb is None:
        table = s.warm.take(where, list(s.schema.names))
    return s.catalog.live_counts(table)


def scan(s: BufferState, where: str | None, columns: Sequence[str] | None, batch_size: int) -> Iterator[pa.RecordBatch]:
    """Stream matching rows from a snapshot of hot + warm taken when iteration starts."""
    pred = predicate.check(where)
    cols = list(columns) if columns is not None else list(s.schema.names)
    with s.lock:
        tables = {f"{t.name}_data": t.arrow_source() for t in (s.hot, s.warm)}
    sql = s.catalog.render("scan", columns=", ".join(f'"{c}"' for c in cols), where=pred)
    try:
        yield from stream(sql, tables, batch_size, memory_limit_bytes=s.catalog.memory_limit_bytes,
                          spill_dir=s.catalog.spill_dir)
    except QueryError as e:
        if "warm_data" in str(e):  # DuckDB: "reading the stream registered as 'warm_data' failed"
            s.warm.check_readable(cols)  # raises CorruptionError naming the fragment
        raise
