"""The controller's journal as log segments the controller appends to itself.

Why: a journal record went from the controller to the store actor and back before the controller
could answer (one socket round trip and the store's turn: ~1-1.7 ms of every put and tag update).
On the store's node the controller now appends each acknowledged operation's records to a segment
file under ``<store path>/tq-keys.d/`` (one ``write``, in the OS when it returns: what the WAL does
for a push) and answers. The store folds closed segments into its journal buffer (``tq_journal``).

Layout: ``<first seq, 20 digits>.log`` is the segment a controller appends to; it renames it to
``.closed`` after ``ROTATE_RECORDS`` records (or when a new controller starts: the old one is gone),
and only ``.closed`` segments are ever deleted (by the store, once their records are in its buffer).
A frame is a 20-byte header (``LBJ1``, the body's length, a CRC32C of those 12 bytes, the body's
CRC32C) then one Arrow IPC stream. A frame cut short at the end of a file is an append a crash
interrupted (never acknowledged); a header or body that fails its CRC is damage: ``CorruptionError``
naming the file, which is then neither taken nor removed (damaged metadata never deletes data). Records are numbered (``tq_seq``) by the one ``Sequencer`` of
the live controller, from the store's highest number + 1 when it starts.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from crc32c import crc32c

from ..errors import CorruptionError
from ..index import ipc_bytes, read_ipc

DIRNAME = "tq-keys.d"
MAGIC = b"LBJ1"
HEADER = 20  # magic, body length, header CRC32C, body CRC32C
ROTATE_RECORDS = 4096  # records a segment holds before the controller starts the next one


class Sequencer:
    """Numbers journal records (``tq_seq``) and names them (``key``: ``j<seq>``) in arrival order."""

    def __init__(self, next_seq: int) -> None:
        self.next_seq = next_seq

    def number(self, records: pa.Table) -> pa.Table:
        n = records.num_rows
        seq = pa.array(np.arange(self.next_seq, self.next_seq + n, dtype=np.int64))
        self.next_seq += n
        keys = pc.binary_join_element_wise("j", pc.cast(seq, pa.string()), "")
        return pa.table({"key": keys, **{c: records.column(c) for c in records.column_names}, "tq_seq": seq})


def frame_of(table: pa.Table) -> bytes:
    """``table`` as one journal frame (header with its CRC, body with its CRC)."""
    data = ipc_bytes(table)
    head = MAGIC + len(data).to_bytes(8, "little")
    return head + crc32c(head).to_bytes(4, "little") + crc32c(data).to_bytes(4, "little") + data


def append_frame(fd: int, table: pa.Table, sync: bool) -> None:
    """One frame at the end of the file ``fd``: whole or not at all (a short write is undone)."""
    frame = frame_of(table)
    start = os.lseek(fd, 0, os.SEEK_END)
    try:
        view = memoryview(frame)
        while view:
            view = view[os.write(fd, view):]
        if sync:
            os.fsync(fd)
    except BaseException:
        os.ftruncate(fd, start)  # no torn frame before later acknowledged ones
        raise


def read_frames(path: Path) -> list[pa.Table]:
    """The records of one log file; a frame cut short at its end (a crash mid-append: never
    acknowledged) is left out; a damaged one raises ``CorruptionError``."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    if data and not data.startswith(MAGIC):
        return _legacy_frames(data)
    tables, pos = [], 0
    while pos + HEADER <= len(data):
        head = data[pos:pos + 12]
        if not head.startswith(MAGIC) or crc32c(head) != int.from_bytes(data[pos + 12:pos + 16], "little"):
            raise CorruptionError(f"journal log {path}: the frame at byte {pos} is damaged (header); the file "
                                  "is kept as it is")
        size = int.from_bytes(head[4:], "little")
        if pos + HEADER + size > len(data):
            break  # cut short by a crash: never acknowledged
        body = data[pos + HEADER:pos + HEADER + size]
        if crc32c(body) != int.from_bytes(data[pos + 16:pos + 20], "little"):
            raise CorruptionError(f"journal log {path}: the frame at byte {pos} fails its CRC; the file is kept "
                                  "as it is")
        tables.append(read_ipc(body))
        pos += HEADER + size
    return tables


def _legacy_frames(data: bytes) -> list[pa.Table]:
    """A store log written before frames had CRCs (8 bytes of length, then the stream)."""
    tables, pos = [], 0
    while pos + 8 <= len(data):
        size = int.from_bytes(data[pos:pos + 8], "little")
        if pos + 8 + size > len(data):
            break
        tables.append(read_ipc(data[pos + 8:pos + 8 + size]))
        pos += 8 + size
    return tables


def segments(directory: Path) -> tuple[list[Path], list[Path]]:
    """(closed, open) segments, oldest first."""
    if not directory.is_dir():
        return [], []
    return sorted(directory.glob("*.closed")), sorted(directory.glob("*.log"))


class SegmentWriter:
    """The live controller's appender: numbers records, appends them, rotates segments."""

    def __init__(self, directory: Path, next_seq: int, sync: bool) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.sync = sync
        self.seq = Sequencer(next_seq)
        self._lock = threading.Lock()
        for stale in segments(self.directory)[1]:  # a controller before this one: it is gone
            stale.rename(stale.with_suffix(".closed"))
        self._open()

    def _open(self) -> None:
        self.path = self.directory / f"{self.seq.next_seq:020d}.log"
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.records = 0

    def append(self, records: pa.Table) -> bool:
        """Store ``records`` durably (acknowledged when this returns); True when a segment was closed."""
        with self._lock:
            numbered = self.seq.number(records)
            append_frame(self.fd, numbered, self.sync)
            self.records += records.num_rows
            if self.records < ROTATE_RECORDS:
                return False
            os.close(self.fd)
            self.path.rename(self.path.with_suffix(".closed"))
            self._open()
            return True

    def close(self) -> None:
        with self._lock:
            os.close(self.fd)
