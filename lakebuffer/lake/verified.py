"""A pyarrow filesystem over the lake that verifies each committed data file before its first read.

Every query path over the lake (``LakeView`` get/sample/scan/sql, the buffer's ``cold``/``lake``
views) reads through a pyarrow dataset, and DuckDB decodes through it; neither has a checksum hook.
The one place every such read passes is the filesystem's ``open_input_file``, so the dataset's
fragments use ``VerifiedFS``: the first time this process opens a committed file, its bytes are
checked against the manifest's block crc32s (sha256 without them); after that the file is opened
natively. Committed files are immutable (unique names, never rewritten in place), so a pass is
remembered per (path, size, sha256) for the life of the process; on a local lake also per mtime
(one ``stat`` per open), so a file changed behind the lake is checked again. Restore, commit and compaction
read through ``BlockReader``, which checks every byte itself.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import pyarrow.fs as pafs

from ..errors import CorruptionError
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
    from .reader import check_whole  # reader imports nothing of this module; avoids a cycle at import

    ident = _ident(store, entry)
    with _VERIFIED_LOCK:
        if ident in _VERIFIED:
            return
    url = ident[0]
    try:
        data = store.cat(entry["path"])
    except FileNotFoundError:
        raise CorruptionError(
            f"lake file {url} listed in a committed manifest is missing; run `lakebuffer fsck` on the lake "
            "and restore the file from a copy, or delete the run's affected snapshot"
        ) from None
    problem = check_whole(entry, data)
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


class _VerifyingHandler(pafs.FileSystemHandler):
    """Delegates to the lake's pyarrow filesystem; ``open_input_file`` verifies first; no writes."""

    def __init__(self, store: LakeFS, entries: dict[str, dict]) -> None:
        self.store = store
        self.base: pafs.FileSystem = store.pafs
        self.entries = entries  # filesystem path -> manifest entry

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _VerifyingHandler) and other.base.equals(self.base) and other.entries is self.entries

    def __ne__(self, other: object) -> bool:
        return not self == other

    def get_type_name(self) -> str:
        return "lakebuffer-verified"

    def normalize_path(self, path: str) -> str:
        return self.base.normalize_path(path)

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        return self.base.get_file_info(paths)

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        return self.base.get_file_info(selector)

    def _verify(self, path: str) -> None:
        entry = self.entries.get(path)
        if entry is None:
            raise CorruptionError(f"{path} is not a committed file of lake {self.store.url}; it cannot be verified")
        verify_entry(self.store, entry)

    def open_input_file(self, path: str) -> Any:
        self._verify(path)
        return self.base.open_input_file(path)

    def open_input_stream(self, path: str) -> Any:
        self._verify(path)
        return self.base.open_input_stream(path)

    def _read_only(self, *_: Any) -> None:
        raise PermissionError(f"lake {self.store.url} is read through a verifying, read-only filesystem")

    create_dir = delete_dir = delete_dir_contents = delete_root_dir_contents = delete_file = _read_only
    move = copy_file = open_output_stream = open_append_stream = _read_only


def verified_fs(store: LakeFS, entries: dict[str, dict]) -> pafs.FileSystem:
    """A pyarrow filesystem that reads only the committed files ``entries`` (path -> manifest entry),
    each verified before this process first reads it."""
    return pafs.PyFileSystem(_VerifyingHandler(store, entries))
