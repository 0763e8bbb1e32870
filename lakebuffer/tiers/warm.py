"""The warm tier: evicted batches as fragments of one local Lance dataset.

One eviction is one Lance append, so one hot batch becomes one fragment, addressed by
``(fragment_id << 32) | row``. Lance gives what a replay buffer needs from disk: random ``take``
by row address with column projection (asking for ``reward`` never reads ``response_ids``),
deletion vectors for deletes, and a pyarrow-dataset face DuckDB scans with pushdown.

``WarmTier`` implements ``Tier``: a part is a Lance fragment. Random reads go by row address
through Lance's private ``_take_rows`` (the public ``take`` wants dataset-wide row offsets, which
shift whenever a fragment is dropped; addresses stay valid); that call sits behind ``_lance_take``.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
import zlib
from collections.abc import Sequence
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa

from ..errors import CorruptionError, LakeBufferError, StorageError, error_boundary
from .base import Location, Staged

log = logging.getLogger("lakebuffer.warm")

#: Lance file format of the warm tier. Measured here on 2 cores with 2k-token rollouts: format 2.0
#: writes ~1.0 GB/s, the 2.2 default ~0.2 GB/s (its adaptive compression buys ~20% disk on random
#: token ids, not worth a 5x slower write-back for a local, short-lived tier).
WARM_STORAGE_VERSION = "2.0"
WARM_METADATA_CACHE = 16 << 20


def _crc32_file(path: Path) -> int:
    """crc32 of a file through a read-only memory map: no copy, no buffer allocated per call."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return 0
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return zlib.crc32(m)


def _lance_take(ds: lance.LanceDataset, addresses: np.ndarray, columns: list[str]) -> pa.Table:
    """Rows by Lance row address (``fragment << 32 | row``): the one use of a private Lance API."""
    return ds._take_rows(pa.array(addresses, pa.uint64()), columns=columns)


def _lance_error(tier: WarmTier, e: BaseException) -> LakeBufferError | None:
    """Lance and pyarrow raise OSError / ValueError / RuntimeError; the user sees a StorageError."""
    if isinstance(e, (OSError, ValueError, RuntimeError)):
        return StorageError(f"warm tier {getattr(tier, 'path', '')}: {type(e).__name__}: {e}")
    return None


@error_boundary(_lance_error)
class WarmTier:
    """Local Lance dataset of evicted batches (implements ``Tier``). One writer at a time."""

    name = "warm"

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        self.path = Path(path)
        self.schema = schema
        self._lock = threading.Lock()
        # one session with bounded caches for every version we open: Lance's defaults (GBs of
        # metadata cache) are sized for analytics, not for a tier that lives inside a RAM budget
        self._session = lance.Session(metadata_cache_size_bytes=WARM_METADATA_CACHE, index_cache_size_bytes=1 << 20)
        self._ds: lance.LanceDataset | None = None  # the version readers see
        if (self.path / "_versions").exists():
            self._ds = self._open_latest()
        self._latest = self._ds  # the newest version written (ahead of _ds until published)

    @property
    def dataset(self) -> lance.LanceDataset | None:
        """The latest committed version (a consistent snapshot for readers)."""
        return self._ds

    @property
    def version(self) -> int:
        return self._ds.version if self._ds is not None else -1

    def arrow_source(self) -> lance.LanceDataset | pa.Table:
        return self._ds if self._ds is not None else self.schema.empty_table()

    def stage(self, table: pa.Table, part: int | None = None) -> Staged:
        """Write ``table`` as one new fragment and commit it (``part`` is ignored: Lance numbers it).

        Returns where it lives, with the new dataset version as handle, which readers see only
        once the caller ``publish``es it (together with the index update), so no row is ever
        visible twice. ``checksum`` is the crc32 of the fragment's data files, in file order.
        """
        table = table.cast(self.schema) if not table.schema.equals(self.schema) else table
        with self._lock:
            mode = "append" if self._latest is not None else "create"
            prev_max = max((f.fragment_id for f in self._latest.get_fragments()), default=-1) if self._latest else -1
            ds = lance.write_dataset(
                table,
                str(self.path),
                schema=self.schema,
                mode=mode,
                max_rows_per_file=max(table.num_rows, 1),
                data_storage_version=WARM_STORAGE_VERSION,
                session=self._session,
            )
            new = [f for f in ds.get_fragments() if f.fragment_id > prev_max]
            if len(new) != 1:
                raise CorruptionError(f"expected one new Lance fragment in {self.path}, found {len(new)}")
            frag = new[0]
            files = tuple(df.path for df in frag.data_files())
            data_dir = self.path / "data"
            checksum = 0
            nbytes = 0
            for name in files:
                p = data_dir / name
                checksum = zlib.crc32(_crc32_file(p).to_bytes(4, "little"), checksum)
                nbytes += p.stat().st_size
            self._latest = ds
            return Staged(part=frag.fragment_id, rows=table.num_rows, nbytes=nbytes, files=files, checksum=checksum,
                          handle=ds)

    def _open_latest(self) -> lance.LanceDataset:
        return lance.dataset(str(self.path), session=self._session)

    def publish(self, staged: Staged) -> None:
        """Make the dataset version of ``staged`` the one readers use."""
        ds = staged.handle
        if self._ds is None or ds.version > self._ds.version:
            self._ds = ds

    def take(self, where: Location, columns: Sequence[str]) -> pa.Table:
        """Rows by (fragment, position), in the order given, only ``columns`` read from disk.

        Rows of many fragments are read in one Lance call (its I/O is scheduled together), not
        one call per fragment.
        """
        columns = list(columns)
        rows = where.row
        if len(rows) == 0:
            return self.schema.empty_table().select(columns)
        ds = self._ds
        if ds is None:
            raise CorruptionError(f"warm tier {self.path} has no dataset but the index points into it")
        frags = where.part
        addresses = (frags << np.int64(32)) | rows.astype(np.int64)
        try:
            out = _lance_take(ds, addresses, columns)
        except (OSError, ValueError, RuntimeError) as e:
            bad = self._first_unreadable(ds, np.unique(frags), columns)
            raise CorruptionError(f"cannot read warm fragment {bad} ({self._files_of(ds, bad)}): {e}") from e
        if out.num_rows != len(rows):
            raise CorruptionError(f"warm tier {self.path} returned {out.num_rows} of {len(rows)} rows asked for")
        return out

    def _first_unreadable(self, ds: lance.LanceDataset, fragment_ids: np.ndarray, columns: list[str]) -> int:
        """Which fragment a failed multi-fragment read tripped on (for the error message)."""
        for f in fragment_ids.tolist():
            try:
                _lance_take(ds, np.array([f << 32], np.int64), columns)
                ds.get_fragment(f).to_table(columns=columns)
            except Exception:  # noqa: BLE001 - this is the broken one
                return int(f)
        return int(fragment_ids[0])

    def _files_of(self, ds: lance.LanceDataset, fragment_id: int) -> str:
        try:
            return ", ".join(str(self.path / "data" / f.path) for f in ds.get_fragment(fragment_id).data_files())
        except Exception:  # noqa: BLE001 - only for the error message
            return f"{self.path}/data/?"

    def delete(self, keys: Sequence[str]) -> None:
        """Mark rows deleted (Lance deletion vectors); row addresses of other rows stay valid."""
        if not keys or self._ds is None:
            return
        with self._lock:
            quoted = ", ".join("'" + k.replace("'", "''") + "'" for k in keys)
            self._ds.delete(f"key IN ({quoted})")
            self._ds = self._latest = self._open_latest()

    def drop_fragments(self, fragment_ids: list[int]) -> None:
        """Remove whole fragments (orphans found by recovery) in one commit."""
        if not fragment_ids or self._ds is None:
            return
        with self._lock:
            op = lance.LanceOperation.Delete(updated_fragments=[], deleted_fragment_ids=list(fragment_ids), predicate="false")
            lance.LanceDataset.commit(str(self.path), op, read_version=self._ds.version)
            self._ds = self._latest = self._open_latest()

    def verify(self, fragment_id: int, files: tuple[str, ...], checksum: int) -> None:
        """Recompute a fragment's checksum; raise ``CorruptionError`` naming the file on mismatch."""
        crc = 0
        for name in files:
            p = self.path / "data" / name
            if not p.exists():
                raise CorruptionError(f"warm fragment {fragment_id}: data file {p} is missing")
            crc = zlib.crc32(_crc32_file(p).to_bytes(4, "little"), crc)
        if crc != checksum:
            raise CorruptionError(f"warm fragment {fragment_id}: data file {', '.join(files)} fails its checksum")

    def check_readable(self, columns: Sequence[str]) -> None:
        """Raise ``CorruptionError`` naming the first fragment whose ``columns`` cannot be read.

        A scan that failed inside DuckDB's read of this dataset asks this which fragment it was
        (one fragment read at a time: only on that error path).
        """
        ds = self._ds
        for frag in ds.get_fragments() if ds is not None else ():
            try:
                frag.to_table(columns=list(columns))
            except Exception as e:  # noqa: BLE001 - any failure to read is the answer
                raise CorruptionError(
                    f"cannot read warm fragment {frag.fragment_id} ({self._files_of(ds, frag.fragment_id)}): {e}; "
                    f"run `lakebuffer fsck --repair {self.path.parent.parent}`") from e

    def fragment_ids(self) -> list[int]:
        if self._ds is None:
            return []
        return [f.fragment_id for f in self._ds.get_fragments()]

    def stats(self) -> dict[str, int]:
        ds = self._ds
        if ds is None:
            return {"rows": 0, "bytes": 0, "fragments": 0}
        frags = ds.get_fragments()
        nbytes = 0
        for f in frags:  # sizes of the published version's files (not a racy directory listing)
            for df in f.data_files():
                nbytes += df.file_size_bytes or _size(self.path / "data" / df.path)
        return {"rows": ds.count_rows(), "bytes": nbytes, "fragments": len(frags)}


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0
