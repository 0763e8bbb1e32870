"""The checksum footer of a WAL segment (which is also a warm fragment): CRC32Cs of its Arrow IPC bytes.

Arrow IPC has no checksum of its own, so every segment ends with a footer after its IPC bytes:

* ``LBW2`` (written since 2026-12-06): one CRC32C per ``CHUNK_BYTES`` chunk of the IPC bytes, then the
  chunk count, the chunk size and a CRC32C of those words (the table checks itself), then ``LBW2``.
  Why chunks: a warm ``take`` of a few rows checks only the chunks its bytes lie in, so verification
  costs what the read costs (DESIGN.md: "verification scales with the bytes read"); reading a whole
  fragment (scans, adopt, recovery, fsck) checks every chunk, which is as strong as one file CRC.
* ``LBW1`` (before): one CRC32C of all the IPC bytes, then ``LBW1``: still read, checked whole.

The chunk CRCs are computed in the one pass over the written bytes the single CRC took before. The chunk
size is each footer's own (``Footer.chunk_bytes``): segments written with another ``CHUNK_BYTES`` read as
they were written.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from crc32c import crc32c

#: 16 KiB since 2026-12-07 (64 KiB before): a warm take reads whole chunks around its rows, and a ~9 KB
#: rollout row read ~60 KB from disk at 64 KiB (`benchmarks/warm_chunk_size.py`, 64 random rows from disk:
#: 3.93 -> 1.56 MB, 8.3 -> 5.7 ms; a first payload scan's CPU unchanged, 0.24 / 0.23 s; footer 0.02%)
CHUNK_BYTES = 16 * 1024
MAGIC_V1, MAGIC_V2 = b"LBW1", b"LBW2"
_V1 = struct.Struct("<I4s")  # whole CRC, magic
_V2_FIXED = 16  # count, chunk bytes, table CRC, magic
MAX_FOOTER_BYTES = 4 * (1 << 24) + _V2_FIXED  # a footer claiming more is damage (2^24 chunks = 1 TiB)


class FooterError(ValueError):
    """The bytes at the end are not a segment footer (torn, damaged, or not a segment)."""


@dataclass(frozen=True)
class Footer:
    """What a segment's footer says: where its IPC bytes end and their CRC32Cs."""

    ipc_end: int
    chunk_bytes: int  # 0: one CRC of all IPC bytes (LBW1)
    crcs: np.ndarray  # uint32: per chunk (LBW2), or the one whole CRC (LBW1)

    @property
    def chunks(self) -> int:
        return len(self.crcs) if self.chunk_bytes else 0

    def check(self, data: memoryview | bytes, start_chunk: int = 0) -> int | None:
        """The first chunk (index) of ``data`` whose CRC differs, None when all match. ``data`` holds
        whole chunks from ``start_chunk`` (the last may end at ``ipc_end``); LBW1: all the IPC bytes."""
        if not self.chunk_bytes:
            return None if crc32c(data) == int(self.crcs[0]) else 0
        view = memoryview(data)
        for k, a in enumerate(range(0, len(view), self.chunk_bytes)):
            if crc32c(view[a:a + self.chunk_bytes]) != int(self.crcs[start_chunk + k]):
                return start_chunk + k
        return None


def encode(data: memoryview | bytes) -> bytes:
    """The LBW2 footer of ``data`` (the IPC bytes)."""
    view = memoryview(data)
    crcs = np.array([crc32c(view[a:a + CHUNK_BYTES]) for a in range(0, len(view), CHUNK_BYTES)], np.uint32)
    words = crcs.tobytes() + struct.pack("<II", len(crcs), CHUNK_BYTES)
    return words + struct.pack("<I", crc32c(words)) + MAGIC_V2


def magic_of(tail4: bytes) -> bytes | None:
    return tail4 if tail4 in (MAGIC_V1, MAGIC_V2) else None


def parse(read: Callable[[int, int], bytes], size: int) -> Footer:
    """The footer of a file of ``size`` bytes; ``read(n, offset)`` reads its bytes. ``FooterError`` if
    there is none or it is damaged."""
    if size < _V1.size:
        raise FooterError("shorter than a footer")
    magic = read(4, size - 4)
    if magic == MAGIC_V1:
        crc, _ = _V1.unpack(read(_V1.size, size - _V1.size))
        return Footer(size - _V1.size, 0, np.array([crc], np.uint32))
    if magic != MAGIC_V2 or size < _V2_FIXED:
        raise FooterError("no checksum footer")
    count, chunk, table_crc = struct.unpack("<III", read(12, size - _V2_FIXED))
    footer_bytes = 4 * count + _V2_FIXED
    if chunk <= 0 or footer_bytes > min(size, MAX_FOOTER_BYTES):
        raise FooterError("a damaged footer (its chunk count or size)")
    words = read(4 * count + 8, size - footer_bytes)
    if len(words) != 4 * count + 8 or crc32c(words) != table_crc:
        raise FooterError("a damaged footer (its own CRC)")
    ipc_end = size - footer_bytes
    if -(-ipc_end // chunk) != count:
        raise FooterError("a footer whose chunks do not cover the file")
    return Footer(ipc_end, chunk, np.frombuffer(words[:4 * count], np.uint32).copy())


def parse_fd(fd: int, size: int) -> Footer:
    def read(n: int, off: int) -> bytes:
        return os.pread(fd, n, off)
    return parse(read, size)


def parse_buffer(buf: memoryview | bytes) -> Footer | None:
    """The footer at the end of an in-memory segment; None when it has no magic at all (a segment
    written before footers existed); ``FooterError`` when it is damaged."""
    view = memoryview(buf)
    if len(view) < 4 or magic_of(bytes(view[-4:])) is None:
        return None

    def read(n: int, off: int) -> bytes:
        return bytes(view[off:off + n])
    return parse(read, len(view))


def ipc_end(path: str) -> int:
    """Where the IPC bytes of the segment file ``path`` end (``pa.ipc.open_file(..., footer_offset=)``)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return parse_fd(fd, os.fstat(fd).st_size).ipc_end
    finally:
        os.close(fd)
