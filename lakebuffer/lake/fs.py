"""fsspec plumbing of a lake: URL -> filesystem, paths relative to the lake root, error mapping
(``io``), small and exclusive writes (writer claims), whole-file reads (verified by the caller).

Every storage call of the lake goes through ``LakeFS`` so that errors name the lake and the fix
(``LakeError``) in one place, and so that the local, object-store and generic-fsspec cases are decided
here once instead of in every caller.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import shutil
import uuid
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

import fsspec
import pyarrow.fs as pafs
from fsspec.implementations.local import LocalFileSystem

from ..errors import LakeBufferError, LakeError
from ..tiers.wal import fsync_path
from . import s3

OBJECT_STORES = {"s3", "s3a", "gs", "gcs", "abfs", "az", "abfss"}


def make_fs(url: str, options: dict, filesystem: fsspec.AbstractFileSystem | None) -> tuple[fsspec.AbstractFileSystem, str]:
    """(filesystem, root path) for a lake URL; ``filesystem`` replaces the one fsspec would build."""
    if filesystem is not None:
        return filesystem, filesystem._strip_protocol(url)
    opts = dict(options)
    proto = url.split("://", 1)[0] if "://" in url else "file"
    if proto in s3.S3_PROTOCOLS:
        region = opts.pop("region", None) or opts.pop("region_name", None)
        if region:
            ck = dict(opts.get("client_kwargs") or {})
            ck.setdefault("region_name", region)
            opts["client_kwargs"] = ck
        opts.setdefault("use_listings_cache", False)
    try:
        return fsspec.core.url_to_fs(url, **opts)
    except (ImportError, ValueError, TypeError) as e:
        raise LakeError(f"cannot open lake {url!r}: {e}") from e


def mtime(info: dict) -> float | None:
    """Modification time of a listing entry, whichever key and type the filesystem reports it in."""
    for k in ("mtime", "LastModified", "last_modified", "updated", "modified", "created"):
        v = info.get(k)
        if v is None:
            continue
        if isinstance(v, (int, float)):
            return float(v)
        if isinstance(v, datetime):
            return v.timestamp()
        if isinstance(v, str):
            with contextlib.suppress(ValueError):
                return datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()
    return None


def _fsync_write(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


class LakeFS:
    """The lake's root on one fsspec filesystem (plus a pyarrow view of it for datasets)."""

    def __init__(self, url: str, storage_options: dict | None = None, filesystem: fsspec.AbstractFileSystem | None = None) -> None:
        self.storage_options = dict(storage_options or {})
        self.fs, root = make_fs(url, self.storage_options, filesystem)
        self.root: str = root.rstrip("/") or "/"
        protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        self.protocol: str = protocol
        self.local = isinstance(self.fs, LocalFileSystem)
        self.object_store = protocol in OBJECT_STORES
        if self.local:
            self.url = self.root
            self.pafs: pafs.FileSystem = pafs.LocalFileSystem() if filesystem is None else pafs.PyFileSystem(pafs.FSSpecHandler(self.fs))
        else:
            self.url = url.rstrip("/")
            if filesystem is None and protocol in ("s3", "s3a"):
                # Arrow's own S3 client, not s3fs wrapped in a PyFileSystem: Arrow's IO threads then never
                # own Python buffers, which is what aborted processes at exit (lake/runtime.py)
                from .runtime import arrow_filesystem

                self.pafs = arrow_filesystem(f"s3://{self.root}", self.storage_options)[0]
            else:
                self.pafs = pafs.PyFileSystem(pafs.FSSpecHandler(self.fs))
        self.native_local = self.local and filesystem is None

    # ---- paths --------------------------------------------------------------------------
    def abs(self, rel: str) -> str:
        """Filesystem path of ``rel`` (relative to the lake root)."""
        return f"{self.root}/{rel}" if self.root != "/" else f"/{rel}"

    def url_of(self, rel: str) -> str:
        """What users see: an absolute path for a local lake, else a URL with the protocol."""
        path = self.abs(rel)
        return path if self.local else self.fs.unstrip_protocol(path)

    def strip(self, path: str) -> str:
        """A path from a listing without its protocol, comparable with ``abs``."""
        return self.fs._strip_protocol(path)

    # ---- calls --------------------------------------------------------------------------
    def probe(self) -> None:
        """Fail early and clearly when the bucket of an object-store lake does not exist."""
        if not self.object_store:
            return
        bucket = self.root.split("/", 1)[0]
        try:
            if s3.can_call(self.fs, self.protocol):
                s3.head_bucket(self.fs, bucket)
            else:
                self.fs.info(bucket)
        except FileNotFoundError:
            raise LakeError(
                f"bucket {bucket!r} of lake {self.url} does not exist; create it first (the lake never creates buckets)"
            ) from None
        except PermissionError as e:
            raise LakeError(f"no access to bucket {bucket!r} of lake {self.url}: {e}") from e
        except Exception as e:
            raise LakeError(f"cannot reach lake {self.url}: {type(e).__name__}: {e}") from e

    def io(self, what: str, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` with storage errors as ``LakeError`` naming ``what`` and the lake
        (missing/existing files pass through: callers decide what those mean)."""
        try:
            return fn(*args, **kwargs)
        except (LakeBufferError, FileNotFoundError, FileExistsError):
            raise
        except Exception as e:
            raise LakeError(f"{what} on lake {self.url} failed: {type(e).__name__}: {e}") from e

    def cat(self, rel: str) -> bytes:
        path = self.abs(rel)
        try:
            return self.io(f"reading {rel}", self.fs.cat_file, path)
        except FileNotFoundError:
            # a filesystem with a listings cache may answer from a stale listing: ask again
            with contextlib.suppress(Exception):
                self.fs.invalidate_cache(path)
            return self.io(f"reading {rel}", self.fs.cat_file, path)

    def cat_range(self, rel: str, start: int | None = None, end: int | None = None) -> bytes:
        """Bytes ``start:end`` of ``rel`` (the whole file when both are None), one attempt."""
        path = self.abs(rel)
        if start is None and end is None:
            return self.io(f"reading {rel}", self.fs.cat_file, path)
        return self.io(f"reading {rel}", self.fs.cat_file, path, start=start, end=end)

    def _makedirs_for(self, path: str) -> None:
        if self.native_local:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        elif self.local:
            self.fs.makedirs(posixpath.dirname(path), exist_ok=True)

    def put_small(self, rel: str, data: bytes) -> None:
        path = self.abs(rel)
        self._makedirs_for(path)
        if self.native_local:
            _fsync_write(path, data)
            return
        self.fs.pipe_file(path, data)

    def put_file(self, local: str, rel: str) -> None:
        """Upload the local file ``local`` to ``rel`` streaming: on S3 in multipart parts of
        ``s3.UPLOAD_PART_BYTES``, one at a time (s3fs reads a file under 2 x 50 MB whole by default)."""
        path = self.abs(rel)
        self._makedirs_for(path)
        if s3.is_s3(self.protocol) and s3.can_call(self.fs, self.protocol):
            self.fs.put_file(local, path, chunksize=s3.UPLOAD_PART_BYTES, max_concurrency=1)
            return
        with open(local, "rb") as src, self.fs.open(path, "wb") as dst:  # any fsspec store, in chunks
            shutil.copyfileobj(src, dst, s3.UPLOAD_PART_BYTES)

    def put_exclusive(self, rel: str, data: bytes) -> bool:
        """Create ``rel`` atomically with ``data``; False when it already exists."""
        path = self.abs(rel)
        if self.local:
            d = os.path.dirname(path)
            os.makedirs(d, exist_ok=True)
            tmp = os.path.join(d, f".tmp-{uuid.uuid4().hex}")
            _fsync_write(tmp, data)
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp)
            with contextlib.suppress(OSError):
                fsync_path(d)
            return True
        if s3.is_s3(self.protocol):
            try:
                self.fs.pipe_file(path, data, mode="create")
            except FileExistsError:
                return False
            return True
        # generic fsspec store without conditional writes: check-then-write (documented race)
        if self.fs.exists(path):
            return False
        self.fs.pipe_file(path, data)
        return True

    def remove(self, rel: str) -> None:
        self.io(f"removing {rel}", self.fs.rm_file, self.abs(rel))

    def remove_quietly(self, rels: Iterable[str]) -> None:
        """Best effort, one attempt: used after a failure, when the store may well be down."""
        paths = [self.abs(r) for r in rels]
        if paths:
            with contextlib.suppress(Exception):
                self.fs.rm(paths)

    def find(self, rel: str | None = None, *, detail: bool = False, what: str = "listing the lake") -> Any:
        """Files under ``rel`` (the root if None) as fsspec lists them; empty when it does not exist."""
        base = self.root if rel is None else self.abs(rel)
        if rel is not None:
            with contextlib.suppress(Exception):
                self.fs.invalidate_cache(base)
        try:
            return self.io(what, self.fs.find, base, detail=detail)
        except FileNotFoundError:
            return {} if detail else []
