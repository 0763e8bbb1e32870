"""The warm tier: evicted batches as Arrow IPC files, one file per fragment.

Why IPC and not Lance (issue 17, measured side by side by ``benchmarks/warm_get.py``; 2 GB under a
128 MB budget, 209 fragments, 240 interleaved calls each, on the shared 2-core machine): ``get`` of
256 random rows' ``response_ids`` including the index lookup and the per-call check costs 4.8-6 ms
p50 from IPC files against 41-52 ms from Lance 2.1 and 49-66 ms from Lance 2.0 (today's buffer
``get``: 71-93 ms); writing a fragment costs ~3 s of CPU per GB in IPC against 4.4 (Lance 2.0) and
6.8 (2.1). Lance's random access is built for remote object stores and large scans; a local tier
that sits in the page cache is served best by reading only the asked rows' bytes (issue 17 used a
memory map; issue 24 replaced it with positioned reads, below). See BENCHMARKS.md, "Warm tier for get
(#17)" and "Warm reads without a memory map (#24)".

Layout: ``<buffer>/warm/<fragment:016d>.arrow``, each in the WAL's segment format (an Arrow IPC file
followed by an 8-byte CRC32C footer, ``tiers.wal``). So a WAL segment *is* a warm fragment: write-back
promotes a pushed batch by hard-linking its segment into the tier (``adopt``): every byte is written
once on ingest. A fragment holds whole rows, keys and metadata included, so fsck can rebuild the index
from the files alone.

Reads (issue 24): no memory map. A mapped page of a file another program truncates kills the
process with SIGBUS, and no check before the read can prevent it; so ``take`` reads only the asked
rows' bytes of the asked columns with ``pread`` into the output's buffers (``tiers.ipcread``), and a
scan (``arrow_source``, DuckDB) reads each record batch's asked columns with pyarrow's IPC reader
over a plain file, one batch at a time. After every read the open file's (inode, size, mtime) must
still be the verified one (a write changes mtime before it changes a byte): a file changed under a
read is checked again and read once more, a damaged one raises ``CorruptionError``. Open files are
kept (at most ``MAX_OPEN_FILES``), each with its parsed IPC layout.

Integrity (issue 15, guarantee 2: reads never return data failing its checksum): a fragment is
checked against its own CRC32C footer the first time this process reads it (``take``, or a DuckDB
scan when it starts), and stays verified while its file keeps its (inode, size, mtime); a changed
file is checked again (``warmfile``: a file modified within ``RACY_NS`` of its check is checked again
next time). A fragment this process wrote starts verified (its CRC32C was taken from the bytes on disk),
and so does an adopted WAL segment unchanged since this process wrote it; write-back checks any other
when it adopts it, while a reopen adopts a previous process's segments unread (``adopt(check_now=False)``):
those are checked like every fragment a reopen finds, chunk by chunk as takes read them.
A fragment that fails raises ``CorruptionError`` naming the file and the fix, every time it is read.

Deletes rewrite the fragment's ``key`` column with the row slots kept (so row positions, which the
index holds, never move): a deleted row's key becomes ``""`` (never a valid key) and scans skip it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds

from ..errors import CorruptionError, LakeBufferError, StorageError, disk_full, error_boundary, is_disk_full
from . import segfooter
from .base import Location, Staged, gather
from .checksum import repair_hint
from .ipcread import LayoutError, one_run, read_layout, read_runs, split
from .wal import WriteAheadLog, fsync_path
from .warmfile import OpenFragment, Sig, open_fragment, path_sig
from .warmscan import DELETED_KEY, WarmDataset

log = logging.getLogger("lakebuffer.warm")

#: a scan reads a fragment in record batches of about this many bytes of the asked columns
SCAN_CHUNK_BYTES = 1 << 20
#: open fragment files kept (with their parsed layout); well under a default limit of 1,024 descriptors
MAX_OPEN_FILES = 256


def warm_path(buffer_dir: Path) -> Path:
    """Where the warm fragments of buffer ``buffer_dir`` live."""
    return Path(buffer_dir) / "warm"


def has_fragments(buffer_dir: Path) -> bool:
    d = warm_path(buffer_dir)
    return d.is_dir() and any(p.suffix == ".arrow" for p in d.iterdir())


def _unique(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(a, return_inverse=True)`` in a few vectorised steps (numpy's costs ~30 us at 256 values)."""
    a = np.asarray(a, np.int64)
    s = np.sort(a)
    new = np.ones(len(s), bool)
    new[1:] = s[1:] != s[:-1]
    uniq = s[new]
    return uniq, np.searchsorted(uniq, a)


class _Changed(Exception):
    """A fragment's file changed while it was read: read it again (once) after checking it again."""


def _warm_error(tier: WarmTier, e: BaseException) -> LakeBufferError | None:
    """pyarrow and the OS raise OSError / ValueError / ArrowException; the user sees a StorageError."""
    if isinstance(e, (OSError, ValueError, RuntimeError, pa.ArrowException)):
        if is_disk_full(e):
            return disk_full(f"warm tier {getattr(tier, 'path', '')}", e)
        return StorageError(f"warm tier {getattr(tier, 'path', '')}: {type(e).__name__}: {e}")
    return None


@error_boundary(_warm_error)
class WarmTier:
    """Arrow IPC fragments of evicted batches (implements ``Tier``). One writer at a time."""

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
        self._open: dict[int, OpenFragment] = {}  # fragment -> open file + layout (at most MAX_OPEN_FILES)
        self._verified: dict[int, Sig] = {}  # fragment -> signature when it last passed
        self._counts: dict[int, tuple[int, int, int]] = {}  # fragment -> (rows, live rows, bytes)
        self._published: set[int] = set(self._ids_on_disk())
        self._next = max(self._published, default=-1) + 1
        self._version = 0
        #: read-path verification on (the default, guarantee 3 of DESIGN.md); the benchmark switches it
        #: off only to measure what it costs (``lakebuffer bench --scenario verification``)
        self.verify_reads = True

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

    def adopt(self, segment: Path, rows: int, checked: tuple[int, int] | None = None, *,
              check_now: bool = True) -> Staged:
        """Promote a WAL segment to a new fragment by a hard link: the batch's bytes are not written again.

        ``checked`` is the (size, mtime) the segment had when this process wrote it and took its CRC32C
        from the bytes on disk (``WriteAheadLog.written``): while the file still has it, the fragment
        starts out verified, as one this tier wrote does. Otherwise it is checked here, in the
        write-back thread, unless ``check_now`` is False (a reopen adopting a previous process's segments,
        ``adoptable_unread``): then it is checked like any fragment a reopen finds, chunk by chunk as
        takes read it and whole before a scan. The WAL's own name is removed by the caller afterwards.
        """
        f = self._new_id()
        target = self.file_of(f)
        self.path.mkdir(parents=True, exist_ok=True)
        os.link(segment, target)
        if self._sync:
            fsync_path(self.path)
        try:
            sig = path_sig(str(target))  # (inode, size, mtime); the WAL recorded (size, mtime)
            unchecked = checked is None or sig is None or sig[1:] != checked
            if unchecked and check_now:
                self._verify_file(f, force=True)
        except BaseException:
            target.unlink(missing_ok=True)
            raise
        return self._entered(f, rows, verified=not unchecked or check_now)

    def adoptable_unread(self, segment: Path) -> bool:
        """Whether ``segment`` can become a fragment without reading its rows: it carries a CRC32C per
        chunk (reads check what they read) and holds this tier's schema. Reads its footers only."""
        try:
            with pa.OSFile(str(segment)) as src:
                fd = src.fileno()
                footer = segfooter.parse_fd(fd, os.fstat(fd).st_size)
                if not footer.chunk_bytes:
                    return False
                layout = read_layout(fd, footer.ipc_end)
        except (OSError, segfooter.FooterError, LayoutError):
            return False  # read whole on the old path, which names what is wrong
        return layout.supported and layout.schema.equals(self.schema)

    def _entered(self, f: int, rows: int, verified: bool = True) -> Staged:
        path = self.file_of(f)
        sig = path_sig(str(path))
        if sig is not None and verified:
            self._verified[f] = sig  # the writer's CRC32C was taken from the bytes on disk
        nbytes = sig[1] if sig else 0
        self._counts[f] = (rows, rows, nbytes)
        return Staged(part=f, rows=rows, nbytes=nbytes, files=(path.name,), checksum=None, handle=f)

    def publish(self, staged: Staged) -> None:
        """Make a staged fragment visible to ``arrow_source`` and ``stats``."""
        with self._lock:
            self._published.add(int(staged.part))
            self._version += 1

    # reading -----------------------------------------------------------------------------
    def _damaged(self, f: int, what: str) -> CorruptionError:
        return CorruptionError(f"warm fragment {f}: file {self.file_of(f)} {what}; {repair_hint(self.buffer_dir)}")

    def _verify_file(self, f: int, force: bool = False, lazy: bool = False) -> OpenFragment:
        """Open fragment ``f``, checked unless this process already checked these bytes (or ``force``);
        ``lazy`` (a take): chunk by chunk as read (``warmfile.open_fragment``)."""
        def must_check(sig: Sig) -> bool:
            return force or (self.verify_reads and self._verified.get(f) != sig)

        o, trusted = open_fragment(str(self.file_of(f)), self.schema, must_check, lazy and not force,
                                   lambda what: self._damaged(f, what))
        if trusted:
            self._verified[f] = o.sig
        return o

    def opened(self, f: int, lazy: bool = False) -> OpenFragment:
        """Fragment ``f`` open and verified (no system call when it already is); ``lazy`` (a take): or
        open with its chunks checked as they are read.

        An open file is trusted while it keeps its signature, which every read checks afterwards
        (``OpenFragment.unchanged``); a name another program replaced or removed keeps serving the verified
        file this tier holds open (its bytes are still the verified ones) until it is dropped. Changes
        made here (deletes, drops) forget the open file first.
        """
        f = int(f)
        o = self._open.get(f)  # lock-free read (a dict get is atomic); writers below hold the lock
        if o is not None and (not self.verify_reads or self._verified.get(f) == o.sig
                              or (lazy and o.check is not None)):
            return o
        if not os.path.exists(f"{self._dir}/{f:016d}.arrow"):
            raise self._damaged(f, "is missing")
        o = self._verify_file(f, lazy=lazy)
        with self._maps_lock:
            self._open[f] = o
            while len(self._open) > MAX_OPEN_FILES:  # the oldest goes first (closed when no read holds it)
                self._open.pop(next(iter(self._open)))
        return o

    def _forget(self, f: int) -> None:
        with self._maps_lock:
            self._open.pop(int(f), None)
        self._verified.pop(int(f), None)

    def take(self, where: Location, columns: Sequence[str]) -> pa.Table:
        """Rows by (fragment, position), in the order given, with only ``columns``.

        Each run of consecutive asked rows of one record batch is read from its file by ``pread``,
        only its bytes of only the asked columns (``ipcread``); a file that changed during the read
        (its signature after the read differs) is checked again and read once more, else the read
        raises ``CorruptionError``: a truncated or rewritten file is never a crash signal.
        """
        columns = list(columns)
        schema = pa.schema([self.schema.field(c) for c in columns])
        if len(where) == 0:
            return schema.empty_table()
        uniq, inv = _unique(where.part)
        rows = where.row.astype(np.int64)
        verified = self._verified if self.verify_reads else None
        for _attempt in (0, 1):
            opens = []
            for f in uniq.tolist():  # ``opened`` inlined: a dict get per fragment when it is open and verified
                o = self._open.get(f)
                opens.append(o if o is not None and (verified is None or verified.get(f) == o.sig or o.check is not None)
                             else self.opened(f, lazy=True))
            try:
                out = self._take_open(opens, uniq, inv.astype(np.int64), rows, columns, schema)
                changed = [f for f, o in zip(uniq.tolist(), opens) if not o.unchanged()]
            except (LayoutError, OSError, pa.ArrowException) as e:
                changed = [f for f, o in zip(uniq.tolist(), opens) if not o.unchanged()]
                if not changed:
                    raise CorruptionError(f"warm fragments {uniq.tolist()[:8]} in {self.path} cannot be read ({e}); "
                                          f"{repair_hint(self.buffer_dir)}") from e
            if not changed:
                return out
            for f in changed:
                self._forget(f)
        raise self._damaged(int(changed[0]), "changed while it was read, twice")

    def _take_open(self, opens: list[OpenFragment], uniq: np.ndarray, inv: np.ndarray, rows: np.ndarray,
                   columns: list[str], schema: pa.Schema) -> pa.Table:
        n_rows = np.array([o.rows for o in opens], np.int64)
        if (rows < 0).any() or (rows >= n_rows[inv]).any():
            bad = int(uniq[inv[np.flatnonzero((rows < 0) | (rows >= n_rows[inv]))[0]]])
            raise CorruptionError(f"warm fragment {bad} ({self.file_of(bad)}) has fewer rows than the index says; "
                                  f"{repair_hint(self.buffer_dir)}")
        if all(o.plain for o in opens):
            plan = split([o.fd for o in opens], [o.layout for o in opens], inv, rows,
                         [(o.map.addr, o.map.size) for o in opens])
            arrays = [read_runs(schema.field(c).type, plan.runs(self.schema.get_field_index(c))) for c in columns]
            return pa.Table.from_arrays(arrays, schema=schema)
        # another layout (dictionaries, compression, an older schema): the touched batches' columns whole
        tables = []
        for o in opens:
            r = o.reader(columns)
            tables.append(pa.Table.from_batches([r.get_batch(i) for i in range(r.num_record_batches)]))
        return gather([t.cast(schema) for t in tables], inv, rows, columns)

    def read(self, f: int, columns: Sequence[str] | None = None) -> pa.Table:
        """One whole fragment's ``columns`` (all if None), read into memory and verified."""
        cols = list(columns) if columns is not None else list(self.schema.names)
        return pa.Table.from_batches(list(self.batches(int(f), cols)), schema=pa.schema([self.schema.field(c) for c in cols]))

    def batches(self, f: int, columns: Sequence[str]) -> Iterator[pa.RecordBatch]:
        """Fragment ``f``'s rows with ``columns`` in record batches of at most ~``SCAN_CHUNK_BYTES`` (a
        fragment's own batch may be a whole push), each read by positioned reads and checked unchanged
        after its read: a scan holds one chunk, not one fragment, in anonymous memory."""
        schema = pa.schema([self.schema.field(c) for c in columns])
        o = self.opened(f)
        lay = o.layout
        if not (lay.supported and lay.schema.equals(self.schema)):
            yield from self._batches_whole(f, o, columns, schema)
            return
        idx = [self.schema.get_field_index(c) for c in columns]
        width = max(lay.column_bytes(list(columns)) / max(lay.rows, 1), 1.0)
        step = max(1, int(SCAN_CHUNK_BYTES // width))
        for b, nodes in enumerate(lay.batches):
            n = int(lay.starts[b + 1] - lay.starts[b])
            for lo in range(0, n, step):
                hi = min(n, lo + step)
                try:
                    arrays = [read_runs(schema.field(j).type, one_run(o.fd, nodes[i], lo, hi))
                              for j, i in enumerate(idx)]
                except (LayoutError, OSError, pa.ArrowException) as e:
                    self._forget(f)
                    raise self._damaged(f, f"cannot be decoded ({e})" if o.unchanged() else "changed while it was read") from e
                if not o.unchanged():
                    self._forget(f)
                    raise self._damaged(f, "changed while it was read")
                yield pa.RecordBatch.from_arrays(arrays, schema=schema)

    def _batches_whole(self, f: int, o: OpenFragment, columns: Sequence[str], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
        """A fragment ``ipcread`` does not read by rows (dictionaries, compression, an older schema)."""
        try:
            r = o.reader(columns)
            n = r.num_record_batches
        except (OSError, pa.ArrowException) as e:
            raise self._damaged(f, f"cannot be decoded ({e})" if o.unchanged() else "changed while it was read") from e
        for i in range(n):
            try:
                b = r.get_batch(i)
            except (OSError, pa.ArrowException) as e:
                raise self._damaged(f, f"cannot be decoded ({e})" if o.unchanged() else "changed while it was read") from e
            if not o.unchanged():
                self._forget(f)
                raise self._damaged(f, "changed while it was read")
            yield b if b.schema.equals(schema) else b.cast(schema)

    def stream(self, ids: Sequence[int], columns: Sequence[str]) -> Iterator[pa.RecordBatch]:
        """Every batch of fragments ``ids`` with ``columns`` (a scan: one batch in memory at a time)."""
        for f in ids:
            yield from self.batches(f, columns)

    def arrow_source(self) -> pds.Dataset:
        """The published fragments for DuckDB; a scan verifies them first (see the module)."""
        with self._lock:
            ids = sorted(self._published)
        return WarmDataset.over(self, ids)

    def has_deletes(self, ids: Sequence[int]) -> bool:
        return any(self._counts_of(f)[1] != self._counts_of(f)[0] for f in ids)

    def close(self) -> None:
        """Release the open fragment files (the buffer's ``close``: the directory is let go whole)."""
        with self._maps_lock:
            self._open.clear()

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
        key_field = self.schema.field("key")
        k = self.schema.get_field_index("key")
        for f in targets:
            hits = pc.sum(pc.is_in(self.read(f, ["key"]).column("key"), value_set=wanted)).as_py() or 0
            if not hits:
                continue

            def blanked(f: int = f) -> Iterator[pa.RecordBatch]:  # one batch in memory at a time
                for b in self.batches(f, self.schema.names):
                    key = b.column(k)
                    yield b.set_column(k, key_field, pc.if_else(pc.is_in(key, value_set=wanted),
                                                                pa.scalar(DELETED_KEY, pa.string()), key))

            with self._lock:
                self._files.write(f, blanked(), schema=self.schema)  # tmp + rename: a running read keeps its file
                self._forget(f)
                rows = self._counts_of(f)[0]
                self._counts.pop(f, None)
                self._entered(f, rows)
                self._counts.pop(f, None)  # live rows counted again from the new file
                self._counts_of(f)
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
                self._forget(f)
                self._counts.pop(f, None)
            self._version += 1

    # integrity ---------------------------------------------------------------------------
    def verify(self, fragment_id: int, files: Sequence[str] = (), checksum: int | None = None) -> None:
        """Check a fragment against its own CRC32C footer now; ``CorruptionError`` naming the file.

        ``files``/``checksum`` (what the index recorded) are accepted for the older callers: the
        fragment carries its own checksum, which stays right across delete rewrites.
        """
        self._forget(int(fragment_id))
        self._verify_file(int(fragment_id), force=True)

    def expect(self, fragment_id: int, files: Sequence[str], checksum: int | None) -> None:
        """The index records fragment ``fragment_id`` (recovery says so for each warm batch): it is
        published even when its file is gone, so a scan over it raises ``CorruptionError`` instead of
        silently leaving its rows out (issue 24). A fragment's checksum is its own footer."""
        with self._lock:
            if int(fragment_id) not in self._published:
                self._published.add(int(fragment_id))
                self._version += 1

    def ensure_verified(self, fragment_ids: Sequence[int]) -> None:
        """Verify each fragment not verified yet in this process (or whose file changed since)."""
        for f in fragment_ids:
            self.opened(int(f))

    def fragment_keys(self, fragment_id: int) -> list[str]:
        """The live keys of one fragment (recovery reads an orphan's keys before deciding its fate)."""
        key = self.read(fragment_id, ["key"]).column("key")
        return key.filter(pc.not_equal(key, DELETED_KEY)).to_pylist()

    def check_readable(self, columns: Sequence[str]) -> None:
        """Raise ``CorruptionError`` naming the first fragment that cannot be read (a failed scan's probe)."""
        for f in self.fragment_ids():
            for _ in self.batches(f, [c for c in columns if c in self.schema.names] or ["key"]):
                pass

    def fragment_ids(self) -> list[int]:
        with self._lock:
            return sorted(self._published)

    def _counts_of(self, f: int) -> tuple[int, int, int]:
        c = self._counts.get(f)
        if c is None:  # a fragment from before this process: rows from its IPC metadata, no checksum pass
            path = self.file_of(f)
            try:  # positioned reads of the key column only, validated before use (unverified bytes)
                with pa.OSFile(str(path)) as src:
                    size = os.fstat(src.fileno()).st_size
                    opts = pa.ipc.IpcReadOptions(included_fields=[self.schema.get_field_index("key")])
                    end = segfooter.parse_fd(src.fileno(), size).ipc_end
                    key = pa.ipc.open_file(src, footer_offset=end, options=opts).read_all().column(0)
                key.validate(full=True)
                rows = len(key)
                live = rows - pc.sum(pc.equal(key, DELETED_KEY)).as_py() if rows else 0
                c = (rows, live, size)
            except (OSError, ValueError, pa.ArrowException):
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
