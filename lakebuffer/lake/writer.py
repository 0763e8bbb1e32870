"""Streaming Parquet writer of a snapshot: ``Writer`` (partition by policy bucket, bounded pending
memory) -> ``Lane`` (one encoder thread, one open file) -> ``PartFile`` (one data file, named by its
sha256, with the Delta ``add`` statistics of its footer).

Why not delta-rs' writer (``write_deltalake``): it cannot put a checksum anywhere a reader finds it (Delta
has no per-file checksum field and this deltalake has no ``tags`` on ``AddAction``), it writes no Parquet
page checksums, and it peaked at 1.3-1.6 GB RSS streaming 375 MB where pyarrow stays near 0.7 GB (issue
14). So files are encoded by pyarrow (zstd, page checksums, bounded row groups) and only *committed* by
deltalake (``lake/delta.py``). The sha256 must be known before the name is, so a file is encoded in
full before it gets its name, always into a local temporary file: for a local lake next to its final
name (renamed at the end), for an object store under ``LakeOptions.spill_dir``, then hashed by
streaming and uploaded from the file (``LakeFS.put_file``: multipart parts of ``UPLOAD_PART_BYTES``,
one at a time) on a background thread while encoding goes on; encoding into memory, as before, held
up to (``encode_threads`` + 2) x ``target_file_bytes`` of file bytes on top of the rows. Rows held by a
writer, pending or encoding, are bounded across all partitions by ``LakeOptions.memory_bytes``
(BENCHMARKS.md, "#14": peak RssAnon of each lake path before and after).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import itertools
import json
import os
import threading
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import SchemaError
from . import runtime
from .fs import LakeFS
from .layout import data_name, file_token, run_dir
from .options import LakeOptions
from .rowhash import HASH_COLUMN, hash_column, hashable, schema_with_hash
from .rows import floor_buckets

MAX_OPEN_BUCKETS = 8  # buckets with an open file per writer; the least recently written is closed first
MAX_STAT_CHARS = 64  # longer strings get no min/max in the Delta stats (optional per column)
#: Parquet data page size: a random cold read decodes about one page per asked column (BENCHMARKS.md,
#: "#23 cold get"). 32 KiB since the digests are read row by row (``benchmarks/page_size.py``, same rows,
#: one run: a 256-row take from disk 42.6 vs 51.2 ms at 64 KiB; DuckDB's payload scan +6.2% CPU over
#: the pre-#23 1 MiB pages (64 KiB: +2.6%), files +2.0% (64 KiB: +1.5%)); 16 KiB scanned +13%
DATA_PAGE_BYTES = 32 * 1024


def _leaf_paths(schema: pa.Schema) -> list[str]:
    """The Parquet column paths of ``schema``'s leaves, as pyarrow names them (``ids.list.element``):
    per-column writer settings are keyed by them. Read from an empty file of the schema (exact for any
    nesting, ~1 ms a writer)."""
    sink = pa.BufferOutputStream()
    pq.write_table(schema.empty_table(), sink)
    meta = pq.read_metadata(pa.BufferReader(sink.getvalue()))
    return [meta.schema.column(i).path for i in range(meta.num_columns)]


def parquet_options(schema: pa.Schema) -> dict:
    """ParquetWriter settings: zstd-1, page checksums, dictionaries for strings but ``key``, stats on
    flat columns, 32 KiB data pages and the page index (a row selection reads only the pages that hold
    it: pages then also start at row boundaries). ``_lb_hash`` is written uncompressed and PLAIN: its
    digests do not compress, and so a get reads each row's digest bytes at a computed offset
    (``lake/rowpages.py``) instead of a whole page per row."""
    dict_cols = [f.name for f in schema if (pa.types.is_string(f.type) or pa.types.is_large_string(f.type)) and f.name != "key"]
    stats_cols = [f.name for f in schema if not pa.types.is_nested(f.type) and f.name != HASH_COLUMN]
    compression: str | dict[str, str] = "zstd"
    level: int | dict[str, int] = 1
    encoding: dict[str, str] | None = None
    if HASH_COLUMN in schema.names:
        paths = _leaf_paths(schema)
        compression = {p: ("none" if p == HASH_COLUMN else "zstd") for p in paths}
        level = {p: 1 for p in paths if p != HASH_COLUMN}
        encoding = {HASH_COLUMN: "PLAIN"}
    opts = {
        "compression": compression,
        "compression_level": level,
        "use_dictionary": dict_cols or False,
        "write_statistics": stats_cols or False,
        "write_page_checksum": True,
        "store_schema": True,
        "data_page_size": DATA_PAGE_BYTES,
        "write_page_index": True,
    }
    if encoding:
        opts["column_encoding"] = encoding
    return opts


def by_key(table: pa.Table) -> pa.Table:
    """Rows sorted by ``key`` (a row group's pages then hold narrow key ranges, so the page index
    prunes a ``key IN (...)`` read); no copy when they already are (generated keys are sequential)."""
    if "key" not in table.column_names or table.num_rows < 2:
        return table
    k = table.column("key")
    if pc.all(pc.less_equal(k.slice(0, len(k) - 1), k.slice(1))).as_py() is not False:
        return table
    return table.take(pc.sort_indices(k))


def _stat_value(v: Any) -> Any:
    if isinstance(v, datetime.datetime):
        if v.tzinfo is not None:
            v = v.astimezone(datetime.timezone.utc).replace(tzinfo=None)
        return v.isoformat(timespec="microseconds") + "Z"
    if isinstance(v, datetime.date):
        return v.isoformat()
    if isinstance(v, str) and len(v) > MAX_STAT_CHARS:
        return None
    if isinstance(v, (bool, int, str)):
        return v
    return None  # floats (NaN is not ordered), bytes, decimals: no min/max, readers just do not prune


def delta_stats(md: pq.FileMetaData, schema: pa.Schema) -> str:
    """The Delta ``add.stats`` JSON (numRecords, minValues, maxValues, nullCount) of a written file,
    from its Parquet footer, so Delta readers (and lakebuffer's delete rewrite) prune by ``key`` and
    ``policy_version``. Nested columns get no entry (the Delta spec makes every entry optional)."""
    flat = {f.name for f in schema if not pa.types.is_nested(f.type)}
    lo: dict[str, Any] = {}
    hi: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    bad: set[str] = set()
    for i in range(md.num_row_groups):
        rg = md.row_group(i)
        for j in range(rg.num_columns):
            c = rg.column(j)
            name = c.path_in_schema
            if name not in flat:
                continue
            s = c.statistics
            if s is None or not s.has_null_count:
                bad.add(name)
                continue
            nulls[name] = nulls.get(name, 0) + int(s.null_count)
            if name in bad:
                continue
            if not s.has_min_max:
                if s.null_count != rg.num_rows:
                    bad.add(name)
                continue
            a, b = _stat_value(s.min), _stat_value(s.max)
            if a is None or b is None:
                bad.add(name)
                continue
            lo[name] = a if name not in lo else min(lo[name], a)
            hi[name] = b if name not in hi else max(hi[name], b)
    return json.dumps({
        "numRecords": md.num_rows,
        "minValues": {k: v for k, v in lo.items() if k not in bad},
        "maxValues": {k: v for k, v in hi.items() if k not in bad},
        "nullCount": {k: v for k, v in nulls.items() if k not in bad or k in nulls},
    })


class PartFile:
    """One Parquet data file being written: encoded into a temporary local file or into memory, then
    named ``part-<sid>-<n>-<token>-<sha256>.parquet`` and moved / uploaded there by ``commit``."""

    def __init__(self, store: LakeFS, options: LakeOptions, dir_rel: str, stem: tuple[int, int, str], schema: pa.Schema, bucket: int) -> None:
        self.store = store
        self.dir_rel = dir_rel
        self.stem = stem  # (snapshot id, file number, token)
        if HASH_COLUMN in schema.names:  # rows read back from a lake file (compaction): hashed afresh
            schema = schema.remove(schema.get_field_index(HASH_COLUMN))
        self.schema = schema
        self.hashed = hashable(schema)  # else (a type the digest does not cover) no ``_lb_hash``
        self.file_schema = schema_with_hash(schema) if self.hashed else schema
        self.bucket = bucket
        self.rows = 0
        self.size = 0
        self.min_pv: int | None = None
        self.max_pv: int | None = None
        sid, n, token = stem
        if store.native_local:
            d = store.abs(dir_rel)
            os.makedirs(d, exist_ok=True)
        else:
            d = options.spill_path()
        # no leading dot: a crashed writer's temporary file in a local lake is an orphan that vacuum removes
        self.tmp: str | None = f"{d}/part-{sid:08d}-{n:04d}-{token}.parquet.tmp-{uuid.uuid4().hex[:8]}"
        self.sink: Any = pa.OSFile(self.tmp, "wb")
        try:
            self.writer = pq.ParquetWriter(self.sink, self.file_schema, **parquet_options(self.file_schema))
        except BaseException:
            self.abort()
            raise

    def write(self, table: pa.Table) -> None:
        mm = pc.min_max(table.column("policy_version"))
        lo, hi = mm["min"].as_py(), mm["max"].as_py()
        self.min_pv = lo if self.min_pv is None else min(self.min_pv, lo)
        self.max_pv = hi if self.max_pv is None else max(self.max_pv, hi)
        if HASH_COLUMN in table.column_names:
            table = table.drop_columns([HASH_COLUMN])
        table = by_key(table)
        if self.hashed:
            table = table.append_column(self.file_schema.field(HASH_COLUMN), hash_column(table, self.schema.names))
        self.writer.write_table(table, row_group_size=table.num_rows)
        self.rows += table.num_rows
        self.size = self.sink.tell()

    def close_writer(self) -> None:
        """Write the footer (on the encoding thread)."""
        self.writer.close()
        self.metadata = self.writer.writer.metadata
        with contextlib.suppress(Exception):
            self.sink.close()
        self.size = os.path.getsize(self.tmp)

    def commit(self) -> dict:
        """Checksum, name and store the closed file; its entry (runs off the encoding thread)."""
        sid, n, token = self.stem
        h = hashlib.sha256()
        with open(self.tmp, "rb+") as f:
            while chunk := f.read(8 * 2**20):
                h.update(chunk)
            if self.store.native_local:
                os.fsync(f.fileno())
        digest = h.hexdigest()
        rel = f"{self.dir_rel}/{data_name(sid, n, token, digest)}"
        if self.store.native_local:
            os.replace(self.tmp, self.store.abs(rel))
        else:
            self.store.io(f"uploading {rel}", self.store.put_file, self.tmp, rel)
            os.unlink(self.tmp)
        self.tmp = None
        nbytes = self.size
        return {
            "path": rel,
            "policy_bucket": self.bucket,
            "snapshot_id": sid,
            "rows": self.rows,
            "bytes": nbytes,
            "sha256": digest,
            "min_policy_version": self.min_pv,
            "max_policy_version": self.max_pv,
            "stats": delta_stats(self.metadata, self.schema),
        }

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()
        with contextlib.suppress(Exception):
            self.sink.close()
        if self.tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.tmp)
            self.tmp = None


class Lane:
    """One encoder thread with one open file at a time: row groups are encoded in the order they were
    handed in; a full file is closed (footer) here and committed by the writer's closer pool."""

    def __init__(self, writer: Writer, bucket: int) -> None:
        self.writer = writer
        self.bucket = bucket
        self.file: PartFile | None = None
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lakebuffer-encode")
        self.futures: deque = deque()

    def submit(self, table: pa.Table, nbytes: int) -> None:
        try:
            fut = runtime.submit(self.pool, self._write, table, nbytes)
        except BaseException:  # not queued (e.g. interpreter shutdown): its bytes were never taken
            self.writer.release(nbytes)
            raise
        self.futures.append(fut)
        while len(self.futures) > 1:  # at most one row group waiting per lane
            self.futures.popleft().result()

    def _write(self, table: pa.Table, nbytes: int) -> None:
        w = self.writer
        try:
            if self.file is None:
                stem = (w.snapshot_id, next(w.counter), w.token)
                self.file = PartFile(w.store, w.options, f"{w.run_dir}/policy_bucket={self.bucket}", stem, w.schema, self.bucket)
            self.file.write(table)
            del table
        finally:
            w.release(nbytes)
        if self.file.size >= w.target:
            self._close()

    def _close(self) -> None:
        f, self.file = self.file, None
        if f is None:
            return
        try:
            f.close_writer()
        except BaseException:
            f.abort()
            raise
        self.writer.committing(f)

    def finish(self) -> None:
        self.futures.append(runtime.submit(self.pool, self._close))
        try:
            while self.futures:
                self.futures.popleft().result()
        finally:
            self.pool.shutdown(wait=True)

    def abort(self) -> None:
        for fut in self.futures:
            with contextlib.suppress(BaseException):
                fut.result()
        self.futures.clear()
        self.pool.shutdown(wait=True)
        if self.file is not None:
            self.file.abort()
            self.file = None


class Writer:
    """Streams batches of one run into per-bucket Parquet files: rows are buffered per bucket until a
    row group is full (``row_group_bytes`` / ``row_group_rows``), the memory held in pending row groups
    is bounded across buckets, and full row groups go round-robin to ``encode_threads`` lanes per bucket
    (an encoder thread and an open file each: Parquet encoding is the CPU cost of a snapshot and
    releases the GIL). Files rotate at ``target_file_bytes``; a closed file finishes uploading in the
    background while encoding goes on. ``finish`` returns the entries (path, rows, bytes, sha256,
    Delta stats) of the written files;
    ``abort`` discards them.

    Memory: rows pending in all buckets stay under half of ``LakeOptions.memory_bytes`` (the fullest
    bucket is flushed first), row groups queued or encoding in all lanes under the other half
    (``_flush`` waits for encoders to take them), so a snapshot of any backlog over any number of
    partitions holds about ``memory_bytes`` of rows plus one encoded row group per lane."""

    def __init__(
        self,
        store: LakeFS,
        options: LakeOptions,
        policy_bucket_size: int,
        run_id: str,
        snapshot_id: int,
        schema: pa.Schema,
        target_file_bytes: int,
        tag: str = "",
        lanes: dict[int, int] | None = None,
        max_lanes: int | None = None,
    ) -> None:
        self.store = store
        self.options = options
        self.policy_bucket_size = policy_bucket_size
        self.lane_limit = lanes or {}
        self.max_lanes = max_lanes or options.encode_threads
        self.run_dir = run_dir(run_id)
        self.snapshot_id = snapshot_id
        self.schema = schema
        self.target = target_file_bytes
        self.token = file_token(tag)
        self.pending: dict[int, list[pa.RecordBatch]] = {}
        self.pending_bytes: dict[int, int] = {}
        self.pending_rows: dict[int, int] = {}
        self.lanes: dict[int, list[Lane]] = {}
        self.turn: dict[int, int] = {}
        self.counter = itertools.count()
        self.entries: list[dict] = []
        self.closing: deque = deque()
        self.closing_lock = threading.Lock()
        self.closer = ThreadPoolExecutor(max_workers=2, thread_name_prefix="lakebuffer-commit")
        self.rows = 0
        self.group_bytes = options.group_bytes
        self.max_pending = max(self.group_bytes, options.memory_bytes // 2)
        self.max_inflight = max(self.group_bytes, options.memory_bytes - self.max_pending)
        self.inflight = 0
        self.gate = threading.Condition()
        self.max_open_buckets = MAX_OPEN_BUCKETS

    def reserve(self, nbytes: int) -> None:
        """Wait until ``nbytes`` more rows fit among those queued or encoding (one always fits)."""
        with self.gate:
            while self.inflight and self.inflight + nbytes > self.max_inflight:
                self.gate.wait(1.0)
            self.inflight += nbytes

    def release(self, nbytes: int) -> None:
        with self.gate:
            self.inflight -= nbytes
            self.gate.notify_all()

    def add(self, batch: pa.RecordBatch | pa.Table) -> None:
        if batch.num_rows == 0:
            return
        pv = batch.column("policy_version")
        if pv.null_count:
            raise SchemaError("column 'policy_version' has null values; the lake partitions by it")
        buckets = floor_buckets(pv if isinstance(pv, pa.Array) else pv.combine_chunks(), self.policy_bucket_size)
        lo, hi = int(buckets.min()), int(buckets.max())
        if lo == hi:
            self._add(lo, batch)
            return
        order = np.argsort(buckets, kind="stable")
        sorted_b = buckets[order]
        taken = batch.take(pa.array(order))
        starts = np.flatnonzero(np.diff(sorted_b)) + 1
        bounds = [0, *starts.tolist(), len(sorted_b)]
        for a, b in zip(bounds[:-1], bounds[1:]):
            self._add(int(sorted_b[a]), taken.slice(a, b - a))

    def _add(self, bucket: int, batch: pa.RecordBatch | pa.Table) -> None:
        chunks = batch.to_batches() if isinstance(batch, pa.Table) else [batch]
        self.pending.setdefault(bucket, []).extend(chunks)
        self.pending_bytes[bucket] = self.pending_bytes.get(bucket, 0) + batch.nbytes
        self.pending_rows[bucket] = self.pending_rows.get(bucket, 0) + batch.num_rows
        if self.pending_bytes[bucket] >= self.group_bytes or self.pending_rows[bucket] >= self.options.row_group_rows:
            self._flush(bucket)
        while sum(self.pending_bytes.values()) > self.max_pending:
            self._flush(max(self.pending_bytes, key=self.pending_bytes.__getitem__))

    def _flush(self, bucket: int) -> None:
        batches = self.pending.pop(bucket, None)
        self.pending_bytes.pop(bucket, None)
        self.pending_rows.pop(bucket, None)
        if not batches:
            return
        table = pa.Table.from_batches(batches, schema=self.schema)
        lanes = self.lanes.setdefault(bucket, [])
        turn = self.turn.get(bucket, 0)
        self.turn[bucket] = turn + 1
        limit = max(1, self.lane_limit.get(bucket, self.max_lanes))
        if not lanes:
            while len(self.lanes) > self.max_open_buckets:  # a backlog of many buckets: close the oldest
                self.seal(next(b for b in self.lanes if b != bucket))
        else:
            self.lanes[bucket] = self.lanes.pop(bucket)  # most recently used last
        if len(lanes) < limit and turn >= len(lanes):
            lanes.append(Lane(self, bucket))
        nbytes = table.nbytes
        self.rows += table.num_rows
        self.reserve(nbytes)
        lanes[turn % len(lanes)].submit(table, nbytes)

    def seal(self, bucket: int) -> None:
        """Write the pending rows of ``bucket`` and close its open files (rows of it added later go to
        new files). Bounds the open files (one thread and one Parquet writer each) of a writer that
        sees many buckets, and lets a delete rewrite each file into one file of its own."""
        self._flush(bucket)
        for lane in self.lanes.get(bucket, []):
            lane.finish()
        self.lanes.pop(bucket, None)
        self.turn.pop(bucket, None)

    def committing(self, f: PartFile) -> None:
        """A closed file: finish its upload in the background, at most two at a time."""
        with self.closing_lock:
            self.closing.append((f, runtime.submit(self.closer, f.commit)))
            while len(self.closing) > 2:
                f0, fut = self.closing.popleft()
                self.entries.append(fut.result())

    def finish(self) -> list[dict]:
        for bucket in list(self.pending):
            self._flush(bucket)
        for lanes in self.lanes.values():
            for lane in lanes:
                lane.finish()
        with self.closing_lock:
            while self.closing:
                self.entries.append(self.closing.popleft()[1].result())
        self.closer.shutdown(wait=True)
        self.entries.sort(key=lambda e: e["path"])
        return self.entries

    def abort(self) -> None:
        """Discard open files and try once to remove the completed ones (``gc`` gets any left)."""
        for lanes in self.lanes.values():
            for lane in lanes:
                lane.abort()
        self.pending.clear()
        with self.closing_lock:
            for f, fut in self.closing:
                try:
                    self.entries.append(fut.result())
                except BaseException:
                    f.abort()
            self.closing.clear()
        self.closer.shutdown(wait=True)
        self.store.remove_quietly([e["path"] for e in self.entries])
