"""Reads by key (``get``) and streaming scans across the hot and warm tiers.

``get`` resolves keys in the index, groups them by tier and asks each tier for its rows with one
vectorised ``take`` (no per-row Python), then restores the caller's order; ``sample_count`` comes
back live from the catalog, which owns replay counts.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa

from .. import predicate
from ..catalog import stream
from ..errors import CorruptionError, KeyNotFoundError, QueryError
from ..schema import key_list, projection
from ..tiers import Location
from ..tiers.base import gather
from ..tiers.cold import StaleLocation
from .diskbudget import cold_plan
from .state import BufferState


def get(s: BufferState, keys: Sequence[str] | pa.Array, columns: Sequence[str] | None) -> pa.Table:
    """Rows for ``keys`` in the order given, with only ``columns`` read (all if None)."""
    with s.gate.shared():  # a delete waits for the whole read (its warm/cold takes run outside the lock)
        return _get(s, keys, columns)


def _get(s: BufferState, keys: Sequence[str] | pa.Array, columns: Sequence[str] | None) -> pa.Table:
    keys = key_list(keys)
    cols, fetch = projection(s.schema, columns)
    if cols and "sample_count" not in cols:
        fetch = cols  # rows come back by position; ``key`` is read only to join live replay counts
    if not keys:
        return pa.schema([s.schema.field(c) for c in cols]).empty_table()
    table = _fetch(s, keys, fetch, retry=True)
    if "sample_count" in cols:
        table = s.catalog.live_counts(table)
    return table.select(cols)


def _fetch(s: BufferState, keys: list[str], fetch: list[str], retry: bool) -> pa.Table:
    """The rows of ``keys`` with ``fetch`` columns, planned by tier under the lock, read outside it;
    cold rows found stale are found again and fetched once more, planned anew (``retry``)."""
    out_schema = pa.schema([s.schema.field(c) for c in fetch])
    with s.lock:
        batch, pos, found = s.index.lookup(keys)
        if not found.all():
            raise KeyNotFoundError(f"key {keys[int(np.flatnonzero(~found)[0])]!r} is not in the buffer")
        uniq, first = np.unique(batch, return_inverse=True)
        in_hot = np.array([s.hot.get(int(b)) is not None for b in uniq.tolist()], dtype=bool)
        in_cold = np.array([not h and s.batches[int(b)].tier == "cold" for b, h in zip(uniq.tolist(), in_hot)],
                           dtype=bool)
        in_warm = ~in_hot & ~in_cold
        hot_rows = np.flatnonzero(in_hot[first])
        warm_rows = np.flatnonzero(in_warm[first])
        cold_rows = np.flatnonzero(in_cold[first])
        parts: list[pa.Table] = []
        order: list[np.ndarray] = []
        if len(hot_rows):
            parts.append(s.hot.take(Location.of(batch[hot_rows], pos[hot_rows]), fetch))
            order.append(hot_rows)
        if len(warm_rows):
            frag = np.empty(len(uniq), dtype=np.int64)
            offset = np.zeros(len(uniq), dtype=np.int64)
            for i in np.flatnonzero(in_warm).tolist():
                info = s.batches[int(uniq[i])]
                frag[i], offset[i] = info.fragment, info.offset
            where = Location.of(frag[first[warm_rows]], offset[first[warm_rows]] + pos[warm_rows])
        warm = s.warm
        # a cold batch's locations are read under the lock that told it cold: a promotion (lazy warm,
        # promote_cold_reads) flips it warm and drops them in one step under that lock
        cold_where = _cold_locations(s, batch[cold_rows], pos[cold_rows]) if len(cold_rows) else None
        s.served["hot"] += len(hot_rows)
        s.served["warm"] += len(warm_rows)
        s.served["cold"] += len(cold_rows)
    if len(warm_rows):
        parts.append(warm.take(where, fetch).select(fetch))
        order.append(warm_rows)
    if len(cold_rows):
        parts.append(_take_cold(s, [keys[i] for i in cold_rows.tolist()], batch[cold_rows], fetch, cold_where, retry))
        order.append(cold_rows)
        if s.on_cold_read is not None:
            s.on_cold_read(np.unique(batch[cold_rows]).tolist())
    return _in_order([p.cast(out_schema) for p in parts], order, out_schema)


def _take_cold(s: BufferState, keys: list[str], batch: np.ndarray, columns: list[str], where: Location,
               retry: bool) -> pa.Table:
    with s.cold_reads_lock:  # a lazy resume's background warming yields to cold reads (``engine/promotion``)
        s.cold_reads_running += 1
    try:
        return _take_cold_once(s, keys, batch, columns, where, retry)
    finally:
        with s.cold_reads_lock:
            s.cold_reads_running -= 1
            s.last_cold_read = time.monotonic()


def _take_cold_once(s: BufferState, keys: list[str], batch: np.ndarray, columns: list[str], where: Location,
                    retry: bool) -> pa.Table:
    """Cold rows from their lake locations (``where``, read under the lock). A stale location (compaction,
    lake deletes) is found again and recorded, and the keys are fetched once more, planned by tier anew:
    meanwhile a promotion may have moved their batch to the warm tier (and dropped its cold locations)."""
    try:
        return s.cold.take_checked(where, columns, keys)
    except StaleLocation:
        if not retry:
            raise CorruptionError(f"rows of cold batches {sorted(set(batch.tolist()))} are not where the lake's "
                                  f"files say; run `lakebuffer fsck {s.path}`") from None
    relocate(s, sorted(set(batch.tolist())))
    return _fetch(s, keys, columns, retry=False)


def _cold_locations(s: BufferState, batch: np.ndarray, pos: np.ndarray) -> Location:
    """(file number, row in file) of each (cold batch, position), from the index's location records."""
    part = np.empty(len(batch), np.int64)
    row = np.empty(len(batch), np.int64)
    uniq, inv = np.unique(batch, return_inverse=True)
    order = np.argsort(inv, kind="stable")  # the asked rows of each batch: order[bounds[i]:bounds[i + 1]]
    bounds = np.searchsorted(inv[order], np.arange(len(uniq) + 1)).tolist()
    numbers: dict[str, int] = {}
    for i, (b, locs) in enumerate(zip(uniq.tolist(), s.index.cold_locations_many(uniq.tolist()))):
        if locs is None:
            raise CorruptionError(f"cold batch {b}: its lake locations are missing from the key index; "
                                  f"run `lakebuffer fsck --repair {s.path}`")
        files, file_idx, rows = locs  # (read-only views of the record)
        for e in files:
            if e["path"] not in numbers:
                numbers[e["path"]] = s.cold.number(e)
        sel = order[bounds[i]:bounds[i + 1]]
        at = pos[sel]
        part[sel] = [numbers[files[f]["path"]] for f in file_idx[at].tolist()]
        row[sel] = rows[at]
    return Location(part, row)


def relocate(s: BufferState, batch_ids: list[int]) -> None:
    """Find the rows of cold batches in the lake's live files again and record where they are now."""
    s.cold.invalidate()
    moves = []
    for bid in batch_ids:
        plan = cold_plan(s, bid)
        if plan is None:
            raise CorruptionError(f"cold batch {bid}: some of its rows are not in the lake's live files of run "
                                  f"{s.run_id!r} any more; run `lakebuffer fsck {s.path}`")
        _n, files, fi, rw = plan
        with s.lock:
            info = s.batches.get(bid)
            if info is None or info.tier != "cold":
                continue
            info.files = [f["path"] for f in files]
            moves.append((info, files, fi, rw))
    with s.lock:
        s.index.set_cold(moves)
        for info, files, _fi, _rw in moves:
            s.cold.admit(info.batch_id, info.rows, info.nbytes, files)


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
    """Every live row of one batch, all columns, with live replay counts (for snapshots).

    Under the read gate: a delete blanking warm rows cannot land between the lookup and the take."""
    with s.gate.shared():
        return _read_batch(s, bid)


def _read_batch(s: BufferState, bid: int) -> pa.Table | None:
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


#: A scan's default record batch holds about this share of the RAM budget (at least ``SCAN_MIN_BYTES``):
#: 4,096 rows of GRPO payload are ~70 MB, and a scan holds ~4 batches of it (DuckDB's chunks, the Arrow
#: batch being built, the caller's), which passed issue 16's bound at a 32 MB budget
SCAN_BUDGET_SHARE, SCAN_MIN_BYTES, SCAN_MAX_ROWS = 16, 1 << 20, 4096


def row_bytes(s: BufferState, columns: Sequence[str]) -> float | None:
    """Arrow bytes per row of ``columns``, from the newest local rows (a hot batch, else the newest warm
    fragment), or the tiers' average over all columns when only the lake holds rows; None when empty."""
    with s.lock:
        tables = s.hot.tables()
        sample = tables[-1] if tables else None
        frags = s.warm.fragment_ids() if sample is None else []
    if sample is None and frags:  # the newest fragment's bytes on disk per row (its IPC layout; no data read)
        layout = s.warm.opened(frags[-1]).layout
        if layout.rows:
            return layout.column_bytes([c for c in columns]) / layout.rows
    if sample is not None and sample.num_rows:
        return sample.select([c for c in columns if c in sample.column_names]).nbytes / sample.num_rows
    cold = s.cold.stats() if s.cold is not None else {"rows": 0}
    return cold["bytes"] / cold["rows"] if cold["rows"] else None


def scan_batch_rows(s: BufferState, columns: Sequence[str], memory_limit_bytes: int) -> int:
    """Rows per record batch of a scan that keeps a batch near 1/``SCAN_BUDGET_SHARE`` of the budget."""
    width = row_bytes(s, columns)
    if not width:
        return SCAN_MAX_ROWS
    target = max(SCAN_MIN_BYTES, memory_limit_bytes // SCAN_BUDGET_SHARE)
    return int(min(max(target // width, 16), SCAN_MAX_ROWS))


def scan(s: BufferState, where: str | None, columns: Sequence[str] | None, batch_size: int) -> Iterator[pa.RecordBatch]:
    """Stream matching rows from a snapshot of hot + warm + cold-only taken when iteration starts."""
    pred = predicate.check(where)
    cols = list(columns) if columns is not None else list(s.schema.names)
    with s.lock:
        tables = {f"{t.name}_data": t.arrow_source() for t in (s.hot, s.warm)}
        tables.update(s.cold.sources())
        # the cold rows' keys, as of this snapshot (keys only: ~20 bytes a cold row)
        tables["cold_keys"] = s.catalog.query(s.catalog.render("cold_keys"), sync=False, cold_batches_now=tables.pop("cold_batches"))
    sql = s.catalog.render("scan", columns=", ".join(f'"{c}"' for c in cols), where=pred,
                           cold_columns=s.catalog.columns_sql())
    try:
        yield from stream(sql, tables, batch_size, memory_limit_bytes=s.catalog.memory_limit_bytes,
                          spill_dir=s.catalog.spill_dir)
    except QueryError as e:
        if "warm_data" in str(e):  # DuckDB: "reading the stream registered as 'warm_data' failed"
            s.warm.check_readable(cols)  # raises CorruptionError naming the fragment
        raise
