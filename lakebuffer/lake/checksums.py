"""Whole-file checks of lake files against the sha256 in their names: the shared bottom layer of
``reader.py`` (verified whole-file reads) and ``verified.py`` (verify-once before a dataset is handed out),
so neither imports the other for it.
"""

from __future__ import annotations

import hashlib
import logging

from .fs import LakeFS
from .layout import sha256_of

log = logging.getLogger("lakebuffer")


_WARNED: set[str] = set()


def _warn_unverifiable(path: str) -> None:
    if path not in _WARNED:
        _WARNED.add(path)
        log.warning("lake file %s was not written by lakebuffer (no sha256 in its name): read unverified", path)


def check_bytes(entry: dict, data: bytes | memoryview) -> str | None:
    """What is wrong with ``data`` as the file ``entry`` (size from the Delta log, sha256 from the
    file's name) describes, or None."""
    if len(data) != int(entry["bytes"]):
        return f"{len(data)} bytes, the Delta log says {entry['bytes']}"
    want = entry.get("sha256") or sha256_of(entry["path"])
    if not want:
        # written by another Delta writer (e.g. an OPTIMIZE run with Spark): nothing to check it
        # against; its Parquet page checksums, if it has any, are still verified on ranged reads
        _warn_unverifiable(entry["path"])
        return None
    digest = hashlib.sha256(data).hexdigest()
    if digest != want:
        return f"sha256 {digest}, its name says {want}"
    return None


def stream_problem(store: LakeFS, entry: dict, chunk_bytes: int = 8 * 2**20) -> str | None:
    """``check_bytes`` of a file read in chunks (memory: one chunk); ``FileNotFoundError`` if missing."""
    rel = entry["path"]
    want = entry.get("sha256") or sha256_of(rel)
    h = hashlib.sha256()
    size = 0
    # through fsspec, like every whole-file read: Arrow's S3 client used from a background thread
    # hung processes at exit (tests/test_exit_safety.py, 1 of 12 S3 buffer children)
    with store.io(f"reading {rel}", store.fs.open, store.abs(rel), "rb", block_size=chunk_bytes) as f:
        while chunk := store.io(f"reading {rel}", f.read, chunk_bytes):
            h.update(chunk)
            size += len(chunk)
    if size != int(entry["bytes"]):
        return f"{size} bytes, the Delta log says {entry['bytes']}"
    if not want:
        _warn_unverifiable(rel)
        return None
    digest = h.hexdigest()
    return None if digest == want else f"sha256 {digest}, its name says {want}"
