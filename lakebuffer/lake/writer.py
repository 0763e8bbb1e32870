"""Streaming Parquet writer of a snapshot: ``Writer`` (partition by policy bucket, bounded pending
memory) -> ``Lane`` (one encoder thread, one open file) -> ``PartFile`` (one data file) ->
``UploadSink`` (checksums + background upload of the encoded bytes).

Hand-written (moved as it was from ``lake.py``): pyarrow's ``ds.write_dataset`` cannot checksum the
bytes as they are written (every file gets sha256 + per-block crc32 here, for verified reads) nor
report per-file manifest entries; here encoding also runs on several lanes (it releases the GIL) and
uploads overlap encoding. The Delta Lake issue replaces this module (delta-rs writes the files there).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import queue
import threading
import zlib
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import SchemaError
from .fs import LakeFS
from .layout import file_token, run_dir
from .options import LakeOptions
from .rows import floor_buckets


def parquet_options(schema: pa.Schema) -> dict:
    """ParquetWriter settings: zstd-1, dictionaries for strings but ``key``, stats on flat columns."""
    dict_cols = [f.name for f in schema if (pa.types.is_string(f.type) or pa.types.is_large_string(f.type)) and f.name != "key"]
    stats_cols = [f.name for f in schema if not pa.types.is_nested(f.type)]
    return {
        "compression": "zstd",
        "compression_level": 1,
        "use_dictionary": dict_cols or False,
        "write_statistics": stats_cols or False,
        "store_schema": True,
    }


class UploadSink:
    """The file object ParquetWriter writes to: counts the bytes, hashes them (sha256 of the file and
    crc32 per ``block_bytes`` block, so readers can verify ranges), coalesces them into large chunks
    and hands those to a background thread that writes them to the real file (fsspec, local or
    ``S3PartWriter``), so Parquet encoding overlaps the upload. ``finish`` commits, ``abort`` discards."""

    def __init__(self, fobj: Any, *, chunk_bytes: int, block_bytes: int, fsync: bool = False) -> None:
        self._f = fobj
        self._chunk = chunk_bytes
        self._fsync = fsync
        self._hash = hashlib.sha256()
        self.block_bytes = int(block_bytes)
        self.block_crc32: list[int] = []
        self._crc = 0
        self._crc_len = 0
        self._buf = bytearray()
        self._q: queue.Queue = queue.Queue(maxsize=2)
        self._err: BaseException | None = None
        self._done = False
        self.size = 0
        self.closed = False
        self._thread = threading.Thread(target=self._run, name="lakebuffer-upload", daemon=True)
        self._thread.start()

    def _checksum(self, chunk: bytearray) -> None:
        self._hash.update(chunk)
        view, i, n = memoryview(chunk), 0, len(chunk)
        while i < n:
            take = min(self.block_bytes - self._crc_len, n - i)
            self._crc = zlib.crc32(view[i : i + take], self._crc)
            self._crc_len += take
            i += take
            if self._crc_len == self.block_bytes:
                self.block_crc32.append(self._crc)
                self._crc, self._crc_len = 0, 0

    def _run(self) -> None:
        while True:
            chunk = self._q.get()
            if chunk is None:
                return
            if self._err is None:
                try:
                    self._checksum(chunk)
                    self._f.write(chunk)
                except BaseException as e:  # handed to the writing thread
                    self._err = e

    # the part of the file protocol pyarrow uses
    def write(self, data: Any) -> int:
        if self._err is not None:
            raise self._err
        view = memoryview(data)
        self._buf += view
        self.size += view.nbytes
        if len(self._buf) >= self._chunk:
            chunk, self._buf = self._buf, bytearray()
            self._q.put(chunk)
        return view.nbytes

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        pass

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def close(self) -> None:  # called by the Parquet writer; finish() does the real work
        self.closed = True

    def _drain(self) -> None:
        if not self._done:
            self._done = True
            self._q.put(None)
            self._thread.join()

    def finish(self) -> tuple[int, str]:
        """Write the rest, commit the file; return (bytes, sha256 hex)."""
        if self._buf and self._err is None:
            chunk, self._buf = self._buf, bytearray()
            self._q.put(chunk)
        self._drain()
        if self._err is not None:
            raise self._err
        if self._fsync:
            self._f.flush()
            os.fsync(self._f.fileno())
        self._f.close()
        if self._crc_len:
            self.block_crc32.append(self._crc)
            self._crc, self._crc_len = 0, 0
        return self.size, self._hash.hexdigest()

    def abort(self) -> None:
        self._buf = bytearray()
        self._drain()
        discard = getattr(self._f, "discard", None)
        with contextlib.suppress(Exception):
            if discard is not None:
                discard()
                self._f.closed = True  # fsspec would try to upload the rest when collected
            else:
                self._f.close()


def open_sink(store: LakeFS, options: LakeOptions, rel: str) -> UploadSink:
    """An ``UploadSink`` writing the new data file ``rel`` (fsynced on a native local lake)."""
    fobj = store.open_write(rel, part_bytes=options.upload_part_bytes, max_inflight=options.upload_concurrency)
    return UploadSink(fobj, chunk_bytes=options.upload_chunk_bytes, block_bytes=options.block_bytes, fsync=store.native_local)


class PartFile:
    """One open Parquet data file being written."""

    def __init__(self, store: LakeFS, options: LakeOptions, rel: str, schema: pa.Schema, bucket: int, snapshot_id: int) -> None:
        self.rel = rel
        self.bucket = bucket
        self.snapshot_id = snapshot_id
        self.rows = 0
        self.min_pv: int | None = None
        self.max_pv: int | None = None
        self.sink = open_sink(store, options, rel)
        try:
            self.writer = pq.ParquetWriter(self.sink, schema, **parquet_options(schema))
        except BaseException:
            self.sink.abort()
            raise

    def write(self, table: pa.Table) -> None:
        mm = pc.min_max(table.column("policy_version"))
        lo, hi = mm["min"].as_py(), mm["max"].as_py()
        self.min_pv = lo if self.min_pv is None else min(self.min_pv, lo)
        self.max_pv = hi if self.max_pv is None else max(self.max_pv, hi)
        self.writer.write_table(table, row_group_size=table.num_rows)
        self.rows += table.num_rows

    def close(self) -> dict:
        self.writer.close()
        return self.commit()

    def commit(self) -> dict:
        """Wait for the upload of a closed file and commit it (runs off the encoding thread)."""
        size, digest = self.sink.finish()
        return {
            "path": self.rel,
            "policy_bucket": self.bucket,
            "snapshot_id": self.snapshot_id,
            "rows": self.rows,
            "bytes": size,
            "sha256": digest,
            "blocks": {"bytes": self.sink.block_bytes, "crc32": self.sink.block_crc32},
            "min_policy_version": self.min_pv,
            "max_policy_version": self.max_pv,
        }

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()
        self.sink.abort()


class Lane:
    """One encoder thread with one open file at a time: row groups are encoded in the order they were
    handed in; a full file is closed (footer) here and committed by the writer's closer pool."""

    def __init__(self, writer: Writer, bucket: int) -> None:
        self.writer = writer
        self.bucket = bucket
        self.file: PartFile | None = None
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lakebuffer-encode")
        self.futures: deque = deque()

    def submit(self, table: pa.Table) -> None:
        self.futures.append(self.pool.submit(self._write, table))
        while len(self.futures) > 1:  # at most one row group waiting per lane: bounded memory
            self.futures.popleft().result()

    def _write(self, table: pa.Table) -> None:
        w = self.writer
        if self.file is None:
            rel = f"{w.run_dir}/policy_bucket={self.bucket}/part-{w.snapshot_id:08d}-{next(w.counter):04d}-{w.token}.parquet"
            self.file = PartFile(w.store, w.options, rel, w.schema, self.bucket, w.snapshot_id)
        self.file.write(table)
        if self.file.sink.size >= w.target:
            self._close()

    def _close(self) -> None:
        f, self.file = self.file, None
        if f is None:
            return
        try:
            f.writer.close()
        except BaseException:
            f.sink.abort()
            raise
        self.writer.committing(f)

    def finish(self) -> None:
        self.futures.append(self.pool.submit(self._close))
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
    background while encoding goes on. ``finish`` returns the manifest entries of the written files;
    ``abort`` discards them."""

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
        self.max_pending = 4 * options.row_group_bytes

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
        if self.pending_bytes[bucket] >= self.options.row_group_bytes or self.pending_rows[bucket] >= self.options.row_group_rows:
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
        if len(lanes) < limit and turn >= len(lanes):
            lanes.append(Lane(self, bucket))
        lanes[turn % len(lanes)].submit(table)
        self.rows += table.num_rows

    def committing(self, f: PartFile) -> None:
        """A closed file: finish its upload in the background, at most two at a time."""
        with self.closing_lock:
            self.closing.append((f, self.closer.submit(f.commit)))
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
                    f.sink.abort()
            self.closing.clear()
        self.closer.shutdown(wait=True)
        self.store.remove_quietly([e["path"] for e in self.entries])
