"""The cold tier: hive-partitioned Parquet on any fsspec URL, committed snapshot by snapshot.

Layout under the lake URL (``s3://bucket/prefix``, ``file:///abs/path`` or a plain path)::

    _lakebuffer.json                                   lake settings (policy_bucket_size), written once
    run_id=<r>/policy_bucket=<b>/part-<sid>-<n>-<tok>.parquet    data files (zstd; no run_id column)
    _deletes/run_id=<r>/del-<sid>-<tok>.arrow           tombstones: one ``key`` column (Arrow IPC)
    _manifests/run_id=<r>/<sid, 20 digits>.json         one manifest per committed snapshot

``<r>`` is the run id percent-encoded (``urllib.parse.quote(run_id, safe="")``), ``<b>`` is
``policy_version // policy_bucket_size`` (floor division), ``<sid>`` the snapshot id the file was
written for (8 digits), ``<n>`` its number in that write and ``<tok>`` ``<unix seconds>-<random>``
of the writer, so two writers never overwrite each other's files and ``gc`` can date them. Data
files only hold rows; *which* files are live is decided by the manifests alone. A manifest holds
``snapshot_id``, ``parent_id``, ``created_at``, ``operation`` (append / compact), the run's Arrow
schema, every live data file (path, policy_bucket, rows, bytes, sha256 of the whole file, crc32 per
8 MiB block for verified ranged reads, policy_version range), the live delete files, what this commit
added and removed, a summary and the caller's ``meta``.

* **Commit protocol.** ``commit_snapshot`` streams data files, then a delete file, then writes the
  manifest ``<sid>.json`` with an exclusive create (S3 ``If-None-Match: *``; ``os.link`` of a fsynced
  temporary file locally). The manifest lists every live file of the run, so a snapshot is visible
  completely or not at all: files of a failed or crashed upload are in no
  manifest, readers never see them, and ``gc`` removes them later. Two writers racing for the same
  ``sid`` cannot both win; the loser rebases on the new latest manifest and retries.
* **Tombstones.** The live rows of a run are the rows of its live files whose ``key`` is not in the
  run's tombstone set (the union of its live delete files). ``commit_snapshot(deleted_keys=...)`` hides
  keys from all *earlier* files: when a snapshot brings rows whose key is tombstoned (a key deleted and
  pushed again), the older files holding that key are rewritten without it in the same commit and the
  key leaves the tombstone set, so the one simple rule above stays exact.
* **Compaction** writes new files, commits a manifest that lists them instead of the replaced files and
  delete files, and never deletes anything itself: the replaced files stay readable by readers pinned to
  the older manifest until ``gc(older_than_s)`` removes files that no manifest younger than the grace
  period references.
* **External readers** (pyarrow.dataset, polars.scan_parquet, DuckDB read_parquet with hive
  partitioning) can open the lake directory without lakebuffer. A directory scan sees every Parquet
  file, including files of failed uploads and files replaced by compaction that ``gc`` has not removed
  yet, and it does not apply tombstones; pass ``Lake.files()`` (the committed file list) for an exact
  snapshot, and read after ``compact()`` + ``gc()`` for a lake without tombstones.

Empty snapshots (no rows and no deleted keys) are skipped: ``commit_snapshot`` returns ``None`` unless
``force=True``. A missing S3 bucket is reported when the lake is opened (``LakeError``); a missing local
directory is created at the first write.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import itertools
import json
import os
import queue
import re
import threading
import time
import uuid
import zlib
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote, unquote

import fsspec
import fsspec.asyn
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from .errors import CorruptionError, LakeBufferError, LakeError, ReadOnlyError, SchemaError
from .resources import render_sql
from .schema import PARTITIONING, ROLLOUT_SCHEMA

__all__ = ["Lake", "MANIFEST_FORMAT"]

MANIFEST_FORMAT = "lakebuffer.manifest/1"
LAKE_FORMAT = "lakebuffer.lake/1"
MANIFEST_DIR = "_manifests"
DELETE_DIR = "_deletes"
LAKE_META = "_lakebuffer.json"
PARTITION_FIELDS = [pa.field("run_id", pa.string(), nullable=False), pa.field("policy_bucket", pa.int64(), nullable=False)]

_MANIFEST_NAME = re.compile(r"^(\d{20})\.json$")
_DATA_FILE = re.compile(r"^run_id=[^/]+/policy_bucket=-?\d+/part-[^/]+\.parquet$")
_DELETE_FILE = re.compile(r"^" + DELETE_DIR + r"/run_id=[^/]+/del-[^/]+\.arrow$")
_OBJECT_STORES = {"s3", "s3a", "gs", "gcs", "abfs", "az", "abfss"}
_MiB = 2**20


def _now() -> tuple[str, float]:
    t = time.time()
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z"), t


def _enc(run_id: str) -> str:
    return quote(run_id, safe="")


def _file_token(tag: str = "") -> str:
    """``<unix seconds>-<random>``: unique per writer, and it dates the file for ``gc`` even where the
    store's own timestamps are not trustworthy (moto reports every multipart upload as from 2010)."""
    return f"{int(time.time())}-{uuid.uuid4().hex[:8]}{tag}"


_TOKEN_TIME = re.compile(r"-(\d{9,11})-[0-9a-f]{8}[a-z]*\.(?:parquet|arrow)$")


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _check_run_id(run_id: str) -> str:
    if not isinstance(run_id, str) or not run_id or run_id in (".", ".."):
        raise ValueError(f"run_id must be a non-empty string, not {run_id!r}")
    return run_id


def _schema_to_b64(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def _schema_from_b64(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def _without(schema: pa.Schema, names: Iterable[str]) -> pa.Schema:
    drop = set(names)
    return pa.schema([f for f in schema if f.name not in drop], metadata=schema.metadata)


def _with_run_id(schema: pa.Schema) -> pa.Schema:
    """The row schema of a run: the file schema with ``run_id`` where the rollout schema has it."""
    if "run_id" in schema.names:
        return schema
    pos = schema.get_field_index("key") + 1 if "key" in schema.names else 0
    return schema.insert(pos, PARTITION_FIELDS[0])


def _conform(table: pa.Table | pa.RecordBatch, schema: pa.Schema) -> pa.Table:
    """``table`` with exactly the columns of ``schema``: reordered, cast, missing ones as nulls."""
    n = table.num_rows
    cols = []
    for f in schema:
        idx = table.schema.get_field_index(f.name)
        if idx < 0:
            cols.append(pa.nulls(n, f.type))
            continue
        col = table.column(idx)
        if not col.type.equals(f.type):
            col = col.cast(f.type)
        cols.append(col)
    return pa.Table.from_arrays(cols, schema=schema)


def _floor_buckets(pv: pa.Array | pa.ChunkedArray, size: int) -> np.ndarray:
    arr = pv.to_numpy() if isinstance(pv, pa.Array) else pv.to_numpy()
    return np.floor_divide(arr, size) if size != 1 else arr


def _mtime(info: dict) -> float | None:
    for k in ("mtime", "LastModified", "last_modified", "updated", "modified", "created"):
        v = info.get(k)
        if v is None:
            continue
        if isinstance(v, (int, float)):
            return float(v)
        if isinstance(v, datetime):
            return v.timestamp()
        if isinstance(v, str):
            with contextlib.suppress(ValueError):
                return datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()
    return None


def _without_columns(batch: pa.RecordBatch | pa.Table, names: Iterable[str]) -> pa.RecordBatch | pa.Table:
    drop = [n for n in names if n in batch.schema.names]
    return batch.drop_columns(drop) if drop else batch


def _unique_strings(parts: Sequence[pa.Array | pa.ChunkedArray]) -> pa.Array:
    parts = [p.combine_chunks() if isinstance(p, pa.ChunkedArray) else p for p in parts if len(p)]
    if not parts:
        return pa.array([], pa.string())
    arr = pa.concat_arrays([p.cast(pa.string()) for p in parts]) if len(parts) > 1 else parts[0].cast(pa.string())
    return pc.unique(arr.drop_null())


def _as_key_array(keys: Sequence[str] | pa.Array | pa.ChunkedArray | None) -> pa.Array:
    if keys is None:
        return pa.array([], pa.string())
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if not isinstance(keys, pa.Array):
        keys = pa.array(list(keys), pa.string())
    return _unique_strings([keys])


def _iter_input(batches: Any) -> Iterator[pa.RecordBatch]:
    if isinstance(batches, (pa.Table, pa.RecordBatch, pa.RecordBatchReader)):
        batches = [batches]
    for item in batches:
        if isinstance(item, pa.RecordBatch):
            yield item
        elif isinstance(item, pa.Table):
            yield from item.to_batches()
        elif isinstance(item, pa.RecordBatchReader):
            yield from item
        elif hasattr(item, "to_arrow"):  # polars
            yield from item.to_arrow().to_batches()
        else:
            raise TypeError(f"commit_snapshot takes pa.Table / pa.RecordBatch items, not {type(item).__name__}")


# --------------------------------------------------------------------------------------------
# writing
# --------------------------------------------------------------------------------------------


class _S3PartWriter:
    """A write-only S3 object for s3fs with several multipart parts in flight: ``write`` queues a
    part upload on s3fs's event loop and returns, so the caller keeps encoding while S3 receives
    (s3fs's own file object uploads one part at a time and blocks the writer meanwhile)."""

    def __init__(self, fs: Any, path: str, *, part_bytes: int, max_inflight: int = 4) -> None:
        self.fs = fs
        self.bucket, self.key, _ = fs.split_path(path)
        self.part_bytes = max(int(part_bytes), 5 * _MiB)
        self.max_inflight = max(1, int(max_inflight))
        self.chunks: list[Any] = []
        self.buffered = 0
        self.upload_id: str | None = None
        self.inflight: deque = deque()
        self.parts: list[dict] = []
        self.closed = False

    def _call(self, method: str, **kwargs) -> Any:
        return fsspec.asyn.sync(self.fs.loop, self.fs._call_s3, method, **kwargs)

    def _submit(self, body: bytes) -> None:
        if self.upload_id is None:
            self.upload_id = self._call("create_multipart_upload", Bucket=self.bucket, Key=self.key)["UploadId"]
        number = len(self.parts) + len(self.inflight) + 1
        coro = self.fs._call_s3("upload_part", Bucket=self.bucket, Key=self.key, UploadId=self.upload_id, PartNumber=number, Body=body)
        self.inflight.append((number, asyncio.run_coroutine_threadsafe(coro, self.fs.loop)))
        while len(self.inflight) >= self.max_inflight:
            self._wait_one()

    def _wait_one(self) -> None:
        number, fut = self.inflight.popleft()
        self.parts.append({"PartNumber": number, "ETag": fut.result()["ETag"]})

    def _take(self) -> bytes:
        body = b"".join(self.chunks)
        self.chunks, self.buffered = [], 0
        return body

    def write(self, data: Any) -> int:
        self.chunks.append(data)
        self.buffered += len(data)
        if self.buffered >= self.part_bytes:
            self._submit(self._take())
        return len(data)

    def close(self) -> None:
        if self.closed:
            return
        if self.upload_id is None:
            self._call("put_object", Bucket=self.bucket, Key=self.key, Body=self._take())
        else:
            if self.buffered:
                self._submit(self._take())
            while self.inflight:
                self._wait_one()
            parts = sorted(self.parts, key=lambda p: p["PartNumber"])
            self._call(
                "complete_multipart_upload", Bucket=self.bucket, Key=self.key, UploadId=self.upload_id, MultipartUpload={"Parts": parts}
            )
        self.closed = True
        with contextlib.suppress(Exception):
            self.fs.invalidate_cache(f"{self.bucket}/{self.key}")

    def discard(self) -> None:
        self.closed = True
        self.chunks = []
        for _, fut in self.inflight:
            with contextlib.suppress(Exception):
                fut.result()
        self.inflight.clear()
        if self.upload_id is not None:
            with contextlib.suppress(Exception):
                self._call("abort_multipart_upload", Bucket=self.bucket, Key=self.key, UploadId=self.upload_id)


class _UploadSink:
    """The file object ParquetWriter writes to: counts the bytes, hashes them (sha256 of the file and
    crc32 per ``block_bytes`` block, so readers can verify ranges), coalesces them into large chunks
    and hands those to a background thread that writes them to the real file (fsspec, local or
    ``_S3PartWriter``), so Parquet encoding overlaps the upload. ``finish`` commits, ``abort`` discards."""

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


class _PartFile:
    """One open Parquet data file being written."""

    def __init__(self, lake: Lake, rel: str, schema: pa.Schema, bucket: int, snapshot_id: int) -> None:
        self.rel = rel
        self.bucket = bucket
        self.snapshot_id = snapshot_id
        self.rows = 0
        self.min_pv: int | None = None
        self.max_pv: int | None = None
        self.sink = lake._open_sink(rel)
        try:
            self.writer = pq.ParquetWriter(self.sink, schema, **lake._parquet_options(schema))
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


class _Lane:
    """One encoder thread with one open file at a time: row groups are encoded in the order they were
    handed in; a full file is closed (footer) here and committed by the writer's closer pool."""

    def __init__(self, writer: _Writer, bucket: int) -> None:
        self.writer = writer
        self.bucket = bucket
        self.file: _PartFile | None = None
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
            self.file = _PartFile(w.lake, rel, w.schema, self.bucket, w.snapshot_id)
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


class _Writer:
    """Streams batches of one run into per-bucket Parquet files: rows are buffered per bucket until a
    row group is full (``row_group_bytes`` / ``row_group_rows``), the memory held in pending row groups
    is bounded across buckets, and full row groups go round-robin to ``encode_threads`` lanes per bucket
    (an encoder thread and an open file each: Parquet encoding is the CPU cost of a snapshot and
    releases the GIL). Files rotate at ``target_file_bytes``; a closed file finishes uploading in the
    background while encoding goes on."""

    def __init__(
        self,
        lake: Lake,
        run_id: str,
        snapshot_id: int,
        schema: pa.Schema,
        target_file_bytes: int,
        tag: str = "",
        lanes: dict[int, int] | None = None,
        max_lanes: int | None = None,
    ) -> None:
        self.lake = lake
        self.lane_limit = lanes or {}
        self.max_lanes = max_lanes or lake.encode_threads
        self.run_dir = f"run_id={_enc(run_id)}"
        self.snapshot_id = snapshot_id
        self.schema = schema
        self.target = target_file_bytes
        self.token = _file_token(tag)
        self.pending: dict[int, list[pa.RecordBatch]] = {}
        self.pending_bytes: dict[int, int] = {}
        self.pending_rows: dict[int, int] = {}
        self.lanes: dict[int, list[_Lane]] = {}
        self.turn: dict[int, int] = {}
        self.counter = itertools.count()
        self.entries: list[dict] = []
        self.closing: deque = deque()
        self.closing_lock = threading.Lock()
        self.closer = ThreadPoolExecutor(max_workers=2, thread_name_prefix="lakebuffer-commit")
        self.rows = 0
        self.max_pending = 4 * lake.row_group_bytes

    def add(self, batch: pa.RecordBatch | pa.Table) -> None:
        if batch.num_rows == 0:
            return
        size = self.lake.policy_bucket_size
        pv = batch.column("policy_version")
        if pv.null_count:
            raise SchemaError("column 'policy_version' has null values; the lake partitions by it")
        buckets = _floor_buckets(pv if isinstance(pv, pa.Array) else pv.combine_chunks(), size)
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
        if self.pending_bytes[bucket] >= self.lake.row_group_bytes or self.pending_rows[bucket] >= self.lake.row_group_rows:
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
            lanes.append(_Lane(self, bucket))
        lanes[turn % len(lanes)].submit(table)
        self.rows += table.num_rows

    def committing(self, f: _PartFile) -> None:
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
        self.lake._remove_quietly([e["path"] for e in self.entries])


# --------------------------------------------------------------------------------------------
# prune_hint: hidden partitioning for SQL text
# --------------------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""(?P<str>'(?:[^']|'')*')|(?P<qid>"(?:[^"]|"")*")|(?P<lp>\()|(?P<rp>\))|(?P<word>[A-Za-z_][A-Za-z0-9_$]*)|(?P<ws>\s+)|(?P<other>.)""",
    re.S,
)
_COL = r'(?P<q>(?:(?:[A-Za-z_]\w*|"(?:[^"]|"")+")\.)?)(?:policy_version|"policy_version")'
_INT = r"[+-]?\d+"
_CMP = re.compile(rf"^{_COL}\s*(?P<op>>=|<=|==|=|>|<)\s*(?P<v>{_INT})$", re.I | re.S)
_CMP_REV = re.compile(rf"^(?P<v>{_INT})\s*(?P<op>>=|<=|==|=|>|<)\s*{_COL}$", re.I | re.S)
_BETWEEN = re.compile(rf"^{_COL}\s+BETWEEN\s+(?P<a>{_INT})\s+AND\s+(?P<b>{_INT})$", re.I | re.S)
_IN = re.compile(rf"^{_COL}\s+IN\s*\((?P<vals>\s*{_INT}(?:\s*,\s*{_INT})*\s*)\)$", re.I | re.S)
_FLIP = {">": "<", "<": ">", ">=": "<=", "<=": ">=", "=": "=", "==": "="}


def _split_and(text: str) -> list[str] | None:
    """Top-level AND conjuncts of a SQL predicate, or None when it has a top-level OR."""
    parts, depth, start, between = [], 0, 0, False
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup
        if kind == "lp":
            depth += 1
        elif kind == "rp":
            depth -= 1
        elif kind == "word" and depth == 0:
            w = m.group().upper()
            if w == "OR":
                return None
            if w == "BETWEEN":
                between = True
            elif w == "AND":
                if between:
                    between = False
                else:
                    parts.append(text[start : m.start()])
                    start = m.end()
    parts.append(text[start:])
    return [p.strip() for p in parts]


def _strip_parens(text: str) -> str | None:
    """The inside of ``( ... )`` when the parentheses enclose the whole text, else None."""
    if not (text.startswith("(") and text.endswith(")")):
        return None
    depth = 0
    for m in _TOKEN.finditer(text):
        if m.lastgroup == "lp":
            depth += 1
        elif m.lastgroup == "rp":
            depth -= 1
            if depth == 0 and m.end() != len(text):
                return None
    return text[1:-1].strip()


def _conjuncts(text: str) -> list[str]:
    parts = _split_and(text)
    if parts is None:
        return []
    out = []
    for p in parts:
        inner = _strip_parens(p)
        out.extend(_conjuncts(inner) if inner is not None else [p])
    return out


class _BlockReader:
    """Fetch the data files of a scan on a few threads, in file order, up to ``read_ahead_bytes``
    ahead of the consumer, verify them and hand out each row group as soon as its bytes are there.

    By default each file is one GET (checked by sha256): moto, like some other S3 servers, reads the
    whole object for every ranged GET, so ranges cost O(object size) each there. With
    ``ranged_reads=True`` files are fetched in their 8 MiB checksum blocks (footer block first, each
    block checked by crc32), so decoding the first row groups of a big file overlaps fetching the
    rest: better on real S3 with few, large (compacted) files."""

    def __init__(self, lake: Lake, entries: list[dict], verify: bool) -> None:
        self.lake = lake
        self.entries = entries
        self.verify = verify
        ranged = lake.ranged_reads
        self.tasks: list[tuple[int, int, int, int | None]] = []  # (file, start, end, crc32 | None)
        self.first: list[int] = []  # index of each file's first task
        self.block: list[int] = []  # block size per file (0: one task for the whole file)
        for fi, e in enumerate(entries):
            size = int(e["bytes"])
            blocks = e.get("blocks") or {}
            bsize, crcs = int(blocks.get("bytes") or 0), list(blocks.get("crc32") or [])
            self.first.append(len(self.tasks))
            if ranged and bsize > 0 and crcs and len(crcs) == -(-size // bsize):
                ranges = [(i * bsize, min(size, (i + 1) * bsize), crc) for i, crc in enumerate(crcs)]
                ranges = ranges[-1:] + ranges[:-1]  # the footer first
                self.block.append(bsize)
            else:
                ranges = [(0, size, None)]
                self.block.append(0)
            self.tasks.extend((fi, a, b, c) for a, b, c in ranges)
        self.futures: dict[int, Any] = {}
        self.buffers: dict[int, np.ndarray] = {}
        self.submitted = 0
        self.ahead = 0

    def _fetch(self, idx: int) -> None:
        fi, start, end, crc = self.tasks[idx]
        entry = self.entries[fi]
        lake = self.lake
        path = lake._abs(entry["path"])
        url = lake._url_of(entry["path"])
        try:
            if start == 0 and end == int(entry["bytes"]) and crc is None:
                data = lake._io(f"reading {entry['path']}", lake.fs.cat_file, path)
            else:
                data = lake._io(f"reading {entry['path']}", lake.fs.cat_file, path, start=start, end=end)
        except FileNotFoundError:
            raise CorruptionError(f"lake file {url} listed in a committed manifest is missing") from None
        if len(data) != end - start:
            raise CorruptionError(f"lake file {url} is shorter than the manifest says ({entry['bytes']} bytes)")
        if self.verify:
            if crc is not None:
                got = zlib.crc32(data)
                if got != crc:
                    raise CorruptionError(f"lake file {url} fails its checksum: bytes {start}-{end} have crc32 {got}, the manifest says {crc}")
            else:
                problem = self._check_whole(entry, data)
                if problem:
                    raise CorruptionError(f"lake file {url} fails its checksum: {problem}")
        if self.block[fi] == 0:
            self.buffers[fi] = data  # the whole file: use the bytes as they are
        else:
            self.buffers[fi][start:end] = np.frombuffer(data, dtype=np.uint8)

    @staticmethod
    def _check_whole(entry: dict, data: bytes) -> str | None:
        """Block crc32s when the manifest has them (about twice as fast as sha256), else sha256."""
        blocks = entry.get("blocks") or {}
        bsize, crcs = int(blocks.get("bytes") or 0), blocks.get("crc32") or []
        if bsize <= 0 or len(crcs) != -(-len(data) // bsize) or len(data) != int(entry["bytes"]):
            return Lake._check_bytes(entry, data)
        view = memoryview(data)
        for i, want in enumerate(crcs):
            got = zlib.crc32(view[i * bsize : (i + 1) * bsize])
            if got != want:
                return f"bytes {i * bsize}-{min(len(data), (i + 1) * bsize)} have crc32 {got}, the manifest says {want}"
        return None

    def _submit_next(self) -> None:
        idx = self.submitted
        fi, start, end, _ = self.tasks[idx]
        if fi not in self.buffers and self.block[fi]:
            self.buffers[fi] = np.empty(int(self.entries[fi]["bytes"]), dtype=np.uint8)
        self.futures[idx] = self.pool.submit(self._fetch, idx)
        self.submitted += 1
        self.ahead += end - start

    def _wait(self, idx: int) -> None:
        while self.submitted <= idx:
            self._submit_next()
        fut = self.futures.pop(idx, None)
        if fut is not None:
            fut.result()
            _, start, end, _ = self.tasks[idx]
            self.ahead -= end - start
        while self.submitted < len(self.tasks) and self.ahead < self.lake.read_ahead_bytes:
            self._submit_next()

    def _wait_range(self, fi: int, start: int, end: int) -> None:
        first, bsize = self.first[fi], self.block[fi]
        if bsize == 0:
            self._wait(first)
            return
        nblocks = -(-int(self.entries[fi]["bytes"]) // bsize)
        for b in range(start // bsize, -(-end // bsize)):
            self._wait(first if b == nblocks - 1 else first + 1 + b)  # task order: last block, then 0..n-2

    def row_groups(self) -> Iterator[tuple[dict, pq.ParquetFile, int]]:
        if not self.tasks:
            return
        # whole files: one GET at a time (s3fs splits large ones itself), so the first file arrives as
        # early as possible and decoding it overlaps fetching the next; blocks: a few in parallel
        workers = max(1, self.lake.read_concurrency) if any(self.block) else 1
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lakebuffer-fetch")
        try:
            for fi, entry in enumerate(self.entries):
                size = int(entry["bytes"])
                url = self.lake._url_of(entry["path"])
                if size < 12:
                    raise CorruptionError(f"lake file {url} is too small to be Parquet ({size} bytes)")
                self._wait_range(fi, size - 8, size)
                buf = self.buffers[fi]
                view = memoryview(buf)
                footer = int.from_bytes(view[size - 8 : size - 4], "little")
                if view[size - 4 : size].tobytes() != b"PAR1" or footer + 12 > size:
                    raise CorruptionError(f"lake file {url} has no valid Parquet footer")
                self._wait_range(fi, size - 8 - footer, size)
                try:
                    pf = pq.ParquetFile(pa.BufferReader(pa.py_buffer(buf)))
                except (pa.ArrowInvalid, OSError) as e:
                    raise CorruptionError(f"lake file {url} is not readable Parquet: {e}") from e
                md = pf.metadata
                for i in range(md.num_row_groups):
                    rg = md.row_group(i)
                    lo, hi = size, 0
                    for j in range(rg.num_columns):
                        c = rg.column(j)
                        off = c.data_page_offset
                        if c.has_dictionary_page and c.dictionary_page_offset and 0 < c.dictionary_page_offset < off:
                            off = c.dictionary_page_offset
                        lo, hi = min(lo, off), max(hi, off + c.total_compressed_size)
                    if rg.num_columns:
                        self._wait_range(fi, lo, min(hi, size))
                    yield entry, pf, i
                del pf, buf, view
                self.buffers.pop(fi, None)
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.buffers.clear()


# --------------------------------------------------------------------------------------------
# the lake
# --------------------------------------------------------------------------------------------


class Lake:
    """Cold tier of the buffer: committed snapshots of hive-partitioned Parquet (see module doc).

    ``policy_bucket_size`` (``None``: the lake's stored value, else 1) is fixed per lake at the first
    commit and stored in ``_lakebuffer.json``; opening with a different explicit value raises
    ``LakeError``. ``filesystem`` replaces the fsspec filesystem built from ``url`` (e.g. a wrapped
    one). ``row_group_bytes`` (uncompressed Arrow bytes) / ``row_group_rows`` bound Parquet row
    groups (whichever comes first); ``target_file_bytes`` rotates snapshot files (``compact`` merges
    them into larger ones later; several files per snapshot let restore overlap fetching and decoding);
    ``encode_threads`` (default: half the CPUs, at most 4; the other half is left to the upload)
    encode row groups of one partition into that many files in parallel.
    Uploads: encoded bytes go to S3 in ``upload_part_bytes`` multipart parts, ``upload_concurrency``
    in flight. Reads: ``read_concurrency`` fetch threads, ``read_ahead_bytes`` ahead, ``ranged_reads``
    (see ``_BlockReader``), ``verify_reads`` checks checksums on every restore/compaction read.
    """

    def __init__(
        self,
        url: str,
        storage_options: dict | None = None,
        *,
        policy_bucket_size: int | None = None,
        read_only: bool = False,
        filesystem: fsspec.AbstractFileSystem | None = None,
        row_group_bytes: int = 32 * _MiB,
        row_group_rows: int = 64 * 1024,
        target_file_bytes: int = 48 * _MiB,
        encode_threads: int | None = None,
        upload_chunk_bytes: int = 8 * _MiB,
        upload_part_bytes: int = 8 * _MiB,
        upload_concurrency: int = 3,
        block_bytes: int = 8 * _MiB,
        read_concurrency: int = 3,
        read_ahead_bytes: int = 128 * _MiB,
        ranged_reads: bool = False,
        verify_reads: bool = True,
    ) -> None:
        self.read_only = read_only
        self.row_group_bytes = int(row_group_bytes)
        self.row_group_rows = int(row_group_rows)
        self.target_file_bytes = int(target_file_bytes)
        self.encode_threads = int(encode_threads) if encode_threads else max(1, min(4, (os.cpu_count() or 2) // 2))
        self.upload_chunk_bytes = int(upload_chunk_bytes)
        self.upload_part_bytes = int(upload_part_bytes)
        self.upload_concurrency = int(upload_concurrency)
        self.block_bytes = int(block_bytes)
        self.read_concurrency = int(read_concurrency)
        self.read_ahead_bytes = int(read_ahead_bytes)
        self.ranged_reads = bool(ranged_reads)
        self.verify_reads = verify_reads
        self.storage_options = dict(storage_options or {})
        self.fs, root = self._make_fs(url, self.storage_options, filesystem)
        self.root = root.rstrip("/") or "/"
        protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        self.protocol = protocol
        self._local = isinstance(self.fs, LocalFileSystem)
        self._object_store = protocol in _OBJECT_STORES
        if self._local:
            self.url = self.root
            self._pafs: pafs.FileSystem = pafs.LocalFileSystem() if filesystem is None else pafs.PyFileSystem(pafs.FSSpecHandler(self.fs))
        else:
            self.url = url.rstrip("/")
            self._pafs = pafs.PyFileSystem(pafs.FSSpecHandler(self.fs))
        self._native_local = self._local and filesystem is None
        self._format = ds.ParquetFileFormat(default_fragment_scan_options=ds.ParquetFragmentScanOptions(pre_buffer=True))
        self._lock = threading.RLock()
        self._manifest_cache: OrderedDict[tuple[str, int], dict] = OrderedDict()
        self._keys_cache: dict[str, pa.Array] = {}
        self._meta_ok = False
        self._probe()
        stored = self._read_lake_meta()
        default = int(PARTITIONING.get("policy_bucket_size", 1))
        if stored is not None:
            size = int(stored.get("policy_bucket_size", default))
            if policy_bucket_size is not None and int(policy_bucket_size) != size:
                raise LakeError(
                    f"lake {self.url} is partitioned with policy_bucket_size={size}, not {policy_bucket_size}; "
                    "open it without policy_bucket_size or with the stored value"
                )
            self._meta_ok = True
        else:
            size = int(policy_bucket_size) if policy_bucket_size is not None else default
        if size < 1:
            raise ValueError(f"policy_bucket_size must be >= 1, not {size}")
        self.policy_bucket_size = size

    # ---- filesystem plumbing ------------------------------------------------------------
    @staticmethod
    def _make_fs(url: str, options: dict, filesystem: fsspec.AbstractFileSystem | None):
        if filesystem is not None:
            return filesystem, filesystem._strip_protocol(url)
        opts = dict(options)
        proto = url.split("://", 1)[0] if "://" in url else "file"
        if proto in ("s3", "s3a"):
            region = opts.pop("region", None) or opts.pop("region_name", None)
            if region:
                ck = dict(opts.get("client_kwargs") or {})
                ck.setdefault("region_name", region)
                opts["client_kwargs"] = ck
            opts.setdefault("use_listings_cache", False)
        try:
            return fsspec.core.url_to_fs(url, **opts)
        except (ImportError, ValueError, TypeError) as e:
            raise LakeError(f"cannot open lake {url!r}: {e}") from e

    def _abs(self, rel: str) -> str:
        return f"{self.root}/{rel}" if self.root != "/" else f"/{rel}"

    def _url_of(self, rel: str) -> str:
        path = self._abs(rel)
        return path if self._local else self.fs.unstrip_protocol(path)

    def _probe(self) -> None:
        """Fail early and clearly when the bucket of an object-store lake does not exist."""
        if not self._object_store:
            return
        bucket = self.root.split("/", 1)[0]
        try:
            if self.protocol in ("s3", "s3a") and hasattr(self.fs, "call_s3"):
                self.fs.call_s3("head_bucket", Bucket=bucket)
            else:
                self.fs.info(bucket)
        except FileNotFoundError:
            raise LakeError(
                f"bucket {bucket!r} of lake {self.url} does not exist; create it first (the lake never creates buckets)"
            ) from None
        except PermissionError as e:
            raise LakeError(f"no access to bucket {bucket!r} of lake {self.url}: {e}") from e
        except Exception as e:
            raise LakeError(f"cannot reach lake {self.url}: {type(e).__name__}: {e}") from e

    def _io(self, what: str, fn: Callable, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (LakeBufferError, FileNotFoundError, FileExistsError):
            raise
        except Exception as e:
            raise LakeError(f"{what} on lake {self.url} failed: {type(e).__name__}: {e}") from e

    def _cat(self, rel: str) -> bytes:
        path = self._abs(rel)
        try:
            return self._io(f"reading {rel}", self.fs.cat_file, path)
        except FileNotFoundError:
            # a filesystem with a listings cache may answer from a stale listing: ask again
            with contextlib.suppress(Exception):
                self.fs.invalidate_cache(path)
            return self._io(f"reading {rel}", self.fs.cat_file, path)

    def _open_sink(self, rel: str) -> _UploadSink:
        path = self._abs(rel)
        if self._native_local:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fobj = open(path, "wb")  # noqa: SIM115 - closed by the sink
            return _UploadSink(fobj, chunk_bytes=self.upload_chunk_bytes, block_bytes=self.block_bytes, fsync=True)
        if self._local:
            self.fs.makedirs(self.fs._parent(path), exist_ok=True)
        if self.protocol in ("s3", "s3a") and hasattr(self.fs, "_call_s3") and getattr(self.fs, "loop", None) is not None:
            fobj = _S3PartWriter(self.fs, path, part_bytes=self.upload_part_bytes, max_inflight=self.upload_concurrency)
        else:
            fobj = self.fs.open(path, "wb")
        return _UploadSink(fobj, chunk_bytes=self.upload_chunk_bytes, block_bytes=self.block_bytes)

    def _put_small(self, rel: str, data: bytes) -> None:
        path = self._abs(rel)
        if self._native_local:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            return
        if self._local:
            self.fs.makedirs(self.fs._parent(path), exist_ok=True)
        self.fs.pipe_file(path, data)

    def _put_exclusive(self, rel: str, data: bytes) -> bool:
        """Create ``rel`` atomically with ``data``; False when it already exists."""
        path = self._abs(rel)
        if self._local:
            d = os.path.dirname(path)
            os.makedirs(d, exist_ok=True)
            tmp = os.path.join(d, f".tmp-{uuid.uuid4().hex}")
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp)
            with contextlib.suppress(OSError):
                fd = os.open(d, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            return True
        if self.protocol in ("s3", "s3a"):
            try:
                self.fs.pipe_file(path, data, mode="create")
            except FileExistsError:
                return False
            return True
        # generic fsspec store without conditional writes: check-then-write (documented race)
        if self.fs.exists(path):
            return False
        self.fs.pipe_file(path, data)
        return True

    def _remove_quietly(self, rels: Iterable[str]) -> None:
        """Best effort, one attempt: used after a failure, when the store may well be down."""
        paths = [self._abs(r) for r in rels]
        if paths:
            with contextlib.suppress(Exception):
                self.fs.rm(paths)

    def _check_writable(self) -> None:
        if self.read_only:
            raise ReadOnlyError(f"lake {self.url} is opened read-only")

    # ---- lake settings ------------------------------------------------------------------
    def _read_lake_meta(self) -> dict | None:
        try:
            return json.loads(self._cat(LAKE_META))
        except FileNotFoundError:
            return None
        except json.JSONDecodeError as e:
            raise CorruptionError(f"lake settings {self._url_of(LAKE_META)} are not valid JSON: {e}") from e

    def _ensure_lake_meta(self) -> None:
        if self._meta_ok:
            return
        created_at, _ = _now()
        doc = {"format": LAKE_FORMAT, "policy_bucket_size": self.policy_bucket_size, "created_at": created_at}
        try:
            created = self._io("writing lake settings", self._put_exclusive, LAKE_META, json.dumps(doc, indent=1).encode())
        except LakeError:
            if self._read_lake_meta() is None:  # not a lost reply: it really failed
                raise
            created = False
        if not created:
            stored = self._read_lake_meta() or {}
            if int(stored.get("policy_bucket_size", self.policy_bucket_size)) != self.policy_bucket_size:
                raise LakeError(
                    f"lake {self.url} was created concurrently with policy_bucket_size={stored.get('policy_bucket_size')}"
                )
        self._meta_ok = True

    # ---- manifests ----------------------------------------------------------------------
    def _manifest_rel(self, run_id: str, snapshot_id: int) -> str:
        return f"{MANIFEST_DIR}/run_id={_enc(run_id)}/{snapshot_id:020d}.json"

    def _list_manifests(self, run_id: str | None = None) -> dict[str, list[int]]:
        """{run_id: sorted committed snapshot ids}, from one listing."""
        base = self._abs(MANIFEST_DIR if run_id is None else f"{MANIFEST_DIR}/run_id={_enc(run_id)}")
        with contextlib.suppress(Exception):
            self.fs.invalidate_cache(base)
        try:
            paths = self._io("listing manifests", self.fs.find, base)
        except FileNotFoundError:
            paths = []
        prefix = self._abs(MANIFEST_DIR) + "/"
        out: dict[str, list[int]] = {}
        for p in paths:
            p = self.fs._strip_protocol(p)
            if not p.startswith(prefix):
                continue
            parts = p[len(prefix) :].split("/")
            if len(parts) != 2 or not parts[0].startswith("run_id="):
                continue
            m = _MANIFEST_NAME.match(parts[1])
            if m:
                out.setdefault(unquote(parts[0][len("run_id=") :]), []).append(int(m.group(1)))
        for v in out.values():
            v.sort()
        return out

    def snapshots(self, run_id: str) -> list[int]:
        """Committed snapshot ids of a run (oldest first; ``gc`` removes expired ones)."""
        return self._list_manifests(_check_run_id(run_id)).get(run_id, [])

    def manifest(self, run_id: str, snapshot_id: int) -> dict:
        """One committed manifest (immutable, cached)."""
        key = (run_id, int(snapshot_id))
        with self._lock:
            m = self._manifest_cache.get(key)
            if m is not None:
                self._manifest_cache.move_to_end(key)
                return m
        rel = self._manifest_rel(run_id, snapshot_id)
        try:
            m = json.loads(self._cat(rel))
        except FileNotFoundError:
            raise LakeError(f"snapshot {snapshot_id} of run {run_id!r} is not in lake {self.url}") from None
        except json.JSONDecodeError as e:
            raise CorruptionError(f"manifest {self._url_of(rel)} is not valid JSON: {e}") from e
        self._remember(key, m)
        return m

    def _remember(self, key: tuple[str, int], manifest: dict) -> None:
        with self._lock:
            self._manifest_cache[key] = manifest
            self._manifest_cache.move_to_end(key)
            while len(self._manifest_cache) > 64:
                self._manifest_cache.popitem(last=False)

    def latest_manifest(self, run_id: str) -> dict | None:
        """The newest committed manifest of ``run_id``, or None when the run has none."""
        sids = self.snapshots(run_id)
        return self.manifest(run_id, sids[-1]) if sids else None

    def runs(self) -> list[str]:
        """Runs with at least one committed snapshot, sorted."""
        return sorted(self._list_manifests())

    def _manifests(self, run_id: str | None, snapshot_id: int | None = None) -> dict[str, dict]:
        if snapshot_id is not None:
            if run_id is None:
                raise ValueError("snapshot_id needs a run_id")
            return {run_id: self.manifest(run_id, snapshot_id)}
        listing = self._list_manifests(None if run_id is None else _check_run_id(run_id))
        return {r: self.manifest(r, sids[-1]) for r, sids in sorted(listing.items()) if sids}

    # ---- read side ----------------------------------------------------------------------
    def files(self, run_id: str | None = None, *, snapshot_id: int | None = None) -> list[str]:
        """URLs (local: absolute paths) of the committed live data files, all runs if ``run_id`` is None."""
        return [self._url_of(f["path"]) for m in self._manifests(run_id, snapshot_id).values() for f in m["files"]]

    def _delete_keys_of(self, entry: dict) -> pa.Array:
        rel = entry["path"]
        with self._lock:
            arr = self._keys_cache.get(rel)
        if arr is not None:
            return arr
        data = self._fetch(entry, verify=True)
        try:
            table = pa.ipc.open_file(pa.BufferReader(data)).read_all()
        except pa.ArrowInvalid as e:
            raise CorruptionError(f"delete file {self._url_of(rel)} is unreadable: {e}") from e
        arr = table.column("key").combine_chunks().cast(pa.string())
        with self._lock:
            self._keys_cache[rel] = arr
        return arr

    def _tombstones(self, manifest: dict | None) -> pa.Array:
        if not manifest or not manifest.get("delete_files"):
            return pa.array([], pa.string())
        return _unique_strings([self._delete_keys_of(d) for d in manifest["delete_files"]])

    def deleted_keys(self, run_id: str | None = None, *, snapshot_id: int | None = None) -> pa.Array:
        """The tombstoned keys (string array, unique) of one run or of all runs."""
        return _unique_strings([self._tombstones(m) for m in self._manifests(run_id, snapshot_id).values()])

    def schema(self, run_id: str | None = None) -> pa.Schema:
        """Row schema of the lake (unified over runs), with the ``run_id`` and ``policy_bucket`` columns."""
        return self._dataset_schema(self._manifests(run_id))

    def _dataset_schema(self, manifests: dict[str, dict], schema: pa.Schema | None = None) -> pa.Schema:
        if schema is None:
            schemas = [_schema_from_b64(m["schema"]) for m in manifests.values() if m.get("schema")]
            if not schemas:
                schema = ROLLOUT_SCHEMA
            elif len(schemas) == 1:
                schema = schemas[0]
            else:
                try:
                    schema = pa.unify_schemas(schemas)
                except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
                    raise SchemaError(f"runs of lake {self.url} have incompatible schemas: {e}") from e
        schema = _with_run_id(schema)
        if "policy_bucket" not in schema.names:
            schema = schema.append(PARTITION_FIELDS[1])
        return schema

    def _fragment(self, run_id: str, entry: dict) -> ds.Fragment:
        expr = (ds.field("run_id") == run_id) & (ds.field("policy_bucket") == int(entry["policy_bucket"]))
        if entry.get("min_policy_version") is not None:
            expr = expr & (ds.field("policy_version") >= int(entry["min_policy_version"]))
            expr = expr & (ds.field("policy_version") <= int(entry["max_policy_version"]))
        return self._format.make_fragment(
            self._abs(entry["path"]), filesystem=self._pafs, partition_expression=expr, file_size=int(entry["bytes"])
        )

    def dataset(
        self,
        run_id: str | None = None,
        schema: pa.Schema | None = None,
        *,
        snapshot_id: int | None = None,
        apply_deletes: bool = True,
    ) -> ds.Dataset:
        """A pyarrow dataset over the committed files (pinned to the manifests read now), hive partition
        columns ``run_id`` (string) and ``policy_bucket`` (int64), tombstoned keys filtered out.

        Each fragment carries ``run_id``, ``policy_bucket`` and the file's ``policy_version`` range as
        its partition expression, so filters on any of them skip other files without opening them.
        """
        manifests = self._manifests(run_id, snapshot_id)
        full = self._dataset_schema(manifests, schema)
        frags = [self._fragment(r, f) for r, m in manifests.items() for f in m["files"]]
        dset = ds.FileSystemDataset(frags, full, self._format, self._pafs)
        if apply_deletes:
            expr = None
            for r, m in manifests.items():
                keys = self._tombstones(m)
                if len(keys) == 0:
                    continue
                hide = pc.is_in(ds.field("key"), value_set=keys)
                if len(manifests) > 1:
                    hide = (ds.field("run_id") == r) & hide
                expr = ~hide if expr is None else expr & ~hide
            if expr is not None:
                dset = dset.filter(expr)
        return dset

    def register(self, con: Any, view: str = "cold", run_id: str | None = None) -> None:
        """Create or replace the DuckDB view ``view`` over the committed files minus tombstones.

        No DuckDB extension is needed: the view reads a pyarrow dataset registered on ``con``
        (S3 through s3fs). The view is pinned to the snapshots committed now; call again to refresh.
        """
        dset = self.dataset(run_id)
        source = f"__lakebuffer_{view}_dataset"
        con.register(source, dset)
        con.execute(render_sql("lake_view", view=_ident(view), source=_ident(source)))

    def prune_hint(self, where: str) -> str:
        """``where`` with redundant ``policy_bucket`` predicates ANDed for its top-level integer
        comparisons on ``policy_version`` (>=, >, =, <=, <, BETWEEN, IN), so engines that prune only on
        hive columns (DuckDB read_parquet, polars) skip other buckets. Anything else is left as is; a
        predicate with a top-level OR is returned unchanged."""
        if not where or not where.strip():
            return where
        size = self.policy_bucket_size
        hints: list[str] = []
        for c in _conjuncts(where.strip()):
            hint = None
            if m := _CMP.match(c):
                hint = self._bucket_hint(m.group("q"), m.group("op"), int(m.group("v")), size)
            elif m := _CMP_REV.match(c):
                hint = self._bucket_hint(m.group("q"), _FLIP[m.group("op")], int(m.group("v")), size)
            elif m := _BETWEEN.match(c):
                a, b = int(m.group("a")), int(m.group("b"))
                hint = f"{m.group('q')}policy_bucket BETWEEN {a // size} AND {b // size}"
            elif m := _IN.match(c):
                vals = sorted({int(v) // size for v in m.group("vals").split(",")})
                hint = f"{m.group('q')}policy_bucket IN ({', '.join(map(str, vals))})"
            if hint and hint not in hints:
                hints.append(hint)
        if not hints:
            return where
        return where.rstrip() + "".join(f" AND {h}" for h in hints)

    @staticmethod
    def _bucket_hint(q: str, op: str, v: int, size: int) -> str:
        col = f"{q}policy_bucket"
        if op == ">=":
            return f"{col} >= {v // size}"
        if op == ">":
            return f"{col} >= {(v + 1) // size}"
        if op in ("=", "=="):
            return f"{col} = {v // size}"
        if op == "<=":
            return f"{col} <= {v // size}"
        return f"{col} <= {(v - 1) // size}"  # "<"

    # ---- fetching with checksums --------------------------------------------------------
    def _fetch(self, entry: dict, *, verify: bool) -> bytes:
        rel = entry["path"]
        try:
            data = self._cat(rel)
        except FileNotFoundError:
            raise CorruptionError(f"lake file {self._url_of(rel)} listed in a committed manifest is missing") from None
        if verify:
            problem = self._check_bytes(entry, data)
            if problem:
                raise CorruptionError(f"lake file {self._url_of(rel)} fails its checksum: {problem}")
        return data

    @staticmethod
    def _check_bytes(entry: dict, data: bytes) -> str | None:
        if len(data) != int(entry["bytes"]):
            return f"{len(data)} bytes, the manifest says {entry['bytes']}"
        digest = hashlib.sha256(data).hexdigest()
        if digest != entry["sha256"]:
            return f"sha256 {digest}, the manifest says {entry['sha256']}"
        return None

    def scan_batches(
        self,
        run_id: str,
        columns: list[str] | None = None,
        *,
        snapshot_id: int | None = None,
        verify: bool | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """Restore path: every live row of ``run_id`` as of its latest committed snapshot (or
        ``snapshot_id``), minus tombstones, streamed one row group at a time, with the ``run_id``
        column (``policy_bucket`` on request). Files are fetched by ``read_concurrency`` threads, up to
        ``read_ahead_bytes`` ahead of decoding (so decoding one file overlaps fetching the next) and
        checked against the manifest's checksums (``CorruptionError`` naming the file) unless
        ``verify=False``."""
        _check_run_id(run_id)
        m = self.manifest(run_id, snapshot_id) if snapshot_id is not None else self.latest_manifest(run_id)
        if m is None:
            return
        verify = self.verify_reads if verify is None else verify
        keys = self._tombstones(m)
        row_schema = _with_run_id(_schema_from_b64(m["schema"])) if m.get("schema") else _with_run_id(ROLLOUT_SCHEMA)
        if columns is None:
            out_schema = row_schema
        else:
            fields = []
            for c in columns:
                if c == "policy_bucket":
                    fields.append(PARTITION_FIELDS[1])
                elif c in row_schema.names:
                    fields.append(row_schema.field(c))
                else:
                    raise KeyError(f"column {c!r} is not in run {run_id!r} of lake {self.url}")
            out_schema = pa.schema(fields, metadata=row_schema.metadata)
        physical = [f.name for f in out_schema if f.name not in ("run_id", "policy_bucket")]
        need_key = len(keys) > 0 and "key" not in physical
        read_cols = physical + (["key"] if need_key else [])
        entries = sorted(m["files"], key=lambda f: (int(f.get("snapshot_id", 0)), f["path"]))
        for entry, pf, i in _BlockReader(self, entries, verify).row_groups():
            avail = set(pf.schema_arrow.names)
            t = pf.read_row_group(i, columns=[c for c in read_cols if c in avail], use_threads=False)
            if len(keys):
                t = t.filter(pc.invert(pc.is_in(t.column("key"), value_set=keys)))
            n = t.num_rows
            if n == 0:
                continue
            arrays = []
            for f in out_schema:
                if f.name == "run_id":
                    arrays.append(pa.repeat(pa.scalar(run_id, f.type), n))
                elif f.name == "policy_bucket":
                    arrays.append(pa.repeat(pa.scalar(int(entry["policy_bucket"]), pa.int64()), n))
                elif f.name in avail:
                    col = t.column(f.name)
                    arrays.append(col if col.type.equals(f.type) else col.cast(f.type))
                else:
                    arrays.append(pa.nulls(n, f.type))
            yield from pa.Table.from_arrays(arrays, schema=out_schema).to_batches()

    def verify(self, run_id: str | None = None) -> dict:
        """Check size and sha256 of every live data and delete file of the latest snapshots;
        ``CorruptionError`` naming every bad or missing file, else a summary."""
        bad: list[str] = []
        nfiles = nbytes = 0
        for r, m in self._manifests(run_id).items():
            for entry in [*m["files"], *m.get("delete_files", [])]:
                nfiles += 1
                url = self._url_of(entry["path"])
                try:
                    data = self._cat(entry["path"])
                except FileNotFoundError:
                    bad.append(f"{url} (missing; snapshot {m['snapshot_id']} of run {r!r})")
                    continue
                nbytes += len(data)
                problem = self._check_bytes(entry, data)
                if problem:
                    bad.append(f"{url} ({problem})")
        if bad:
            err = CorruptionError(f"{len(bad)} lake file(s) fail verification: " + "; ".join(bad))
            err.paths = [b.split(" (", 1)[0] for b in bad]
            raise err
        return {"files": nfiles, "bytes": nbytes}

    def stats(self, run_id: str | None = None) -> dict:
        """Sizes from the latest manifests (no data read): rows counts file rows, tombstones not subtracted."""
        ms = self._manifests(run_id)
        files = [f for m in ms.values() for f in m["files"]]
        return {
            "runs": len(ms),
            "files": len(files),
            "rows": sum(int(f["rows"]) for f in files),
            "bytes": sum(int(f["bytes"]) for f in files),
            "delete_files": sum(len(m.get("delete_files", [])) for m in ms.values()),
            "last_snapshot_id": {r: m["snapshot_id"] for r, m in ms.items()},
        }

    # ---- write side ---------------------------------------------------------------------
    def _parquet_options(self, schema: pa.Schema) -> dict:
        dict_cols = [f.name for f in schema if (pa.types.is_string(f.type) or pa.types.is_large_string(f.type)) and f.name != "key"]
        stats_cols = [f.name for f in schema if not pa.types.is_nested(f.type)]
        return {
            "compression": "zstd",
            "compression_level": 1,
            "use_dictionary": dict_cols or False,
            "write_statistics": stats_cols or False,
            "store_schema": True,
        }

    def _write_delete_file(self, run_id: str, snapshot_id: int, keys: pa.Array) -> dict:
        rel = f"{DELETE_DIR}/run_id={_enc(run_id)}/del-{snapshot_id:08d}-{_file_token()}.arrow"
        sink = pa.BufferOutputStream()
        table = pa.table({"key": keys.cast(pa.string())})
        with pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
        data = sink.getvalue().to_pybytes()
        self._put_small(rel, data)
        with self._lock:
            self._keys_cache[rel] = table.column("key").combine_chunks()
        return {
            "path": rel,
            "snapshot_id": snapshot_id,
            "rows": len(keys),
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }

    def _commit(
        self,
        run_id: str,
        parent: dict | None,
        *,
        operation: str,
        add_files: list[dict],
        remove_files: set[str],
        add_deletes: list[dict],
        remove_deletes: set[str],
        schema: pa.Schema,
        meta: dict | None,
        extra: dict | None = None,
    ) -> dict:
        """Write the next manifest with an exclusive create; rebase on a concurrent commit when what
        this commit removes is still live there, else raise LakeError."""
        token = uuid.uuid4().hex
        for _ in range(16):
            parent_files = parent["files"] if parent else []
            parent_deletes = parent.get("delete_files", []) if parent else []
            live = {f["path"] for f in parent_files}
            live_del = {d["path"] for d in parent_deletes}
            if not remove_files <= live or not remove_deletes <= live_del:
                raise LakeError(
                    f"{operation} of run {run_id!r} conflicts with a concurrent commit (snapshot "
                    f"{parent['snapshot_id'] if parent else None}) that replaced the same files; nothing was committed"
                )
            sid = (parent["snapshot_id"] if parent else 0) + 1
            unified = schema
            if parent and parent.get("schema"):
                try:
                    unified = pa.unify_schemas([_schema_from_b64(parent["schema"]), schema])
                except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
                    raise SchemaError(f"snapshot schema does not fit run {run_id!r}: {e}") from e
            files = [f for f in parent_files if f["path"] not in remove_files] + add_files
            deletes = [d for d in parent_deletes if d["path"] not in remove_deletes] + add_deletes
            created_at, ts = _now()
            manifest = {
                "format": MANIFEST_FORMAT,
                "run_id": run_id,
                "snapshot_id": sid,
                "parent_id": parent["snapshot_id"] if parent else None,
                "created_at": created_at,
                "created_at_s": ts,
                "operation": operation,
                "policy_bucket_size": self.policy_bucket_size,
                "schema": _schema_to_b64(unified),
                "columns": [{"name": f.name, "type": str(f.type)} for f in unified],
                "files": files,
                "delete_files": deletes,
                "added_files": [f["path"] for f in add_files] + [d["path"] for d in add_deletes],
                "removed_files": sorted(remove_files | remove_deletes),
                "summary": {
                    "files": len(files),
                    "rows": sum(int(f["rows"]) for f in files),
                    "bytes": sum(int(f["bytes"]) for f in files),
                    "delete_files": len(deletes),
                    "deleted_keys": sum(int(d["rows"]) for d in deletes),
                },
                "meta": meta or {},
                "commit_token": token,
                **(extra or {}),
            }
            rel = self._manifest_rel(run_id, sid)
            data = json.dumps(manifest, separators=(",", ":")).encode()
            try:
                created = self._put_exclusive(rel, data)
            except Exception as e:
                created = self._commit_outcome(run_id, sid, token, e)
            if created:
                self._remember((run_id, sid), manifest)
                return manifest
            with self._lock:
                self._manifest_cache.pop((run_id, sid), None)
            other = self.manifest(run_id, sid)
            if other.get("commit_token") == token:  # our own write, retried after a lost reply
                return other
            parent = self.latest_manifest(run_id)
        raise LakeError(f"could not commit to run {run_id!r} of lake {self.url}: too many concurrent commits")

    def _commit_outcome(self, run_id: str, sid: int, token: str, error: Exception) -> bool:
        """After a failed manifest write: True if it landed anyway (a lost reply), else raise."""
        what = f"committing snapshot {sid} of run {run_id!r} to lake {self.url} failed ({type(error).__name__}: {error})"
        try:
            other = json.loads(self._cat(self._manifest_rel(run_id, sid)))
        except FileNotFoundError:
            raise LakeError(f"{what}; nothing was committed") from error
        except Exception:
            raise LakeError(
                f"{what} and the store did not answer the check: the snapshot is either fully visible or not at all; "
                "look at latest_manifest() (e.g. a token in meta) before retrying"
            ) from error
        if other.get("commit_token") == token:
            return True
        return False  # someone else's commit: rebase

    def commit_snapshot(
        self,
        run_id: str,
        batches: Iterable[pa.Table | pa.RecordBatch],
        deleted_keys: Sequence[str] | pa.Array = (),
        *,
        meta: dict | None = None,
        force: bool = False,
    ) -> dict | None:
        """Append ``batches`` (streamed, never concatenated) and tombstone ``deleted_keys`` (hidden from
        all earlier files of the run) as one atomic snapshot; return its manifest, or None for an empty
        snapshot (no rows, no deletes) unless ``force``. Rows must belong to ``run_id`` (their
        ``run_id`` column, if any, is checked and dropped: the path carries it). Any storage error
        raises LakeError and leaves the committed state as it was."""
        self._check_writable()
        _check_run_id(run_id)
        parent = self.latest_manifest(run_id)
        self._ensure_lake_meta()
        sid = (parent["snapshot_id"] if parent else 0) + 1
        dkeys = _as_key_array(deleted_keys)
        tomb = self._tombstones(parent)
        watch = _unique_strings([tomb, dkeys])
        hits: list[pa.Array] = []
        writer: _Writer | None = None
        rewriter: _Writer | None = None
        delete_entry: dict | None = None
        row_schema: pa.Schema | None = None
        file_schema: pa.Schema | None = None
        user_error: BaseException | None = None
        committing = False
        it = _iter_input(batches)
        try:
            while True:
                try:
                    batch = next(it)
                except StopIteration:
                    break
                except BaseException as e:
                    user_error = e
                    raise
                if batch.num_rows == 0:
                    continue
                if "run_id" in batch.schema.names:
                    col = batch.column("run_id")
                    if not pa.types.is_string(col.type):
                        col = col.cast(pa.string())
                    if col.null_count or pc.any(pc.not_equal(col, pa.scalar(run_id))).as_py():
                        raise SchemaError(f"batch holds rows of another run than {run_id!r}")
                if row_schema is None:
                    row_schema = _with_run_id(_without(batch.schema, ["policy_bucket"]))
                    file_schema = _without(batch.schema, ["run_id", "policy_bucket"])
                    if "policy_version" not in file_schema.names:
                        raise SchemaError("batches need a 'policy_version' column (the lake partitions by it)")
                    if parent and parent.get("schema"):
                        try:
                            pa.unify_schemas([_schema_from_b64(parent["schema"]), row_schema])
                        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
                            raise SchemaError(f"snapshot schema does not fit run {run_id!r}: {e}") from e
                    writer = _Writer(self, run_id, sid, file_schema, self.target_file_bytes)
                batch = _without_columns(batch, ("run_id", "policy_bucket"))
                if not batch.schema.equals(file_schema, check_metadata=False):
                    if set(batch.schema.names) != set(file_schema.names):
                        raise SchemaError(
                            f"batches of one snapshot must have the same columns: {batch.schema.names} vs {file_schema.names}"
                        )
                    try:
                        batch = _conform(batch, file_schema)
                    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
                        raise SchemaError(f"batch does not fit the snapshot schema: {e}") from e
                if len(watch) and "key" in file_schema.names:
                    k = batch.column("key")
                    hit = k.filter(pc.is_in(k, value_set=watch))
                    if len(hit):
                        hits.append(hit)
                writer.add(batch)
            entries = writer.finish() if writer is not None else []
            nrows = sum(int(e["rows"]) for e in entries)
            if nrows == 0 and len(dkeys) == 0 and not force:
                return None
            resurrected = _unique_strings(hits)
            remove_files: set[str] = set()
            remove_deletes: set[str] = set()
            rewritten: list[dict] = []
            if len(resurrected):
                # keys deleted earlier (or in this very snapshot) come back with this snapshot: drop
                # their old rows physically and take them out of the tombstone set
                hidden = watch
                wide = row_schema
                if parent and parent.get("schema"):
                    wide = pa.unify_schemas([_schema_from_b64(parent["schema"]), row_schema])
                rewriter = _Writer(self, run_id, sid, _without(wide, ["run_id", "policy_bucket"]), self.target_file_bytes, tag="r", max_lanes=1)
                affected = self._files_with_keys(parent, resurrected)
                remove_files.update(f["path"] for f in affected)
                self._copy_rows(affected, rewriter, hidden, rewriter.schema)
                rewritten = rewriter.finish()
                remaining = pc.filter(watch, pc.invert(pc.is_in(watch, value_set=resurrected)))
                remove_deletes = {d["path"] for d in (parent or {}).get("delete_files", [])}
                if len(remaining):
                    delete_entry = self._write_delete_file(run_id, sid, remaining)
            elif len(dkeys):
                delete_entry = self._write_delete_file(run_id, sid, dkeys)
            schema_for_manifest = row_schema or (_schema_from_b64(parent["schema"]) if parent and parent.get("schema") else _with_run_id(ROLLOUT_SCHEMA))
            committing = True  # from here on a failure may leave a manifest that landed: keep the files
            return self._commit(
                run_id,
                parent,
                operation="append",
                add_files=entries + rewritten,
                remove_files=remove_files,
                add_deletes=[delete_entry] if delete_entry else [],
                remove_deletes=remove_deletes,
                schema=schema_for_manifest,
                meta=meta,
                extra={"added_rows": nrows, "deleted_keys_added": len(dkeys), "resurrected_keys": len(resurrected)},
            )
        except BaseException as e:
            if not committing:  # nothing references these files: try to remove them (gc gets the rest)
                for w in (writer, rewriter):
                    if w is not None:
                        w.abort()
                if delete_entry is not None:
                    self._remove_quietly([delete_entry["path"]])
            if e is user_error or isinstance(e, (LakeBufferError, KeyboardInterrupt)):
                raise
            raise LakeError(
                f"snapshot of run {run_id!r} to lake {self.url} failed, nothing was committed: {type(e).__name__}: {e}"
            ) from e

    def _files_with_keys(self, manifest: dict | None, keys: pa.Array) -> list[dict]:
        """Live files of ``manifest`` holding any of ``keys`` (reads only the key column)."""
        if not manifest or not len(keys):
            return []
        out = []
        for f in manifest["files"]:
            t = self._io(f"reading keys of {f['path']}", pq.read_table, self._abs(f["path"]), columns=["key"], filesystem=self._pafs)
            if pc.any(pc.is_in(t.column("key"), value_set=keys)).as_py():
                out.append(f)
        return out

    def _copy_rows(self, entries: list[dict], writer: _Writer, hidden: pa.Array, schema: pa.Schema, progress: Callable[[int], None] | None = None) -> None:
        """Stream the rows of verified files into ``writer``, without keys in ``hidden``."""
        for entry, pf, i in _BlockReader(self, entries, verify=True).row_groups():
            t = pf.read_row_group(i, use_threads=False)
            if len(hidden) and "key" in t.column_names:
                t = t.filter(pc.invert(pc.is_in(t.column("key"), value_set=hidden)))
            if t.num_rows:
                for b in _conform(t, schema).to_batches():
                    writer.add(b)
            if progress is not None:
                progress(int(entry["bytes"]) // max(pf.metadata.num_row_groups, 1))

    # ---- compaction & gc ----------------------------------------------------------------
    def compact(
        self,
        run_id: str | None = None,
        target_file_bytes: int = 256 * 2**20,
        progress: Callable[[int, int], None] | None = None,
        *,
        small_file_fraction: float = 0.75,
    ) -> dict:
        """Per partition, rewrite files smaller than ``small_file_fraction * target_file_bytes`` (when
        there are two or more) and every file holding tombstoned rows into files of about
        ``target_file_bytes``, then commit a manifest listing the new files instead of the replaced
        ones and without the applied delete files. Nothing is deleted: readers pinned to the older
        manifest keep reading it; ``gc`` removes replaced files after its grace period.
        ``progress(bytes_done, bytes_total)`` is called as input bytes are rewritten."""
        self._check_writable()
        runs = [_check_run_id(run_id)] if run_id is not None else self.runs()
        stats = {
            "runs": {},
            "files_before": 0,
            "files_after": 0,
            "rows_before": 0,
            "rows_after": 0,
            "bytes_before": 0,
            "bytes_after": 0,
            "files_rewritten": 0,
            "files_written": 0,
            "delete_files_applied": 0,
        }
        plans = []
        for r in runs:
            parent = self.latest_manifest(r)
            if parent is None:
                continue
            tomb = self._tombstones(parent)
            by_bucket: dict[int, list[dict]] = {}
            for f in parent["files"]:
                by_bucket.setdefault(int(f["policy_bucket"]), []).append(f)
            chosen: list[dict] = []
            for files in by_bucket.values():
                small = [f for f in files if int(f["bytes"]) < small_file_fraction * target_file_bytes]
                pick = small if len(small) >= 2 else []
                if len(tomb):
                    picked = {f["path"] for f in pick}
                    rest = {"files": [f for f in files if f["path"] not in picked]}
                    pick = pick + self._files_with_keys(rest, tomb)
                chosen.extend(sorted(pick, key=lambda f: (int(f["policy_bucket"]), int(f.get("snapshot_id", 0)), f["path"])))
            plans.append((r, parent, tomb, chosen))
        total = sum(int(f["bytes"]) for _, _, _, chosen in plans for f in chosen)
        done = 0

        def tick(n: int) -> None:
            nonlocal done
            done = min(total, done + n)
            if progress is not None:
                progress(done, total)

        if progress is not None:
            progress(0, total)
        for r, parent, tomb, chosen in plans:
            before = parent["files"]
            rs = {
                "snapshot_id": parent["snapshot_id"],
                "files_before": len(before),
                "rows_before": sum(int(f["rows"]) for f in before),
                "bytes_before": sum(int(f["bytes"]) for f in before),
            }
            if not chosen and not parent.get("delete_files"):
                rs.update(files_after=rs["files_before"], rows_after=rs["rows_before"], bytes_after=rs["bytes_before"], files_rewritten=0, files_written=0, delete_files_applied=0)
            else:
                file_schema = _without(_schema_from_b64(parent["schema"]), ["run_id", "policy_bucket"])
                in_bytes: dict[int, int] = {}
                for f in chosen:
                    in_bytes[int(f["policy_bucket"])] = in_bytes.get(int(f["policy_bucket"]), 0) + int(f["bytes"])
                # parallel encoders only where the partition fills several target-size files
                lanes = {b: min(self.encode_threads, max(1, n // target_file_bytes)) for b, n in in_bytes.items()}
                writer = _Writer(self, r, parent["snapshot_id"] + 1, file_schema, target_file_bytes, tag="c", lanes=lanes)
                committing = False
                try:
                    self._copy_rows(chosen, writer, tomb, file_schema, progress=tick)
                    entries = writer.finish()
                    committing = True  # a failure now may leave a landed manifest: keep the files
                    m = self._commit(
                        r,
                        parent,
                        operation="compact",
                        add_files=entries,
                        remove_files={f["path"] for f in chosen},
                        add_deletes=[],
                        remove_deletes={d["path"] for d in parent.get("delete_files", [])},
                        schema=_schema_from_b64(parent["schema"]),
                        meta={"compaction": {"target_file_bytes": target_file_bytes, "parent_id": parent["snapshot_id"]}},
                    )
                except BaseException as e:
                    if not committing:
                        writer.abort()
                    if isinstance(e, (LakeBufferError, KeyboardInterrupt)):
                        raise
                    raise LakeError(f"compaction of run {r!r} in lake {self.url} failed, nothing was committed: {type(e).__name__}: {e}") from e
                after = m["files"]
                rs.update(
                    snapshot_id=m["snapshot_id"],
                    files_after=len(after),
                    rows_after=sum(int(f["rows"]) for f in after),
                    bytes_after=sum(int(f["bytes"]) for f in after),
                    files_rewritten=len(chosen),
                    files_written=len(entries),
                    delete_files_applied=len(parent.get("delete_files", [])),
                )
            stats["runs"][r] = rs
            for k in ("files_before", "files_after", "rows_before", "rows_after", "bytes_before", "bytes_after", "files_rewritten", "files_written", "delete_files_applied"):
                stats[k] += rs[k]
        if progress is not None:
            progress(total, total)
        return stats

    def gc(self, older_than_s: float = 3600) -> int:
        """Remove files no live snapshot needs: data and delete files referenced neither by the latest
        manifest of their run nor by a manifest superseded less than ``older_than_s`` ago (readers may
        still be pinned to it), and older than ``older_than_s`` themselves (so uploads in progress are
        safe); also the expired manifests and, on S3, multipart uploads a crashed writer left behind.
        Returns the number of objects removed (and uploads aborted)."""
        self._check_writable()
        cutoff = time.time() - float(older_than_s)
        keep: set[str] = set()
        doomed: list[str] = []
        for r, sids in self._list_manifests().items():
            latest = self.manifest(r, sids[-1])
            keep.update(f["path"] for f in latest["files"])
            keep.update(d["path"] for d in latest.get("delete_files", []))
            successor_time = float(latest.get("created_at_s", time.time()))
            expired = False
            for sid in reversed(sids[:-1]):
                if not expired and successor_time > cutoff:
                    m = self.manifest(r, sid)
                    keep.update(f["path"] for f in m["files"])
                    keep.update(d["path"] for d in m.get("delete_files", []))
                    successor_time = float(m.get("created_at_s", 0))
                else:
                    expired = True
                    doomed.append(self._manifest_rel(r, sid))
        prefix = self.root.rstrip("/") + "/"
        try:
            listing = self._io("listing the lake", self.fs.find, self.root, detail=True)
        except FileNotFoundError:
            listing = {}
        for path, info in listing.items():
            path = self.fs._strip_protocol(path)
            if not path.startswith(prefix):
                continue
            rel = path[len(prefix) :]
            if rel.startswith(MANIFEST_DIR + "/"):
                if os.path.basename(rel).startswith(".tmp-"):
                    mt = _mtime(info)
                    if mt is not None and mt < cutoff:
                        doomed.append(rel)
                continue
            if not (_DATA_FILE.match(rel) or _DELETE_FILE.match(rel)) or rel in keep:
                continue
            mt = _mtime(info)
            if mt is not None and mt < cutoff:
                doomed.append(rel)
        for rel in doomed:
            self._io(f"removing {rel}", self.fs.rm_file, self._abs(rel))
            with self._lock:
                self._keys_cache.pop(rel, None)
        return len(doomed) + self._abort_stale_uploads(cutoff)

    def _abort_stale_uploads(self, cutoff: float) -> int:
        """S3: abort multipart uploads under the lake started before ``cutoff`` (a crashed writer's)."""
        if self.protocol not in ("s3", "s3a") or not hasattr(self.fs, "call_s3"):
            return 0
        bucket, _, prefix = self.root.partition("/")
        prefix = prefix + "/" if prefix else ""
        resp = self._io("listing multipart uploads", self.fs.call_s3, "list_multipart_uploads", Bucket=bucket, Prefix=prefix)
        n = 0
        for up in resp.get("Uploads", []):
            m = _TOKEN_TIME.search(up.get("Key", ""))
            if m is None:  # not ours
                continue
            if int(m.group(1)) < cutoff:
                self._io("aborting an upload", self.fs.call_s3, "abort_multipart_upload", Bucket=bucket, Key=up["Key"], UploadId=up["UploadId"])
                n += 1
        return n

    def __repr__(self) -> str:
        return f"Lake({self.url!r}{', read_only=True' if self.read_only else ''})"
