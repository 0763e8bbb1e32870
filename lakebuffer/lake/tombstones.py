"""Delete files (tombstones) of the lake: write one, read and cache the keys of one, and the
tombstone set of a manifest (the union of its live delete files).

Delete files are immutable once written, so their keys are cached by path for the life of the lake
object; ``gc`` forgets the ones it removes.
"""

from __future__ import annotations

import hashlib
import threading

import pyarrow as pa

from ..errors import CorruptionError
from ..schema import unique_keys
from .fs import LakeFS
from .layout import delete_rel
from .reader import fetch


class Tombstones:
    """Keys hidden by delete files, cached per file."""

    def __init__(self, store: LakeFS) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._keys: dict[str, pa.Array] = {}

    def keys_of(self, entry: dict) -> pa.Array:
        """The (verified) keys of one delete file."""
        rel = entry["path"]
        with self._lock:
            arr = self._keys.get(rel)
        if arr is not None:
            return arr
        data = fetch(self.store, entry, verify=True)
        try:
            table = pa.ipc.open_file(pa.BufferReader(data)).read_all()
        except pa.ArrowInvalid as e:
            raise CorruptionError(f"delete file {self.store.url_of(rel)} is unreadable: {e}") from e
        arr = table.column("key").combine_chunks().cast(pa.string())
        with self._lock:
            self._keys[rel] = arr
        return arr

    def of(self, manifest: dict | None) -> pa.Array:
        """The tombstone set of a manifest: unique keys over its live delete files."""
        if not manifest or not manifest.get("delete_files"):
            return pa.array([], pa.string())
        return unique_keys([self.keys_of(d) for d in manifest["delete_files"]])

    def write(self, run_id: str, snapshot_id: int, keys: pa.Array) -> dict:
        """Write a delete file holding ``keys``; return its manifest entry."""
        rel = delete_rel(run_id, snapshot_id)
        sink = pa.BufferOutputStream()
        table = pa.table({"key": keys.cast(pa.string())})
        with pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
        data = sink.getvalue().to_pybytes()
        self.store.put_small(rel, data)
        with self._lock:
            self._keys[rel] = table.column("key").combine_chunks()
        return {
            "path": rel,
            "snapshot_id": snapshot_id,
            "rows": len(keys),
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }

    def forget(self, rel: str) -> None:
        with self._lock:
            self._keys.pop(rel, None)
