"""The warm tier: evicted batches as memory-mapped Arrow IPC files, one file per fragment.

Why IPC and not Lance (issue 17, measured side by side by ``benchmarks/warm_get.py``; 2 GB under a
128 MB budget, 209 fragments, 240 interleaved calls each, on the shared 2-core machine): ``get`` of
256 random rows' ``response_ids`` including the index lookup and the per-call check costs 4.8-6 ms
p50 from IPC files against 41-52 ms from Lance 2.1 and 49-66 ms from Lance 2.0 (today's buffer
``get``: 71-93 ms); writing a fragment costs ~3 s of CPU per GB in IPC against 4.4 (Lance 2.0) and
6.8 (2.1). Lance's random access is built for remote object stores and large scans; a local tier
that sits in the page cache is served best by a memory map and a zero-copy gather. See
BENCHMARKS.md, "Warm tier for get (#17)".

Layout: ``<buffer>/warm/<fragment:016d>.arrow``, each in the WAL's segment format (an Arrow IPC file
followed by an 8-byte CRC32C footer, ``tiers.wal``). So a WAL segment *is* a warm fragment: write-back
promotes a pushed batch by hard-linking its segment into the tier (``adopt``): every byte is written
once on ingest. A fragment holds whole rows, keys and metadata included, so fsck can rebuild the index
from the files alone.

Reads: ``take`` maps each fragment once (at most ``MAX_OPEN_MAPS`` open, oldest dropped first;
pages are the page cache's, not the process's anonymous memory) and gathers the asked rows as
one-row zero-copy slices joined by one native concat per column (``base.gather``). Pages fault in as
rows are read; ``PREFILL_MAPS`` trades total RSS for first-read latency (see there).
``arrow_source`` is a pyarrow dataset over the same maps for DuckDB.

Integrity (issue 15, guarantee 2: reads never return data failing its checksum): a fragment is
checked against its own CRC32C footer the first time this process reads it (``take``, or a DuckDB
scan when it starts), and stays verified while its file keeps its (size, mtime); a changed file is
checked again. A fragment this process wrote starts verified (its CRC32C was taken from the bytes
on disk), and so does an adopted WAL segment unchanged since this process wrote it; any other is
checked when adopted.
A fragment that fails raises ``CorruptionError`` naming the file and the fix, every time it is read.

Deletes rewrite the fragment's ``key`` column with the row slots kept (so row positions, which the
index holds, never move): a deleted row's key becomes ``""`` (never a valid key) and scans skip it.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds
from crc32c import crc32c

from ..errors import CorruptionError, LakeBufferError, StorageError, error_boundary
from .base import Location, ScannedDataset, Staged, gather
from .checksum import repair_hint
from .wal import _FOOTER, _MAGIC, WriteAheadLog, fsync_path

log = logging.getLogger("lakebuffer.warm")

#: open memory maps kept (one per fragment); well under Linux's default 65,530 maps per process
MAX_OPEN_MAPS = 4096
#: the key a deleted row's slot carries inside a fragment (keys are never empty: ingest refuses "")
DELETED_KEY = ""


def warm_path(buffer_dir: Path) -> Path:
    """Where the warm fragments of buffer ``buffer_dir`` live."""
    return Path(buffer_dir) / "warm"


def has_fragments(buffer_dir: Path) -> bool:
    d = warm_path(buffer_dir)
    return d.is_dir() and any(p.suffix == ".arrow" for p in d.iterdir())


def _signature(path: Path | str) -> tuple[int, int] | None:
    """(size, mtime): what must stay the same for a verified fragment to stay verified."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


#: ``madvise(MADV_POPULATE_READ)`` (Linux 5.14+; Python 3.11's ``mmap`` lacks the name): fill a new
#: map's page tables from the page cache in one call
_MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)
#: Prefill a fragment's map when write-back creates it, off by default. Measured (issue 17, 200 MB
#: under a 16 MB budget on the loaded machine): `get` of 256 random rows 3-6 ms with it against
#: ~30 ms without, as mapped pages stay in the page cache; but every prefilled page counts in the
#: process's total RSS (file-backed, reclaimable), which the budget tests of #5/#7 bound: pushing
#: 10x a 64 MB budget grew total RSS by 675 MB with it.
PREFILL_MAPS = False


def _map(path: Path | str, populate: bool, checksum: bool) -> tuple[pa.Buffer, int | None]:
    """The whole file as a zero-copy Arrow buffer over a read-only map, and the CRC32C of all but its
    8-byte footer if asked. The checksum reads through a second, short-lived map of the same open
    file, so checking a fragment does not leave all its pages mapped (in RSS) for the process's life.
    """
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size == 0:
            return pa.py_buffer(b""), None
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        crc = None
        if checksum and size >= _FOOTER.size:
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as tmp, memoryview(tmp) as view:
                crc = crc32c(view[: size - _FOOTER.size])
    if populate:
        try:
            mm.madvise(_MADV_POPULATE_READ)
        except OSError:  # an older kernel: pages fault in on first touch instead
            pass
    return pa.py_buffer(mm), crc


@dataclass
class _Mapped:
    """One fragment, memory-mapped: its record batches and the first row of each."""

    sig: tuple[int, int]
    table: pa.Table
    batches: list[pa.RecordBatch]
    starts: np.ndarray  # first row of each batch, then the row count


def _warm_error(tier: WarmTier, e: BaseException) -> LakeBufferError | None:
    """pyarrow and the OS raise OSError / ValueError / ArrowException; the user sees a StorageError."""
    if isinstance(e, (OSError, ValueError, RuntimeError, pa.ArrowException)):
        return StorageError(f"warm tier {getattr(tier, 'path', '')}: {type(e).__name__}: {e}")
    return None


class _WarmDataset(ScannedDataset):
    """The warm fragments as DuckDB sees them: a scan first verifies and maps every fragment.

    DuckDB calls ``scanner`` when a query actually reads the warm tier (not to bind a view), so a
    query over ``meta`` only never pays for it. Deleted row slots are filtered out here.
    """

    _tier: Any = None
    _ids: tuple[int, ...] = ()

    @classmethod
    def over(cls, tier: WarmTier, ids: Sequence[int]) -> _WarmDataset:
        out = cls(tier.schema.empty_table())
        out._tier, out._ids = tier, tuple(ids)
        return out

    def scanner(self, *args: Any, **kwargs: Any) -> Any:
        tier: WarmTier = self._tier
        tables = [tier.mapped(f).table for f in self._ids]
        real = pds.dataset(tables or [tier.schema.empty_table()], schema=tier.schema)
        if tier.has_deletes(self._ids):
            live = pc.field("key") != pa.scalar(DELETED_KEY)
            kwargs["filter"] = live if kwargs.get("filter") is None else kwargs["filter"] & live
        return real.scanner(*args, **kwargs)


@error_boundary(_warm_error)
class WarmTier:
    """Memory-mapped Arrow IPC fragments of evicted batches (implements ``Tier``). One writer at a time."""

    name = "warm"

    def __init__(self, path: Path, schema: pa.Schema, sync: bool = False) -> None:
        self.path = Path(path)
        self.schema = schema
        self._sync = sync
        self._dir = str(self.path)
        if (self.path / "rollouts.lance").exists():
            raise StorageError(f"{self.path.parent} holds a Lance warm tier (lakebuffer before issue 17): open a new "
                               "directory with the same lake and run_id to restore the run from its lake")
        self._writer: WriteAheadLog | None = None  # created on the first write: fsck only reads
        self._lock = threading.Lock()  # writers (stage, delete, drop)
        self._maps_lock = threading.Lock()
        self._maps: dict[int, _Mapped] = {}
        self._verified: dict[int, tuple[int, int]] = {}  # fragment -> signature when it last passed
        self._counts: dict[int, tuple[int, int, int]] = {}  # fragment -> (rows, live rows, bytes)
        self._published: set[int] = set(self._ids_on_disk())
        self._next = max(self._published, default=-1) + 1
        self._version = 0
        #: read-path verification on (the default, guarantee 3 of DESIGN.md); the benchmark switches it
        #: off only to measure what it costs (``lakebuffer bench --scenario verification``)
        self.verify_reads = True
        self.prefill_maps = PREFILL_MAPS

    @property
    def buffer_dir(self) -> Path:
        """The buffer directory (``<dir>/warm``): what the fix in errors names."""
        return self.path.parent

    @property
    def version(self) -> int:
        return self._version

    @property
    def _files(self) -> WriteAheadLog:
        """The writer of fragment files: the WAL's format and its atomic tmp + rename write."""
        if self._writer is None:
            self._writer = WriteAheadLog(self.path, sync=self._sync)
        return self._writer

    def _ids_on_disk(self) -> list[int]:
        return self._files.ids() if self.path.is_dir() else []

    def remove_torn(self) -> int:
        """Delete ``.tmp`` leftovers of torn fragment writes; only while no writer runs (open)."""
        return self._files.remove_torn() if self.path.is_dir() else 0

    def file_of(self, fragment_id: int) -> Path:
        return self.path / f"{int(fragment_id):016d}.arrow"

    # writing -----------------------------------------------------------------------------
    def _new_id(self) -> int:
        with self._lock:
            f, self._next = self._next, self._next + 1
            return f

    def stage(self, table: pa.Table, part: int | None = None) -> Staged:
        """Write ``table`` as one new fragment file, invisible until ``publish`` (``part`` is ignored)."""
        table = table.cast(self.schema) if not table.schema.equals(self.schema) else table
        f = self._new_id()
        self._files.write(f, table)  # tmp + CRC32C footer + rename: a torn write never looks like a fragment
        return self._entered(f, table.num_rows)

    def adopt(self, segment: Path, rows: int, checked: tuple[int, int] | None = None) -> Staged:
        """Promote a WAL segment to a new fragment by a hard link: the batch's bytes are not written again.

        ``checked`` is the (size, mtime) the segment had when this process wrote it and took its CRC32C
        from the bytes on disk (``WriteAheadLog.written``): while the file still has it, the fragment
        starts out verified, as one this tier wrote does. Otherwise it is checked here, in the
        write-back thread. The WAL's own name is removed by the caller afterwards.
        """
        f = self._new_id()
        target = self.file_of(f)
        self.path.mkdir(parents=True, exist_ok=True)
        os.link(segment, target)
        if self._sync:
            fsync_path(self.path)
        try:
            if checked is None or _signature(target) != checked:
                self._verify_file(f, force=True)
        except BaseException:
            target.unlink(missing_ok=True)
            raise
        return self._entered(f, rows)

    def _entered(self, f: int, rows: int) -> Staged:
        path = self.file_of(f)
        sig = _signature(path)
        if sig is not None:
            self._verified[f] = sig  # the writer's CRC32C was taken from the bytes on disk
        nbytes = sig[0] if sig else 0
        self._counts[f] = (rows, rows, nbytes)
        if sig is not None and self.prefill_maps:
            self._mapped(f, fresh=True)  # map it here (write-back's thread), not in the first reader's
        return Staged(part=f, rows=rows, nbytes=nbytes, files=(path.name,), checksum=None, handle=f)

    def publish(self, staged: Staged) -> None:
        """Make a staged fragment visible to ``arrow_source`` and ``stats``."""
        with self._lock:
            self._published.add(int(staged.part))
            self._version += 1

    # reading -----------------------------------------------------------------------------
    def _verify_file(self, f: int, force: bool = False, fresh: bool = False) -> _Mapped:
        """Map fragment ``f``, checking its CRC32C footer unless this process already did (or ``force``).

        ``fresh``: the file was just written or linked here (its pages are in the page cache).
        """
        path = self.file_of(f)
        sig = _signature(path)
        if sig is None:
            raise CorruptionError(f"warm fragment {f}: file {path} is missing; {repair_hint(self.buffer_dir)}")
        check = force or (self.verify_reads and self._verified.get(f) != sig)
        try:
            buf, crc = _map(path, populate=fresh and self.prefill_maps, checksum=check)
        except (OSError, ValueError) as e:
            raise CorruptionError(f"warm fragment {f}: cannot map {path} ({e}); {repair_hint(self.buffer_dir)}") from e
        n = buf.size
        if n < _FOOTER.size or buf[n - 4 :].to_pybytes() != _MAGIC:
            raise CorruptionError(f"warm fragment {f}: file {path} has no checksum footer (torn or not a fragment); "
                                  f"{repair_hint(self.buffer_dir)}")
        want, _ = _FOOTER.unpack(buf[n - _FOOTER.size :].to_pybytes())
        body = buf.slice(0, n - _FOOTER.size)
        if check:
            if crc != want:
                raise CorruptionError(f"warm fragment {f}: file {path} fails its checksum; "
                                      f"{repair_hint(self.buffer_dir)}")
            self._verified[f] = sig
        try:
            table = pa.ipc.open_file(pa.BufferReader(body)).read_all()
        except (OSError, pa.ArrowInvalid) as e:
            raise CorruptionError(f"warm fragment {f}: file {path} cannot be decoded ({e}); "
                                  f"{repair_hint(self.buffer_dir)}") from e
        if not table.schema.equals(self.schema):
            table = table.cast(self.schema)
        batches = table.to_batches()
        starts = np.zeros(len(batches) + 1, np.int64)
        np.cumsum([b.num_rows for b in batches], out=starts[1:])
        return _Mapped(sig, table, batches, starts)

    def mapped(self, f: int) -> _Mapped:
        """Fragment ``f`` mapped and verified (one ``stat`` when it already is)."""
        return self._mapped(int(f))

    def _mapped(self, f: int, fresh: bool = False) -> _Mapped:
        sig = _signature(f"{self._dir}/{f:016d}.arrow")  # a str path: pathlib costs more than the stat
        m = self._maps.get(f)  # lock-free read (a dict get is atomic); writers below hold the lock
        if m is not None and m.sig == sig and (not self.verify_reads or self._verified.get(f) == sig):
            return m
        m = self._verify_file(f, fresh=fresh)
        with self._maps_lock:
            self._maps[f] = m
            while len(self._maps) > MAX_OPEN_MAPS:  # the oldest mapped goes first (unmapped when unused)
                self._maps.pop(next(iter(self._maps)))
        return m

    def take(self, where: Location, columns: Sequence[str]) -> pa.Table:
        """Rows by (fragment, position), in the order given, with only ``columns``.

        Each asked row is a zero-copy one-row slice of its mapped fragment; one native concat per
        column joins them (``base.gather``; a pyarrow ``take`` per fragment costs ~20x more at 256
        random rows, measured by ``benchmarks/warm_get.py``).
        """
        columns = list(columns)
        schema = pa.schema([self.schema.field(c) for c in columns])
        if len(where) == 0:
            return schema.empty_table()
        uniq, inv = np.unique(where.part, return_inverse=True)
        maps = [self._mapped(f) for f in uniq.tolist()]
        rows = where.row.astype(np.int64)
        n_rows = np.array([m.starts[-1] for m in maps], np.int64)
        if (rows < 0).any() or (rows >= n_rows[inv]).any():
            bad = int(uniq[inv[np.flatnonzero((rows < 0) | (rows >= n_rows[inv]))[0]]])
            raise CorruptionError(f"warm fragment {bad} ({self.file_of(bad)}) has fewer rows than the index says; "
                                  f"{repair_hint(self.buffer_dir)}")
        single = all(len(m.batches) == 1 for m in maps)
        return gather([m.batches[0] for m in maps] if single else [m.table for m in maps], inv, rows, columns)

    def arrow_source(self) -> pds.Dataset:
        """The published fragments for DuckDB; a scan verifies them first (see the module)."""
        with self._lock:
            ids = sorted(self._published)
        return _WarmDataset.over(self, ids)

    def has_deletes(self, ids: Sequence[int]) -> bool:
        return any(self._counts_of(f)[1] != self._counts_of(f)[0] for f in ids)

    # deletes and drops -------------------------------------------------------------------
    def delete(self, keys: Sequence[str], parts: Sequence[int] | None = None) -> None:
        """Hide rows by key: their fragments are rewritten with those keys blanked (rows keep their place).

        ``parts`` names the fragments that may hold them (all published ones if None).
        """
        if not keys:
            return
        wanted = pa.array(list(keys), pa.string())
        with self._lock:
            targets = sorted(self._published if parts is None else set(int(p) for p in parts) & self._published)
        for f in targets:
            m = self.mapped(f)
            key = m.table.column("key")
            hit = pc.is_in(key, value_set=wanted)
            if not pc.any(hit).as_py():
                continue
            blanked = pc.if_else(hit, pa.scalar(DELETED_KEY, pa.string()), key)
            table = m.table.set_column(self.schema.get_field_index("key"), self.schema.field("key"), blanked)
            with self._lock:
                self._files.write(f, table)  # tmp + rename: readers holding the old map keep a consistent file
                with self._maps_lock:
                    self._maps.pop(f, None)
                self._verified.pop(f, None)
                self._entered(f, table.num_rows)
                live = table.num_rows - pc.sum(pc.equal(blanked, DELETED_KEY)).as_py()
                rows, _, nbytes = self._counts[f]
                self._counts[f] = (rows, live, nbytes)
                self._version += 1

    def drop_fragments(self, fragment_ids: list[int]) -> None:
        """Remove whole fragments (orphans found by recovery, fragments fsck replaces)."""
        if not fragment_ids:
            return
        with self._lock:
            for f in fragment_ids:
                f = int(f)
                self.file_of(f).unlink(missing_ok=True)
                self._published.discard(f)
                with self._maps_lock:
                    self._maps.pop(f, None)
                self._verified.pop(f, None)
                self._counts.pop(f, None)
            self._version += 1

    # integrity ---------------------------------------------------------------------------
    def verify(self, fragment_id: int, files: Sequence[str] = (), checksum: int | None = None) -> None:
        """Check a fragment against its own CRC32C footer now; ``CorruptionError`` naming the file.

        ``files``/``checksum`` (what the index recorded) are accepted for the older callers: the
        fragment carries its own checksum, which stays right across delete rewrites.
        """
        self._verified.pop(int(fragment_id), None)
        with self._maps_lock:
            self._maps.pop(int(fragment_id), None)
        self._verify_file(int(fragment_id), force=True)

    def expect(self, fragment_id: int, files: Sequence[str], checksum: int | None) -> None:
        """Kept for callers that hand over the index's record: a fragment's checksum is its footer."""

    def ensure_verified(self, fragment_ids: Sequence[int]) -> None:
        """Verify each fragment not verified yet in this process (or whose file changed since)."""
        for f in fragment_ids:
            self.mapped(int(f))

    def fragment_keys(self, fragment_id: int) -> list[str]:
        """The live keys of one fragment (recovery reads an orphan's keys before deciding its fate)."""
        key = self.mapped(fragment_id).table.column("key")
        return key.filter(pc.not_equal(key, DELETED_KEY)).to_pylist()

    def check_readable(self, columns: Sequence[str]) -> None:
        """Raise ``CorruptionError`` naming the first fragment that cannot be read (a failed scan's probe)."""
        for f in self.fragment_ids():
            self.mapped(f)

    def fragment_ids(self) -> list[int]:
        with self._lock:
            return sorted(self._published)

    def _counts_of(self, f: int) -> tuple[int, int, int]:
        c = self._counts.get(f)
        if c is None:  # a fragment from before this process: rows from its IPC metadata, no checksum pass
            path = self.file_of(f)
            try:
                body = pa.memory_map(str(path)).read_buffer()
                key = pa.ipc.open_file(pa.BufferReader(body.slice(0, body.size - _FOOTER.size))).read_all().column("key")
                rows = len(key)
                live = rows - pc.sum(pc.equal(key, DELETED_KEY)).as_py() if rows else 0
                c = (rows, live, body.size)
            except (OSError, pa.ArrowInvalid):
                c = (0, 0, 0)  # unreadable: reads of it raise CorruptionError; stats just cannot count it
            self._counts[f] = c
        return c

    def fragment_bytes(self, f: int) -> int:
        """Bytes of fragment ``f`` on disk."""
        return self._counts_of(int(f))[2]

    def stats(self) -> dict[str, int]:
        ids = self.fragment_ids()
        counts = [self._counts_of(f) for f in ids]
        return {"rows": sum(c[1] for c in counts), "bytes": sum(c[2] for c in counts), "fragments": len(ids)}
