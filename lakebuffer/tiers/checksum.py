"""crc32 of local files, and the fix every local checksum error names.

zlib's crc32 over a read-only memory map: no copy and no buffer per call (the page cache serves a
file just written). One helper for the warm tier's fragments and the WAL's segments.
"""

from __future__ import annotations

import mmap
import os
import zlib
from pathlib import Path


def crc32_file(path: Path, length: int | None = None) -> int:
    """crc32 of the first ``length`` bytes of ``path`` (the whole file if None)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        n = size if length is None else min(length, size)
        if n == 0:
            return 0
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            with memoryview(m) as view:
                return zlib.crc32(view[:n])


def repair_hint(buffer_dir: Path) -> str:
    """What to run when a local file fails its check (fsck rebuilds from the lake or reports the loss)."""
    return f"run `lakebuffer fsck --repair {buffer_dir}` (it rebuilds from verified copies or lists the rows lost)"
