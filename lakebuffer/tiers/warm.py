"""The warm tier: evicted batches as fragments of one local Lance dataset.

One eviction is one Lance append, so one hot batch becomes one fragment, addressed by
``(fragment_id << 32) | row``. Lance gives what a replay buffer needs from disk: random ``take``
by row address with column projection (asking for ``reward`` never reads ``response_ids``),
deletion vectors for deletes, and a pyarrow-dataset face DuckDB scans with pushdown.

``WarmTier`` implements ``Tier``: a part is a Lance fragment. Random reads go by row address
through Lance's private ``_take_rows`` (the public ``take`` wants dataset-wide row offsets, which
shift whenever a fragment is dropped; addresses stay valid); that call sits behind ``_lance_take``.

Integrity: Lance files carry no checksums, so every fragment has a crc32 of its data files, taken when
it is written and kept in the index (``expect`` hands it back after a restart). Every path that
returns or copies warm rows checks a fragment the first time it touches it in this process: ``take``
(get, sample, snapshot) before reading, and the ``arrow_source`` DuckDB scans (sql, scan) when a scan
starts. A fragment stays verified while its files keep their (size, mtime); a changed file is checked
again. A fragment that fails raises ``CorruptionError`` naming it and the fix, every time it is read.
"""

from __future__ import annotations

import logging
import os
import threading
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lance
import numpy as np
import pyarrow as pa

from ..errors import CorruptionError, LakeBufferError, StorageError, error_boundary
from .base import Location, Staged
from .checksum import crc32_file, repair_hint

log = logging.getLogger("lakebuffer.warm")

#: Lance file format of the warm tier. Measured here on 2 cores with 2k-token rollouts: format 2.0
#: writes ~1.0 GB/s, the 2.2 default ~0.2 GB/s (its adaptive compression buys ~20% disk on random
#: token ids, not worth a 5x slower write-back for a local, short-lived tier).
WARM_STORAGE_VERSION = "2.0"
WARM_METADATA_CACHE = 16 << 20


def fragment_checksum(data_dir: Path, files: Sequence[str]) -> int:
    """The checksum the index keeps for a fragment: crc32 over its data files' crc32s, in file order."""
    crc = 0
    for name in files:
        crc = zlib.crc32(crc32_file(data_dir / name).to_bytes(4, "little"), crc)
    return crc


def _signature(data_dir: Path, files: Sequence[str]) -> tuple | None:
    """(size, mtime) of each file: what must stay the same for a verified fragment to stay verified."""
    try:
        return tuple((st.st_size, st.st_mtime_ns) for st in (os.stat(data_dir / n) for n in files))
    except OSError:
        return None


class _VerifiedLance(lance.LanceDataset):
    """The warm dataset as DuckDB sees it: a scan first verifies every fragment it may read.

    DuckDB calls ``scanner`` when a query actually reads the warm tier (not to bind a view), so a
    query over ``meta`` only never pays for it, and each fragment is checked once per process.
    """

    _check: Any = None

    @classmethod
    def wrap(cls, ds: lance.LanceDataset, check: Any) -> _VerifiedLance:
        out = cls.__new__(cls)
        out.__dict__.update(ds.__dict__)  # the same native dataset handle: no re-open
        out._check = check
        return out

    def scanner(self, *args: Any, **kwargs: Any) -> Any:
        frags = kwargs.get("fragments")
        ids = [f.fragment_id for f in (frags if frags is not None else self.get_fragments())]
        self._check(ids)
        return super().scanner(*args, **kwargs)


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
        self._expected: dict[int, tuple[tuple[str, ...], int | None]] = {}  # fragment -> (files, crc32)
        self._verified: dict[int, tuple] = {}  # fragment -> file signature when it last passed
        #: read-path verification on (the default, guarantee 3 of DESIGN.md); the benchmark switches it
        #: off only to measure what it costs (``lakebuffer bench --scenario verification``)
        self.verify_reads = True

    @property
    def buffer_dir(self) -> Path:
        """The buffer directory (``<dir>/warm/rollouts.lance``): what the fix in errors names."""
        return self.path.parent.parent

    @property
    def dataset(self) -> lance.LanceDataset | None:
        """The latest committed version (a consistent snapshot for readers)."""
        return self._ds

    @property
    def version(self) -> int:
        return self._ds.version if self._ds is not None else -1

    def arrow_source(self) -> lance.LanceDataset | pa.Table:
        """The published dataset for DuckDB; its scans verify the fragments first (see the module)."""
        return _VerifiedLance.wrap(self._ds, self.ensure_verified) if self._ds is not None else self.schema.empty_table()

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
            checksum = fragment_checksum(data_dir, files)
            nbytes = sum((data_dir / name).stat().st_size for name in files)
            # the crc was just taken from the bytes on disk: the fragment starts out verified
            self._expected[frag.fragment_id] = (files, checksum)
            sig = _signature(data_dir, files)
            if sig is not None:
                self._verified[frag.fragment_id] = sig
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
        self.ensure_verified(np.unique(frags).tolist())
        addresses = (frags << np.int64(32)) | rows.astype(np.int64)
        try:
            out = _lance_take(ds, addresses, columns)
        except (OSError, ValueError, RuntimeError) as e:
            bad = self._first_unreadable(ds, np.unique(frags), columns)
            raise CorruptionError(f"cannot read warm fragment {bad} ({self._files_of(ds, bad)}): {e}; "
                                  f"{repair_hint(self.buffer_dir)}") from e
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
            for f in fragment_ids:
                self._expected.pop(f, None)
                self._verified.pop(f, None)

    def verify(self, fragment_id: int, files: tuple[str, ...], checksum: int | None) -> None:
        """Recompute a fragment's checksum; raise ``CorruptionError`` naming the file on mismatch."""
        data_dir = self.path / "data"
        for name in files:
            if not (data_dir / name).exists():
                raise CorruptionError(f"warm fragment {fragment_id}: data file {data_dir / name} is missing; "
                                      f"{repair_hint(self.buffer_dir)}")
        if checksum is not None and fragment_checksum(data_dir, files) != checksum:
            raise CorruptionError(f"warm fragment {fragment_id}: data file {', '.join(files)} fails its checksum; "
                                  f"{repair_hint(self.buffer_dir)}")

    def expect(self, fragment_id: int, files: Sequence[str], checksum: int | None) -> None:
        """The checksum a fragment must have (from the index, after a restart); checked on first read."""
        self._expected[fragment_id] = (tuple(files), checksum)

    def ensure_verified(self, fragment_ids: Sequence[int]) -> None:
        """Verify each fragment not verified yet in this process (or whose files changed since).

        One ``stat`` per data file for a fragment already verified; a full crc32 read otherwise.
        A fragment the index never described cannot be verified and is refused.
        """
        if not self.verify_reads:
            return
        data_dir = self.path / "data"
        for f in fragment_ids:
            f = int(f)
            known = self._expected.get(f)
            if known is None:
                raise CorruptionError(f"warm fragment {f} has no checksum in the index (it is no batch's); "
                                      f"{repair_hint(self.buffer_dir)}")
            files, checksum = known
            sig = _signature(data_dir, files)
            if sig is not None and self._verified.get(f) == sig:
                continue
            self.verify(f, files, checksum)
            self._verified[f] = sig

    def fragment_keys(self, fragment_id: int) -> list[str]:
        """The live keys of one fragment (recovery reads an orphan's keys before deciding its fate)."""
        ds = self._latest if self._latest is not None else self._ds
        if ds is None:
            return []
        return ds.get_fragment(fragment_id).to_table(columns=["key"]).column("key").to_pylist()

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
