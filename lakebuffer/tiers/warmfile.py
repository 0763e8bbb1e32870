"""One warm fragment file, opened and verified: the part of the warm tier that decides when bytes are
trusted (issue 15, guarantee 2: reads never return data failing its checksum).

A fragment is an Arrow IPC file with a checksum footer (``segfooter``). ``open_fragment`` opens it,
checks it against the footer (whole, or, for a take of a file with chunk CRCs, chunk by chunk as the
take reads, ``chunkcheck``), parses its IPC layout and returns an ``OpenFragment`` bound to the file's
(inode, size, mtime): every read checks afterwards that the file still has it, so bytes verified once
stay verified until anyone writes, truncates or replaces the file. A file that changes while it is
checked is checked again; one that keeps failing raises the caller's ``CorruptionError``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyarrow as pa
from crc32c import crc32c

from ..errors import CorruptionError
from . import ipcread, segfooter
from .chunkcheck import ChunkCheck
from .ipcread import Layout, LayoutError, read_layout
from .vmread import Mapping

Sig = tuple[int, int, int]

#: bytes read per step while checking a fragment's CRC32C (anonymous memory, freed after the check)
CHECK_CHUNK = 1 << 20
#: a file modified this recently is checked but not trusted afterwards: its mtime may not change on a
#: second write within the same clock tick (git's "racily clean" problem)
RACY_NS = 50_000_000


def sig_of(st: os.stat_result) -> Sig:
    """(inode, size, mtime): a write or truncate by anyone changes mtime before it changes a byte, a
    rename-over changes the inode; what must stay the same for verified bytes to stay verified."""
    return st.st_ino, st.st_size, st.st_mtime_ns


def path_sig(path: str) -> Sig | None:
    try:
        return sig_of(os.stat(path))
    except OSError:
        return None


def check_whole(fd: int, footer: segfooter.Footer) -> int | None:
    """Every IPC byte of ``fd`` against its footer: the first failing chunk (0 for an LBW1 file), None if all
    pass. Read by positioned reads (no map: a truncation is an error), ``CHECK_CHUNK`` bytes (whole
    chunks) at a time into one buffer (anonymous memory, freed after the check)."""
    n, size = footer.ipc_end, footer.chunk_bytes
    step = max(size, CHECK_CHUNK // size * size) if size else CHECK_CHUNK
    buf = bytearray(min(step, max(n, 1)))
    view = memoryview(buf)
    crc, pos = 0, 0  # LBW1: one CRC32C chained over the reads
    while pos < n:
        want = min(len(buf), n - pos)
        k = os.preadv(fd, [view[:want]], pos)
        if k != want:
            raise LayoutError(f"file ends at {pos + max(k, 0)} of {n} bytes")
        if size:
            bad = footer.check(view[:k], pos // size)
            if bad is not None:
                return bad
        else:
            crc = crc32c(view[:k], crc)
        pos += k
    return None if size or crc == int(footer.crcs[0]) else 0


@dataclass
class OpenFragment:
    """One fragment, open and verified: its file, its (inode, size, mtime) and its IPC layout."""

    sig: Sig
    src: pa.OSFile  # closed when the last reader drops it (never under a running read)
    layout: Layout

    #: its layout is one ``take`` reads by rows (``ipcread``) with the tier's schema
    plain: bool = False
    #: where its IPC bytes end (its checksum footer after them)
    ipc_end: int = 0
    #: not checked whole: every range a take reads is checked chunk by chunk first (``chunkcheck``)
    check: ChunkCheck | None = None

    def __post_init__(self) -> None:
        self.fd = self.src.fileno()  # an attribute: read per fragment per call
        self.rows = self.layout.rows
        #: the file mapped, for scattered copies that fail instead of signalling (``vmread``); never read directly
        self.map = Mapping(self.fd, self.sig[1]) if self.plain else Mapping(self.fd, 0)

    def __del__(self) -> None:
        if self.check is not None:  # before ``src`` closes its descriptor (which another file may reuse)
            ipcread.clear_check(self.fd, self.check)

    def unchanged(self) -> bool:
        """True while the open file still has the verified signature (checked after every read)."""
        try:
            return sig_of(os.fstat(self.fd)) == self.sig
        except OSError:
            return False

    def reader(self, columns: Sequence[str] | None = None) -> pa.ipc.RecordBatchFileReader:
        """pyarrow's IPC reader over the open file (positioned reads, only ``columns`` when given)."""
        opts = None
        if columns is not None:
            opts = pa.ipc.IpcReadOptions(included_fields=[self.layout.schema.get_field_index(c) for c in columns])
        return pa.ipc.open_file(self.src, footer_offset=self.ipc_end, options=opts)


class _Again(Exception):
    """The file changed while it was opened or checked: open and check the new bytes."""


def open_fragment(path: str, schema: pa.Schema, must_check: Callable[[Sig], bool], lazy: bool,
                  damaged: Callable[[str], CorruptionError]) -> tuple[OpenFragment, bool]:
    """Open the fragment at ``path``, check it when ``must_check(its signature)`` says so, parse its layout.

    ``lazy`` (a take): a file with chunk CRCs is not checked whole; the take checks the chunks it reads,
    and a later scan checks it whole. Returns the open fragment and whether it is now trusted whole (it
    was checked whole and not modified within ``RACY_NS`` of the check). ``damaged(what)`` makes the
    error for a file that is missing, torn, undecodable or fails its checksum."""
    for _attempt in range(3):
        try:
            return _open_once(path, schema, must_check, lazy, damaged)
        except _Again:
            continue
    raise damaged("keeps changing while it is read (another program writes it)")


def _open_once(path: str, schema: pa.Schema, must_check: Callable[[Sig], bool], lazy: bool,
               damaged: Callable[[str], CorruptionError]) -> tuple[OpenFragment, bool]:
    try:
        src = pa.OSFile(path)
    except OSError as e:
        raise damaged(f"is missing ({e})") from e
    fd = src.fileno()
    t0 = time.time_ns()
    st = os.fstat(fd)
    sig = sig_of(st)
    check = must_check(sig)

    def failed(what: str) -> Exception:
        """A file that changed since it was opened is read again; an unchanged one is damaged."""
        return _Again() if sig_of(os.fstat(fd)) != sig else damaged(what)

    chunks: ChunkCheck | None = None
    try:
        try:
            footer = segfooter.parse_fd(fd, st.st_size)
        except segfooter.FooterError as e:
            raise failed(f"has {e} (torn or not a fragment)") from e
        if check and lazy and footer.chunk_bytes:
            chunks = ChunkCheck(path, fd, footer, remember=t0 - st.st_mtime_ns > RACY_NS)
            ipcread.set_check(fd, chunks)  # the layout's own bytes are checked as they are read
        elif check and check_whole(fd, footer) is not None:
            raise failed("fails its checksum")  # changed while checked: check the new bytes
        layout = read_layout(fd, footer.ipc_end)
        plain = layout.supported and layout.schema.equals(schema)
        if chunks is not None and not plain:  # read by pyarrow's IPC reader: checked whole first
            ipcread.clear_check(fd, chunks)
            chunks = None
            if check_whole(fd, footer) is not None:
                raise failed("fails its checksum")
        if sig_of(os.fstat(fd)) != sig:
            raise _Again()
    except BaseException as e:
        if chunks is not None:
            ipcread.clear_check(fd, chunks)
        if isinstance(e, (LayoutError, OSError)) and not isinstance(e, CorruptionError):
            raise failed(f"cannot be decoded ({e})") from e
        raise
    trusted = check and chunks is None and t0 - st.st_mtime_ns > RACY_NS
    return OpenFragment(sig, src, layout, plain, footer.ipc_end, chunks), trusted
