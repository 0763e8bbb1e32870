"""The write-ahead log: one Arrow IPC segment per hot batch, so an acknowledged push survives kill -9.

A segment is written to ``<id>.arrow.tmp`` and renamed into place, so a torn write never looks
like a segment. Arrow IPC has no checksum of its own, so every segment ends with a checksum footer
(``segfooter``: a CRC32C per 16 KiB chunk of the IPC bytes; ``LBW1`` segments of older releases carry
one CRC32C) that ``read`` checks: recovery and fsck never serve a flipped byte. Segments without a
footer (written before it existed) are read unchecked;
 the index entry for the batch is written after the rename, so a segment with no
index entry is a push that was never acknowledged (recovery deletes it). A segment is removed as
soon as its batch is in the warm tier.

Spare files: a removed segment that nothing else links (a warm fragment adopts a segment by a hard
link: that one is only unlinked) is kept, up to ``SPARE_FILES`` / ``SPARE_BYTES``, as ``*.walspare``,
and the next segment is written over it (renamed to its ``.tmp`` first, then cut to its own length).
Why: ext4 writes into a file's allocated blocks several times faster than it allocates new ones
(``benchmarks/wal_spares.py``: 2 MB in 0.07 vs 0.32 ms; a TransferQueue-shaped push 0.91-0.99x).
Spares hold no acknowledged rows (their bytes are the removed segments'), count in ``nbytes`` (the
disk budget), are dropped first when the disk is short (``drop_spares``), at close, and at open
(``remove_torn``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..errors import CorruptionError, LakeBufferError, StorageError, disk_full, error_boundary, is_disk_full
from . import segfooter
from .checksum import of_mapped_file, repair_hint

#: removed segments kept to be written over (at most this many files, and bytes in all); 0: none
SPARE_FILES = 4
SPARE_BYTES = 64 << 20
SPARE_SUFFIX = ".walspare"


def fsync_path(path: Path | str) -> None:
    """fsync a file or a directory by path (a directory's fsync makes a rename in it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _wal_error(wal: WriteAheadLog, e: BaseException) -> LakeBufferError | None:
    """An OS / Arrow error writing or listing segments: ``DiskFullError`` on ENOSPC, else ``StorageError``."""
    if isinstance(e, (OSError, ValueError, pa.ArrowException)):
        where = f"writing {getattr(wal, 'path', '')}"
        if is_disk_full(e):
            return disk_full(where, e)
        return StorageError(f"{where}: {type(e).__name__}: {e} (free disk space or fix the directory, then reopen)")
    return None


@error_boundary(_wal_error)
class WriteAheadLog:
    def __init__(self, path: Path, sync: bool = False, spares: bool = False) -> None:
        """``spares``: keep removed segments to write over (the live buffer's WAL; fsck's does not)."""
        self.path = Path(path)
        self.keeps_spares = spares
        self.spare_limit_bytes = SPARE_BYTES  # the buffer lowers it under a small disk budget
        self.path.mkdir(parents=True, exist_ok=True)
        self.sync = sync
        #: batch id -> (size, mtime) of a segment this process wrote and checksummed from disk: write-back
        #: promotes such a segment to a warm fragment without reading it again while it is unchanged
        self.written: dict[int, tuple[int, int]] = {}
        #: batch id -> bytes of each complete segment, kept by ``write`` / ``remove`` once ``nbytes`` has
        #: listed the directory (the disk budget asks twice a push; the listing cost a push ~10%)
        self._sizes: dict[int, int] | None = None
        self._changes = 0  # segments written or removed: a listing taken across one is not kept
        self._sizes_lock = threading.Lock()
        self._spares: list[tuple[Path, int]] = []  # (path, bytes) of removed segments to write over
        self._spare_bytes = 0
        self._spare_names = 0
        self._spares_lock = threading.Lock()

    def _segment(self, batch_id: int) -> Path:
        return self.path / f"{batch_id:016d}.arrow"

    def write(self, batch_id: int, table: pa.Table | Iterable[pa.RecordBatch], schema: pa.Schema | None = None) -> None:
        """Write a segment from a table, or from record batches of ``schema`` (streamed: one in memory)."""
        final = self._segment(batch_id)
        tmp = final.with_suffix(".arrow.tmp")
        try:
            self._write(final, tmp, table, schema)
        except BaseException:
            tmp.unlink(missing_ok=True)  # a failed write (a full disk) leaves nothing behind
            raise
        st = os.stat(final)
        self.written[batch_id] = (st.st_size, st.st_mtime_ns)
        with self._sizes_lock:
            self._changes += 1
            if self._sizes is not None:
                self._sizes[batch_id] = st.st_size
        if self.sync:
            fsync_path(self.path)

    def _write(self, final: Path, tmp: Path, table: pa.Table | Iterable[pa.RecordBatch], schema: pa.Schema | None) -> None:
        if self._take_spare(tmp):  # written over an old segment's blocks, then cut to this one's length
            with open(tmp, "r+b", buffering=0) as raw:
                _write_ipc(pa.PythonFile(raw, mode="w"), table, schema)
                raw.truncate(raw.tell())
        else:
            with pa.OSFile(str(tmp), "wb") as f:  # native writes: no Python bytes copies per buffer
                _write_ipc(f, table, schema)
        footer = of_mapped_file(segfooter.encode, tmp)  # read back from the page cache: no second copy in RAM
        with open(tmp, "ab") as f:
            f.write(footer)
        if self.sync:
            fsync_path(tmp)
        os.replace(tmp, final)

    def read(self, batch_id: int) -> pa.Table:
        """The segment's rows, after checking its CRC32C (``CorruptionError`` naming it and the fix)."""
        return self.read_path(self._segment(batch_id))

    def read_path(self, seg: Path) -> pa.Table:
        """Read and check one segment file (also one moved aside into quarantine)."""
        try:  # read, not mapped: a segment another program truncates is an error here, not SIGBUS
            with pa.OSFile(str(seg)) as src:
                buf = src.read_buffer()
        except OSError as e:
            raise CorruptionError(f"WAL segment {seg} is missing ({e}); {repair_hint(self.path.parent)}") from e
        try:
            footer = segfooter.parse_buffer(memoryview(buf))
        except segfooter.FooterError as e:
            raise CorruptionError(f"WAL segment {seg} has {e}; {repair_hint(self.path.parent)}") from e
        if footer is not None:  # (a segment without one was written before footers existed: read unchecked)
            buf = buf.slice(0, footer.ipc_end)
            if footer.check(memoryview(buf)) is not None:
                raise CorruptionError(f"WAL segment {seg} fails its checksum; {repair_hint(self.path.parent)}")
        try:
            return pa.ipc.open_file(pa.BufferReader(buf)).read_all()
        except (OSError, pa.ArrowInvalid) as e:
            raise CorruptionError(f"WAL segment {seg} is torn ({e}); {repair_hint(self.path.parent)}") from e

    def segment_path(self, batch_id: int) -> Path:
        return self._segment(batch_id)

    def remove(self, batch_id: int) -> None:
        self.written.pop(batch_id, None)
        seg = self._segment(batch_id)
        if not self._keep_spare(seg):
            seg.unlink(missing_ok=True)
        self.forget(batch_id)

    # spare files ---------------------------------------------------------------------------
    def _keep_spare(self, seg: Path) -> bool:
        """Keep a removed segment as a spare (True), unless the pool is full or another name links
        its bytes (a warm fragment adopted it: writing over it would change that fragment)."""
        if SPARE_FILES <= 0 or not self.keeps_spares:
            return False
        with self._spares_lock:
            if len(self._spares) >= SPARE_FILES:
                return False
            try:
                st = os.stat(seg)
            except FileNotFoundError:
                return True  # nothing left to remove
            if st.st_nlink != 1 or self._spare_bytes + st.st_size > self.spare_limit_bytes:
                return False
            self._spare_names += 1
            spare = self.path / f"{self._spare_names:08d}{SPARE_SUFFIX}"
            try:
                os.rename(seg, spare)
            except FileNotFoundError:
                return True
            self._spares.append((spare, st.st_size))
            self._spare_bytes += st.st_size
        return True

    def _take_spare(self, tmp: Path) -> bool:
        """Rename a spare to ``tmp`` (True), or False when there is none."""
        while True:
            with self._spares_lock:
                if not self._spares:
                    return False
                spare, size = self._spares.pop()
                self._spare_bytes -= size
            try:
                os.rename(spare, tmp)
                return True
            except FileNotFoundError:  # removed from outside: try the next one
                continue

    def drop_spares(self) -> int:
        """Delete the spare files (the disk is short, or the buffer closes); the bytes freed."""
        with self._spares_lock:
            spares, self._spares = self._spares, []
            freed, self._spare_bytes = self._spare_bytes, 0
        for spare, _size in spares:
            spare.unlink(missing_ok=True)
        return freed

    def spare_bytes(self) -> int:
        with self._spares_lock:
            return self._spare_bytes

    def forget(self, batch_id: int) -> None:
        """A segment left the directory another way (moved aside): stop counting its bytes."""
        with self._sizes_lock:
            self._changes += 1
            if self._sizes is not None:
                self._sizes.pop(batch_id, None)

    def ids(self) -> list[int]:
        """Batch ids of complete segments (read-only: a ``.tmp`` may be a push writing right now)."""
        return sorted(int(p.stem) for p in self.path.iterdir() if p.suffix == ".arrow" and p.stem.isdigit())

    def remove_torn(self) -> int:
        """Delete ``.tmp`` leftovers of torn writes; only while no writer runs (open, fsck --repair)."""
        torn = list(self.path.glob("*.arrow.tmp")) + list(self.path.glob(f"*{SPARE_SUFFIX}"))
        for p in torn:
            p.unlink(missing_ok=True)
        return len(torn)

    def nbytes(self) -> int:
        """Bytes of the complete segments: listed once, then kept as segments are written and removed."""
        with self._sizes_lock:
            if self._sizes is not None:
                return sum(self._sizes.values()) + self.spare_bytes()
            changes = self._changes
        sizes = {}
        for bid in self.ids():
            try:
                sizes[bid] = self._segment(bid).stat().st_size
            except FileNotFoundError:  # removed by a write-back meanwhile
                pass
        with self._sizes_lock:
            if self._sizes is None and self._changes == changes:
                self._sizes = sizes
        return sum(sizes.values()) + self.spare_bytes()


def _write_ipc(sink: Any, table: pa.Table | Iterable[pa.RecordBatch], schema: pa.Schema | None) -> None:
    """A table, or record batches of ``schema`` (one in memory at a time), as an Arrow IPC file."""
    if isinstance(table, pa.Table):
        with pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
    else:
        assert schema is not None
        with pa.ipc.new_file(sink, schema) as w:
            for b in table:
                w.write_batch(b)
