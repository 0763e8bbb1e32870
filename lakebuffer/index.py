"""The key index: a RocksDB database (rocksdict, raw bytes, readable by any RocksDB tool).

Layout (one keyspace, prefixes keep scans cheap):

``k/<key>``        -> ``>QI`` batch id and row position inside the batch's current location
``b/<batch:>Q>``   -> JSON ``BatchInfo``: tier (hot | warm), rows, fragment id, files, checksum, snapshot
``m/<batch:>Q>``   -> Arrow IPC stream of the batch's metadata columns (what samplers select on), so
                      the catalog is rebuilt on open from one blob per batch, not one read per row;
                      kept in a column family of its own ("meta"), so the multi-MB blobs never share
                      SST blocks with ``k/`` entries (a missed key lookup must stay a cheap read)
``sc/<key>``       -> ``>i`` replays of a rollout since its push
``pr/<key>``       -> ``>d`` priority set by ``update_priority`` (absent: the sampler's expression)
``c/<name>``       -> counters (next key sequence, next batch id); ``s/<name>`` -> schema, run id
``l/<batch:>Q>``   -> a cold batch's row locations: ``>I`` length of a JSON list of lake file entries,
                      the JSON, then per position an int32 file index (-1: deleted slot) and an int64
                      row in that file (little-endian arrays: a ``get`` decodes them with no copy)
``p/<batch:>Q>``   -> an install in flight (written before its fragment, removed with its record), so
                      recovery can tell a crashed install's fragment from rows a damaged index lost
A batch's entries are written in one ``WriteBatch``, so the index never holds half a push.

RocksDB reports damage as a bare ``Exception`` (and an iterator over a corrupt block just stops):
opening and scanning here check for it and raise ``CorruptionError`` naming ``fsck --repair``.
``probe`` reads a directory's settings read-only first, because a read-write open of a damaged
index lets RocksDB delete files its broken MANIFEST no longer lists.
"""

from __future__ import annotations

import json
import struct
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
from rocksdict import AccessType, Options, Rdict, WriteBatch

from .errors import CorruptionError, LakeBufferError, SchemaError, StorageError, disk_full, error_boundary, is_disk_full

_LOC = struct.Struct(">QI")
_LOC_DTYPE = np.dtype([("batch", ">u8"), ("pos", ">u4")])  # the same layout, decoded by NumPy
_NO_LOC = bytes(_LOC.size)
_U64 = struct.Struct(">Q")
_U32 = struct.Struct(">I")
FILE_LISTS_KEPT = 4096  # decoded ``l/`` file lists kept (``KeyIndex._cold_blob``)
_I32 = struct.Struct(">i")
_F64 = struct.Struct(">d")


@dataclass
class BatchInfo:
    batch_id: int
    tier: str  # "hot" (RAM, and the WAL in wal mode), "warm" (an Arrow IPC fragment file) or "cold" (the lake only)
    rows: int
    fragment: int | None = None
    offset: int = 0  # first row of this batch inside its fragment (small batches share one)
    files: list[str] = field(default_factory=list)
    checksum: int | None = None
    nbytes: int = 0
    snapshot: int | None = None  # id of the lake snapshot that holds this batch's rows
    created_at: float = field(default_factory=time.time)  # when it was stored (the lake's lag in seconds)


def _cold_blob(files: list[dict], file_idx: np.ndarray, row: np.ndarray) -> bytes:
    """The ``l/`` value of a cold batch (see the module)."""
    head = json.dumps(files).encode()
    return _U32.pack(len(head)) + head + np.asarray(file_idx, "<i4").tobytes() + np.asarray(row, "<i8").tobytes()


def _bkey(prefix: bytes, batch_id: int) -> bytes:
    return prefix + _U64.pack(batch_id)


def ipc_bytes(table: pa.Table) -> bytes:
    """``table`` as one Arrow IPC stream: the buffers, one copy, no pickling."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def read_ipc(data: bytes) -> pa.Table:
    """The table of an IPC stream, its columns viewing ``data`` (no copy)."""
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def damaged(path: Path, detail: object) -> CorruptionError:
    """The error for an index RocksDB cannot read: what is wrong and the fix."""
    return CorruptionError(f"the key index {path} is damaged ({detail}); nothing was changed: run "
                           f"`lakebuffer fsck --repair {Path(path).parent}` to rebuild it from the local fragments "
                           f"and WAL")


def probe(path: Path) -> dict[str, bytes] | None:
    """The settings (``s/`` entries) of the index at ``path``, read-only; None if there is none.

    Read-only: RocksDB changes nothing, even when the index is damaged (``CorruptionError``). The
    batch records are read too (small); keys and metadata blobs are checked when they are read.
    """
    path = Path(path)
    if not (path / "CURRENT").exists():
        return None
    try:
        db = Rdict(str(path), options=Options(raw_mode=True), access_type=AccessType.read_only(),
                   column_families={"meta": Options(raw_mode=True)})
    except Exception as e:  # noqa: BLE001 - rocksdict raises bare Exception
        raise damaged(path, e) from e
    try:
        for _ in _checked_scan(db, b"b/", path):  # batch records are small; a damaged block shows here
            pass
        return {k[2:].decode(): v for k, v in _checked_scan(db, b"s/", path)}
    finally:
        db.close()


def _checked_scan(db: Rdict, prefix: bytes, path: Path) -> Iterator[tuple[bytes, bytes]]:
    """Entries under ``prefix``; ``CorruptionError`` if RocksDB stopped early on a damaged block.

    ``items`` (fast) ends silently at a damaged block, just as at the end of the database: when it
    ends before leaving the prefix, one iterator steps past the last entry seen and reports its status.
    """
    last = None
    try:
        for k, v in db.items(from_key=prefix):
            if not k.startswith(prefix):
                return  # left the range: it was read whole
            last = k
            yield k, v
        it = db.iter()
        try:
            if last is None:
                it.seek(prefix)
            else:
                it.seek(last)
                if it.valid():
                    it.next()
            it.status()  # raises what stopped the iteration, if a damaged block did
        finally:
            del it
    except CorruptionError:
        raise
    except Exception as e:  # noqa: BLE001 - rocksdict raises bare Exception
        raise damaged(path, e) from e


def _rocksdb_error(index: KeyIndex, e: BaseException) -> LakeBufferError | None:
    """rocksdict raises a bare ``Exception`` carrying RocksDB's status text ("IO error: ...")."""
    where = getattr(index, "path", "the key index")
    if isinstance(e, UnicodeEncodeError):
        return SchemaError(f"key {e.object!r} is not valid UTF-8 (a lone surrogate?); keys must be encodable text")
    if type(e) is Exception or isinstance(e, OSError):
        if str(e).startswith("Corruption"):
            return CorruptionError(f"index {where}: {e}; run `lakebuffer fsck --repair` on the buffer directory")
        if is_disk_full(e):  # RocksDB's "IO error: No space left on device": the same error as the WAL's
            return disk_full(f"writing the key index {where}", e)
        return StorageError(f"index {where}: {e} (free disk space or fix the directory, then reopen)")
    return None


@error_boundary(_rocksdb_error)
class KeyIndex:
    """Durable key -> location map and per-batch metadata. Thread-safe."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.set_write_buffer_size(2 << 20)  # bounded memtables: the index must not eat the RAM budget
        opts.create_missing_column_families(True)
        cf = Options(raw_mode=True)
        cf.set_write_buffer_size(2 << 20)
        try:
            self._db = Rdict(str(self.path), options=opts, column_families={"meta": cf})
        except Exception as e:  # noqa: BLE001 - rocksdict raises bare Exception
            raise damaged(self.path, e) from e
        self._meta = self._db.get_column_family("meta")
        self._meta_cf = self._db.get_column_family_handle("meta")
        self._lock = threading.Lock()
        #: decoded file lists of ``l/`` records, by their JSON bytes (a snapshot's batches share a few lists)
        self._file_lists: dict[bytes, list[dict]] = {}
        self._next_seq = self._counter(b"c/next_seq")
        self._next_batch = self._counter(b"c/next_batch")

    # counters and settings -------------------------------------------------------------
    def _counter(self, name: bytes) -> int:
        v = self._get(name)
        return _U64.unpack(v)[0] if v is not None else 0

    def reserve_keys(self, n_keys: int) -> int:
        """Reserve ``n_keys`` key sequence numbers (persisted with the next recorded batch)."""
        with self._lock:
            seq = self._next_seq
            self._next_seq += n_keys
            return seq

    def advance_keys(self, seq: int) -> None:
        """Never generate a key sequence number below ``seq`` (a sharded coordinator's floor: keys it
        acknowledged before this shard lost its unsnapshotted rows are not reissued)."""
        with self._lock:
            self._next_seq = max(self._next_seq, int(seq))

    def reserve_batch(self) -> int:
        with self._lock:
            bid = self._next_batch
            self._next_batch += 1
            return bid

    def _get(self, name: bytes) -> bytes | None:
        try:
            return self._db.get(name)
        except Exception as e:  # noqa: BLE001 - rocksdict raises bare Exception
            raise damaged(self.path, e) from e

    def get_setting(self, name: str) -> bytes | None:
        return self._get(b"s/" + name.encode())

    def put_setting(self, name: str, value: bytes) -> None:
        self._db[b"s/" + name.encode()] = value

    def delete_setting(self, name: str) -> None:
        del self._db[b"s/" + name.encode()]

    # writes ------------------------------------------------------------------------------
    def begin_install(self, batch_id: int) -> None:
        """Note an install in flight (before its fragment is written); ``record_batch`` clears it."""
        self._db[_bkey(b"p/", batch_id)] = b""

    def pending_installs(self) -> list[int]:
        """Installs begun but never recorded (crashed between fragment and index)."""
        return [_U64.unpack(k[2:])[0] for k, _ in self._scan(b"p/")]

    def clear_installs(self, batch_ids: Iterable[int]) -> None:
        wb = WriteBatch(raw_mode=True)
        for bid in batch_ids:
            wb.delete(_bkey(b"p/", bid))
        self._db.write(wb)

    def record_batch(self, info: BatchInfo, keys: list[str], meta: pa.Table,
                     positions: Iterable[int] | None = None) -> None:
        """Write every entry of a new batch atomically (keys, batch info, metadata, counters).

        Keys are unique: under the one lock that also covers the write, every key (generated or
        not) is looked up first, and a key another batch holds raises ``SchemaError`` with nothing
        written. Check and insert in one critical section is what makes concurrent pushes of the
        same key safe (a check before the lock let 4 threads store 245 rows under 200 keys).

        ``positions`` (default 0, 1, ...) are the keys' rows in the batch's location (fsck's rebuild
        passes them when deleted rows leave gaps in a fragment).
        """
        wb = WriteBatch(raw_mode=True)
        bid = info.batch_id
        names = [b"k/" + k.encode() for k in keys]
        for pos, name in zip(range(len(keys)) if positions is None else positions, names):
            wb.put(name, _LOC.pack(bid, int(pos)))
        wb.put(_bkey(b"b/", bid), json.dumps(asdict(info)).encode())
        wb.put(_bkey(b"m/", bid), ipc_bytes(meta), self._meta_cf)
        wb.delete(_bkey(b"p/", bid))
        with self._lock:
            for i, v in enumerate(self._db.get(names)):
                if v is not None and _LOC.unpack(v)[0] != bid:  # a rebuild of the same batch is no duplicate
                    raise SchemaError(f"column 'key': key {keys[i]!r} is already stored (keys are unique); "
                                      "push it under another key or delete the stored one first")
            wb.put(b"c/next_seq", _U64.pack(self._next_seq))
            wb.put(b"c/next_batch", _U64.pack(self._next_batch))
            self._db.write(wb)

    def record_cold_batch(self, info: BatchInfo, keys: list[str], meta: pa.Table, files: list[dict],
                          file_idx: np.ndarray, row: np.ndarray) -> None:
        """``record_batch`` of a batch only the lake holds (a lazy resume) with its rows' lake locations,
        in the same single write: a crash leaves the batch whole or absent."""
        wb = WriteBatch(raw_mode=True)
        bid = info.batch_id
        names = [b"k/" + k.encode() for k in keys]
        for pos, name in enumerate(names):
            wb.put(name, _LOC.pack(bid, pos))
        wb.put(_bkey(b"b/", bid), json.dumps(asdict(info)).encode())
        wb.put(_bkey(b"m/", bid), ipc_bytes(meta), self._meta_cf)
        wb.put(_bkey(b"l/", bid), _cold_blob(files, file_idx, row))
        with self._lock:
            for i, v in enumerate(self._db.get(names)):
                if v is not None and _LOC.unpack(v)[0] != bid:
                    raise SchemaError(f"column 'key': key {keys[i]!r} of lake file {files[0]['path']} is already "
                                      "stored (keys are unique); the lake holds it twice: run `lakebuffer fsck` on it")
            wb.put(b"c/next_seq", _U64.pack(self._next_seq))
            wb.put(b"c/next_batch", _U64.pack(self._next_batch))
            self._db.write(wb)

    def set_batches(self, infos: Iterable[BatchInfo]) -> None:
        wb = WriteBatch(raw_mode=True)
        for info in infos:
            wb.put(_bkey(b"b/", info.batch_id), json.dumps(asdict(info)).encode())
        self._db.write(wb)

    def set_warm(self, info: BatchInfo) -> None:
        """A cold batch is warm again (``engine/promotion``): its description, without its lake locations, in one write."""
        wb = WriteBatch(raw_mode=True)
        wb.put(_bkey(b"b/", info.batch_id), json.dumps(asdict(info)).encode())
        wb.delete(_bkey(b"l/", info.batch_id))
        self._db.write(wb)

    def rewrite_batch(self, info: BatchInfo, removed: list[str], positions: dict[str, int], meta: pa.Table) -> None:
        """After a delete: drop ``removed`` keys, move surviving keys to new positions, new metadata."""
        wb = WriteBatch(raw_mode=True)
        bid = info.batch_id
        for k in removed:
            wb.delete(b"k/" + k.encode())
            wb.delete(b"sc/" + k.encode())
            wb.delete(b"pr/" + k.encode())
        for k, pos in positions.items():
            wb.put(b"k/" + k.encode(), _LOC.pack(bid, pos))
        if info.rows == 0:
            wb.delete(_bkey(b"b/", bid))
            wb.delete(_bkey(b"l/", bid))
            wb.delete(_bkey(b"m/", bid), self._meta_cf)
        else:
            wb.put(_bkey(b"b/", bid), json.dumps(asdict(info)).encode())
            wb.put(_bkey(b"m/", bid), ipc_bytes(meta), self._meta_cf)
        self._db.write(wb)

    def drop_batch(self, batch_id: int, keys: Iterable[str]) -> None:
        """Forget a batch entirely (recovery of data that was never durable)."""
        wb = WriteBatch(raw_mode=True)
        for k in keys:
            wb.delete(b"k/" + k.encode())
            wb.delete(b"sc/" + k.encode())
            wb.delete(b"pr/" + k.encode())
        wb.delete(_bkey(b"b/", batch_id))
        wb.delete(_bkey(b"l/", batch_id))
        wb.delete(_bkey(b"m/", batch_id), self._meta_cf)
        self._db.write(wb)

    def set_cold(self, moves: Iterable[tuple[BatchInfo, list[dict], np.ndarray, np.ndarray]]) -> None:
        """Record batches as cold in one write: each one's ``BatchInfo`` and its rows' lake locations
        (``files``: lake file entries ``{path, bytes}``; ``file[i]``/``row[i]``: where position i lives)."""
        wb = WriteBatch(raw_mode=True)
        for info, files, file_idx, row in moves:
            wb.put(_bkey(b"b/", info.batch_id), json.dumps(asdict(info)).encode())
            wb.put(_bkey(b"l/", info.batch_id), _cold_blob(files, file_idx, row))
        self._db.write(wb)

    def cold_locations(self, batch_id: int) -> tuple[list[dict], np.ndarray, np.ndarray] | None:
        """(lake file entries, file index per position, row in that file per position) of a cold batch."""
        return self._cold_blob(batch_id, self._get(_bkey(b"l/", batch_id)))

    def cold_locations_many(self, batch_ids: list[int]) -> list[tuple[list[dict], np.ndarray, np.ndarray] | None]:
        """``cold_locations`` of several batches in one RocksDB multi-get (a cold ``get`` touches many)."""
        try:
            blobs = self._db.get([_bkey(b"l/", b) for b in batch_ids])
        except Exception as e:  # noqa: BLE001 - rocksdict raises bare Exception
            raise damaged(self.path, e) from e
        return [self._cold_blob(b, blob, shared=True) for b, blob in zip(batch_ids, blobs)]

    def _cold_blob(self, batch_id: int, blob: bytes | None, shared: bool = False
                   ) -> tuple[list[dict], np.ndarray, np.ndarray] | None:
        """Decode an ``l/`` record. ``shared`` (a get's read path): the file list may be one kept for
        records with the same JSON, and the arrays read-only views of ``blob``: the caller only reads
        them (decoding copies cost ~half of a 256-key get's location lookups)."""
        if blob is None:
            return None
        try:
            n_head = _U32.unpack_from(blob)[0]
            head = blob[4 : 4 + n_head]
            files = self._file_lists.get(head) if shared else None
            if files is None:
                files = json.loads(head)
                if shared:
                    if len(self._file_lists) >= FILE_LISTS_KEPT:
                        self._file_lists.clear()
                    self._file_lists[bytes(head)] = files
            body = memoryview(blob)[4 + n_head :]
            n = len(body) // 12
            if len(body) != n * 12:
                raise ValueError(f"{len(body)} bytes of locations")
            file_idx = np.frombuffer(body[: 4 * n], "<i4")
            row = np.frombuffer(body[4 * n :], "<i8")
            if not shared:
                file_idx, row = file_idx.astype(np.int64), row.astype(np.int64)
        except (struct.error, ValueError) as e:
            raise damaged(self.path, f"the lake locations of cold batch {batch_id} are unreadable: {e}") from e
        return files, file_idx, row

    def add_sample_counts(self, keys: list[str], counts: list[int]) -> None:
        """Add replays to each key's persisted count (``sc/`` holds the increment since push)."""
        names = [b"sc/" + k.encode() for k in keys]
        with self._lock:
            old = self._db.get(names)
            wb = WriteBatch(raw_mode=True)
            for name, prev, c in zip(names, old, counts):
                wb.put(name, _I32.pack((_I32.unpack(prev)[0] if prev is not None else 0) + int(c)))
            self._db.write(wb)

    def set_priorities(self, keys: list[str], priorities: list[float]) -> None:
        """Persist each key's priority (the last value set wins), atomically."""
        wb = WriteBatch(raw_mode=True)
        for k, p in zip(keys, priorities):
            wb.put(b"pr/" + k.encode(), _F64.pack(float(p)))
        self._db.write(wb)

    def priorities(self) -> dict[str, float]:
        return {k[3:].decode(): _F64.unpack(v)[0] for k, v in self._scan(b"pr/")}

    def lookup(self, keys: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Batch ids, positions and a found-mask for ``keys`` (one RocksDB multi-get)."""
        names = [b"k/" + k.encode() for k in keys]  # a key that is not UTF-8 is the caller's error (SchemaError)
        try:
            raw = self._db.get(names)
        except Exception as e:  # noqa: BLE001 - rocksdict raises bare Exception
            raise damaged(self.path, e) from e
        # one join and one NumPy decode instead of a struct.unpack per key (a ``get`` pays this per row)
        found = np.fromiter((v is not None for v in raw), dtype=bool, count=len(raw))
        if any(v is not None and len(v) != _LOC.size for v in raw):
            raise damaged(self.path, ValueError("a key's location entry has the wrong size"))
        packed = np.frombuffer(b"".join(v if ok else _NO_LOC for v, ok in zip(raw, found.tolist())), dtype=_LOC_DTYPE)
        return packed["batch"].astype(np.int64), packed["pos"].astype(np.int64), found

    def _scan(self, prefix: bytes, db: Rdict | None = None) -> Iterator[tuple[bytes, bytes]]:
        return _checked_scan(db if db is not None else self._db, prefix, self.path)

    def batches(self) -> dict[int, BatchInfo]:
        out = {}
        for k, v in self._scan(b"b/"):
            try:
                info = BatchInfo(**json.loads(v))
            except (ValueError, TypeError) as e:
                raise CorruptionError(f"index {self.path}: batch record {k!r} is unreadable: {e}") from e
            out[info.batch_id] = info
        return out

    def batch_meta(self, batch_id: int) -> pa.Table | None:
        try:
            blob = self._meta.get(_bkey(b"m/", batch_id))
        except Exception as e:  # noqa: BLE001 - rocksdict raises bare Exception
            raise damaged(self.path, e) from e
        return read_ipc(blob) if blob is not None else None

    def all_meta(self) -> Iterator[tuple[int, pa.Table]]:
        for k, v in self._scan(b"m/", self._meta):
            yield _U64.unpack(k[2:])[0], read_ipc(v)

    def sample_counts(self) -> dict[str, int]:
        return {k[3:].decode(): _I32.unpack(v)[0] for k, v in self._scan(b"sc/")}

    def iter_keys(self) -> Iterator[tuple[str, int, int]]:
        for k, v in self._scan(b"k/"):
            b, p = _LOC.unpack(v)
            yield k[2:].decode(), b, p

    # tombstones: deletes of rows the lake already holds, carried by the next snapshot
    def add_tombstones(self, keys: Iterable[str]) -> None:
        wb = WriteBatch(raw_mode=True)
        for k in keys:
            wb.put(b"d/" + k.encode(), b"")
        self._db.write(wb)

    def tombstones(self) -> list[str]:
        return [k[2:].decode() for k, _ in self._scan(b"d/")]

    def clear_tombstones(self, keys: Iterable[str]) -> None:
        wb = WriteBatch(raw_mode=True)
        for k in keys:
            wb.delete(b"d/" + k.encode())
        self._db.write(wb)

    def set_next_seq(self, value: int) -> None:
        """Move the key sequence past restored keys (never backwards)."""
        with self._lock:
            self._next_seq = max(self._next_seq, int(value))
            self._db[b"c/next_seq"] = _U64.pack(self._next_seq)

    def skip_generated(self, prefix: str) -> None:
        """Move the key sequence past the highest stored generated key ``<prefix>-<10 digits>``.

        The persisted counter is the fast path; this makes it self-healing (an index rebuilt from
        fragments, a counter write lost) at the cost of one reverse seek: fixed-width numbers sort
        in order, so the highest one is the last ``k/<prefix>-`` entry that is all digits.
        """
        head = b"k/" + prefix.encode() + b"-"
        for k, _ in self._db.items(backwards=True, from_key=head + b"9" * 10):
            if not k.startswith(head):
                return
            tail = k[len(head):]
            if len(tail) == 10 and tail.isdigit():
                self.set_next_seq(int(tail) + 1)
                return

    def set_next_batch(self, value: int) -> None:
        """Move the batch id counter past ids already used (never backwards)."""
        with self._lock:
            self._next_batch = max(self._next_batch, int(value))
            self._db[b"c/next_batch"] = _U64.pack(self._next_batch)

    @property
    def next_seq(self) -> int:
        return self._next_seq

    def flush(self) -> None:
        self._db.flush()

    def close(self) -> None:
        """Flush and close; the database is closed even when the flush fails (a full disk), so
        RocksDB's own lock is released and the directory can be opened again in this process."""
        try:
            self._db.flush()
        finally:
            # the column family views hold the database open: drop them before closing it
            self._meta = self._meta_cf = None
            self._db.close()
