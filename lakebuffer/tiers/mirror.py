"""A verified local mirror of lake files: what ``restore="eager"`` copies, and where cold reads go first.

Why a mirror and not warm fragments: an eager restore used to decode every zstd Parquet row group and
write it again as uncompressed Arrow IPC before ``open`` returned (0.065x a raw copy of the same files,
``benchmarks/restore_eager.py``). Copying the files as they are, hashed while they are copied (one pass,
checked against the sha256 in the file's name), makes every row local in about the time of the copy
plus one sha256; the rows are then indexed from the copies' ``key`` and metadata columns
(``engine/resume``) and served by the cold tier from the copies, through the same page-granular,
digest-checked reader as lake files (``lake/pages.py``). No read of a mirrored file touches the lake.

Layout: ``<buffer>/mirror/<lake-relative path>``, the same relative paths as the lake (file names carry
their sha256, so a path names one content). A copy is written under a ``.part`` name and renamed once
its hash matched: a file under its final name was complete and verified when written (a crash leaves
only ``.part`` files, removed on open). A reopened process checks a mirrored file again the first time a
whole-file read uses it (``verify_entry``; the page path checks every row's digests anyway).

Mirror files are local bytes in the disk budget (``engine/diskbudget``); their rows are committed to
the lake by construction, so they may leave local disk at any time (reads then go to the lake), oldest
first, before any warm fragment; and a file goes once every batch it held has been warmed into IPC
fragments (``engine/promotion``).
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..errors import CorruptionError, LakeError
from ..lake import runtime
from ..lake.fs import LakeFS
from ..lake.layout import sha256_of
from ..lake.verified import mark_verified

CHUNK = 8 * 2**20  # bytes per read: the copy's memory is this per thread
PART = ".part"


class LocalMirror:
    """Verified local copies of lake files (thread-safe), under ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._files: dict[str, int] = {}  # lake-relative path -> bytes, of the complete copies
        self._store: LakeFS | None = None
        if self.path.exists():
            for p in sorted(self.path.rglob("*")):
                if not p.is_file():
                    continue
                if p.name.endswith(PART):  # a copy a crash cut short
                    p.unlink(missing_ok=True)
                else:
                    self._files[p.relative_to(self.path).as_posix()] = p.stat().st_size

    @property
    def store(self) -> LakeFS:
        """The mirror as a local lake store (for the page reader and pyarrow)."""
        if self._store is None:
            self.path.mkdir(parents=True, exist_ok=True)
            self._store = LakeFS(str(self.path))
        return self._store

    def has(self, rel: str) -> bool:
        with self._lock:
            return rel in self._files

    def paths(self) -> list[str]:
        with self._lock:
            return list(self._files)

    def nbytes(self) -> int:
        with self._lock:
            return sum(self._files.values())

    def remove(self, rel: str) -> int:
        """Drop one copy (its rows are read from the lake again); bytes freed."""
        with self._lock:
            n = self._files.pop(rel, None)
        if n is None:
            return 0
        (self.path / rel).unlink(missing_ok=True)
        return n

    # copying -------------------------------------------------------------------------------
    def copy(self, lake: LakeFS, entries: list[dict], threads: int = 2) -> Iterator[dict]:
        """Copy the files not mirrored yet, ``threads`` at a time, each hashed as it is copied; yields
        each entry once its copy is in place. A file failing its sha256 or size is a ``CorruptionError``
        naming the lake file (nothing of it is kept); a storage failure a ``LakeError``."""
        todo = [e for e in entries if not self.has(e["path"])]
        for e in entries:
            if self.has(e["path"]):
                yield e
        if not todo:
            return
        with ThreadPoolExecutor(max(1, min(threads, len(todo))), thread_name_prefix="lakebuffer-mirror") as pool:
            # in order, a bounded number ahead: a failure stops the copies not started yet
            futures = [runtime.submit(pool, self._copy_one, lake, e) for e in todo[:threads]]
            nxt = len(futures)
            for i in range(len(todo)):
                try:
                    futures[i].result()
                except BaseException:
                    for f in futures[i + 1:]:
                        f.cancel()
                    raise
                if nxt < len(todo):
                    futures.append(runtime.submit(pool, self._copy_one, lake, todo[nxt]))
                    nxt += 1
                yield todo[i]

    def _copy_one(self, lake: LakeFS, entry: dict) -> None:
        rel = entry["path"]
        dst = self.path / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        part = dst.with_name(dst.name + PART)
        h = hashlib.sha256()
        size = 0
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        try:
            with _source(lake, rel) as src, open(part, "wb", buffering=0) as out:
                while True:
                    n = _read_into(lake, rel, src, buf)
                    if not n:
                        break
                    h.update(view[:n])  # hashlib releases the GIL: copies of 2 files overlap
                    out.write(view[:n])
                    size += n
            problem = _problem(entry, size, h.hexdigest())
            if problem:
                raise CorruptionError(
                    f"lake file {lake.url_of(rel)} fails its checksum ({problem}); nothing was restored from it. "
                    "Restore the file from a copy of the lake, or rewrite the run from a buffer that still holds the rows")
            os.replace(part, dst)
        except FileNotFoundError:
            part.unlink(missing_ok=True)
            raise CorruptionError(f"lake file {lake.url_of(rel)} listed in the Delta log is missing; restore it from "
                                  "a copy of the lake") from None
        except BaseException:
            part.unlink(missing_ok=True)
            raise
        with self._lock:
            self._files[rel] = size
        mark_verified(self.store, [entry])  # hashed while copied: no second pass on the first read


def _problem(entry: dict, size: int, digest: str) -> str | None:
    if size != int(entry["bytes"]):
        return f"{size} bytes, the Delta log says {entry['bytes']}"
    want = entry.get("sha256") or sha256_of(entry["path"])
    if want and digest != want:
        return f"sha256 {digest}, its name says {want}"
    return None


def _source(lake: LakeFS, rel: str):  # noqa: ANN202 - a binary file object
    if lake.native_local:
        return open(lake.abs(rel), "rb", buffering=0)
    return lake.io(f"reading {rel}", lake.fs.open, lake.abs(rel), "rb", block_size=CHUNK)


def _read_into(lake: LakeFS, rel: str, src, buf: bytearray) -> int:  # noqa: ANN001
    if hasattr(src, "readinto"):
        try:
            return src.readinto(buf)
        except OSError as e:
            if isinstance(e, FileNotFoundError):
                raise
            raise LakeError(f"reading lake file {lake.url_of(rel)} failed ({e}); open again once the lake is reachable") from e
    data = lake.io(f"reading {rel}", src.read, len(buf))
    buf[: len(data)] = data
    return len(data)


def drop_all(mirror: LocalMirror | None, paths: Iterable[str]) -> int:
    """Remove these copies if mirrored; bytes freed."""
    return sum(mirror.remove(p) for p in paths) if mirror is not None else 0
