"""Verify-once of committed lake files, before a pyarrow dataset over them is handed out.

Every query path over the lake (``LakeView`` get/sample/scan/sql, the buffer's ``cold``/``lake``
views) reads through a pyarrow dataset, and DuckDB decodes through it; neither has a checksum hook
(a verifying pyarrow ``PyFileSystem`` deadlocked DuckDB's scan threads), so ``Lake.dataset`` checks
every file it lists that this process has not checked yet against the sha256 in the file's name (Delta
has no checksum field). Files a writer just committed are marked verified from the bytes it wrote.
Committed files are immutable (content-addressed names, never rewritten in place), so a pass is
remembered per (path, size, sha256) for the life of the process; on a local lake also per mtime (one
``stat`` per open), so a file changed behind the lake is checked again; between the check and a later
read, the Parquet page checksums (verified by the dataset's reader) still catch a flipped data page.
Restore, deletes and compaction read through ``reader.FileReader``, which checks every byte itself.
"""

from __future__ import annotations

import os
import threading

from ..errors import CorruptionError
from .checksums import stream_problem
from .fs import LakeFS

_VERIFIED: set[tuple] = set()
_VERIFIED_LOCK = threading.Lock()


def _ident(store: LakeFS, entry: dict) -> tuple:
    url = store.url_of(entry["path"])
    ident: tuple = (url, int(entry["bytes"]), str(entry.get("sha256", "")))
    if store.native_local:
        try:
            ident += (os.stat(url).st_mtime_ns,)
        except OSError:
            pass  # missing: the read below names it
    return ident


def verify_entry(store: LakeFS, entry: dict) -> None:
    """Check one committed file once per process (``CorruptionError`` naming the file and the fix)."""
    ident = _ident(store, entry)
    with _VERIFIED_LOCK:
        if ident in _VERIFIED:
            return
    url = ident[0]
    try:
        problem = stream_problem(store, entry)  # in chunks: a file of any size costs one chunk of memory
    except FileNotFoundError:
        raise CorruptionError(
            f"lake file {url} listed in the Delta log is missing; run `lakebuffer fsck` on the lake "
            "and restore the file from a copy of the lake"
        ) from None
    if problem:
        raise CorruptionError(
            f"lake file {url} fails its checksum ({problem}); nothing was read from it. Restore the file "
            "from a copy of the lake, or rewrite the run from a buffer that still holds the rows "
            "(`lakebuffer fsck` lists every damaged file)"
        )
    with _VERIFIED_LOCK:
        _VERIFIED.add(ident)


def forget_verified() -> None:
    """Drop the process's record of verified lake files (tests; a file replaced behind the lake)."""
    with _VERIFIED_LOCK:
        _VERIFIED.clear()


def verify_entries(store: LakeFS, entries: list[dict]) -> None:
    """``verify_entry`` for each file (the first failure raises)."""
    for entry in entries:
        verify_entry(store, entry)


def mark_verified(store: LakeFS, entries: list[dict]) -> None:
    """Files this process just wrote and checksummed itself: no need to read them back."""
    idents = [_ident(store, e) for e in entries]
    with _VERIFIED_LOCK:
        _VERIFIED.update(idents)
