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
A batch's entries are written in one ``WriteBatch``, so the index never holds half a push.
"""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
from rocksdict import Options, Rdict, WriteBatch

from .errors import CorruptionError

_LOC = struct.Struct(">QI")
_U64 = struct.Struct(">Q")
_I32 = struct.Struct(">i")
_F64 = struct.Struct(">d")


@dataclass
class BatchInfo:
    batch_id: int
    tier: str  # "hot" (RAM, and the WAL in wal mode) or "warm" (a Lance fragment)
    rows: int
    fragment: int | None = None
    offset: int = 0  # first row of this batch inside its fragment (small batches share one)
    files: list[str] = field(default_factory=list)
    checksum: int | None = None
    nbytes: int = 0
    snapshot: int | None = None  # id of the lake snapshot that holds this batch's rows


def _bkey(prefix: bytes, batch_id: int) -> bytes:
    return prefix + _U64.pack(batch_id)


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def _from_ipc(blob: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(blob)).read_all()


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
        self._db = Rdict(str(self.path), options=opts, column_families={"meta": cf})
        self._meta = self._db.get_column_family("meta")
        self._meta_cf = self._db.get_column_family_handle("meta")
        self._lock = threading.Lock()
        self._next_seq = self._counter(b"c/next_seq")
        self._next_batch = self._counter(b"c/next_batch")

    # counters and settings -------------------------------------------------------------
    def _counter(self, name: bytes) -> int:
        v = self._db.get(name)
        return _U64.unpack(v)[0] if v is not None else 0

    def reserve_keys(self, n_keys: int) -> int:
        """Reserve ``n_keys`` key sequence numbers (persisted with the next recorded batch)."""
        with self._lock:
            seq = self._next_seq
            self._next_seq += n_keys
            return seq

    def reserve_batch(self) -> int:
        with self._lock:
            bid = self._next_batch
            self._next_batch += 1
            return bid

    def get_setting(self, name: str) -> bytes | None:
        return self._db.get(b"s/" + name.encode())

    def put_setting(self, name: str, value: bytes) -> None:
        self._db[b"s/" + name.encode()] = value

    # writes ------------------------------------------------------------------------------
    def record_batch(self, info: BatchInfo, keys: list[str], meta: pa.Table) -> None:
        """Write every entry of a new batch atomically (keys, batch info, metadata, counters)."""
        wb = WriteBatch(raw_mode=True)
        bid = info.batch_id
        for pos, k in enumerate(keys):
            wb.put(b"k/" + k.encode(), _LOC.pack(bid, pos))
        wb.put(_bkey(b"b/", bid), json.dumps(asdict(info)).encode())
        wb.put(_bkey(b"m/", bid), _ipc(meta), self._meta_cf)
        with self._lock:
            wb.put(b"c/next_seq", _U64.pack(self._next_seq))
            wb.put(b"c/next_batch", _U64.pack(self._next_batch))
            self._db.write(wb)

    def set_batches(self, infos: Iterable[BatchInfo]) -> None:
        wb = WriteBatch(raw_mode=True)
        for info in infos:
            wb.put(_bkey(b"b/", info.batch_id), json.dumps(asdict(info)).encode())
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
            wb.delete(_bkey(b"m/", bid), self._meta_cf)
        else:
            wb.put(_bkey(b"b/", bid), json.dumps(asdict(info)).encode())
            wb.put(_bkey(b"m/", bid), _ipc(meta), self._meta_cf)
        self._db.write(wb)

    def drop_batch(self, batch_id: int, keys: Iterable[str]) -> None:
        """Forget a batch entirely (recovery of data that was never durable)."""
        wb = WriteBatch(raw_mode=True)
        for k in keys:
            wb.delete(b"k/" + k.encode())
            wb.delete(b"sc/" + k.encode())
            wb.delete(b"pr/" + k.encode())
        wb.delete(_bkey(b"b/", batch_id))
        wb.delete(_bkey(b"m/", batch_id), self._meta_cf)
        self._db.write(wb)

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
        raw = self._db.get([b"k/" + k.encode() for k in keys])
        n = len(keys)
        batch = np.zeros(n, dtype=np.int64)
        pos = np.zeros(n, dtype=np.int64)
        found = np.zeros(n, dtype=bool)
        for i, v in enumerate(raw):
            if v is not None:
                batch[i], pos[i] = _LOC.unpack(v)
                found[i] = True
        return batch, pos, found

    def _scan(self, prefix: bytes, db: Rdict | None = None) -> Iterator[tuple[bytes, bytes]]:
        for k, v in (db if db is not None else self._db).items(from_key=prefix):
            if not k.startswith(prefix):
                break
            yield k, v

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
        blob = self._meta.get(_bkey(b"m/", batch_id))
        return _from_ipc(blob) if blob is not None else None

    def all_meta(self) -> Iterator[tuple[int, pa.Table]]:
        for k, v in self._scan(b"m/", self._meta):
            yield _U64.unpack(k[2:])[0], _from_ipc(v)

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

    @property
    def next_seq(self) -> int:
        return self._next_seq

    def flush(self) -> None:
        self._db.flush()

    def close(self) -> None:
        self._db.flush()
        # the column family views hold the database open: drop them before closing it
        self._meta = self._meta_cf = None
        self._db.close()
