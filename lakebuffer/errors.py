"""One error hierarchy: catch ``LakeBufferError`` for all of them, or the matching built-in."""

from __future__ import annotations

import errno
import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar


class LakeBufferError(Exception):
    """Root of every error lakebuffer raises on purpose."""


class SchemaError(LakeBufferError, ValueError):
    """A pushed batch does not fit the buffer's schema; nothing of it was stored."""


class QueryError(LakeBufferError, ValueError):
    """A SQL query or ``where`` predicate was rejected by DuckDB (its message is kept)."""


class NotEnoughRowsError(LakeBufferError, ValueError):
    """A sampler was asked for more rows than its predicate matches."""


class ClosedError(LakeBufferError, RuntimeError):
    """The buffer was closed; open it again to use it."""


class ReadOnlyError(LakeBufferError, PermissionError):
    """A write was attempted on a read-only view (``open_lake``)."""


class BackpressureError(LakeBufferError, TimeoutError):
    """The hot tier stayed full for ``push_timeout_s``; the batch was not stored."""


class CorruptionError(LakeBufferError, OSError):
    """A fragment, WAL segment or lake file is missing or fails its checksum."""


class StorageError(LakeBufferError, OSError):
    """The buffer's local storage (index, WAL, warm tier, catalog) failed: a full disk, a permission,
    an I/O error. What was acknowledged before stays durable; free the space or fix the path and reopen."""


class LakeError(LakeBufferError, OSError):
    """The cold lake (S3 or fsspec URL) could not be read or written."""


class LakeExitingError(LakeError):
    """A lake call was started while the interpreter is exiting; it is refused instead of racing finalization."""


class DiskFullError(StorageError):
    """A filesystem the buffer writes to is full (ENOSPC). The write that failed stored nothing and
    everything acknowledged before stays durable: free space (or set ``disk_limit_gb`` /
    ``disk_free_floor_gb`` so rows leave local disk first) and retry or reopen."""


class LakeDiskFullError(LakeError, DiskFullError):
    """The lake's filesystem is full: the snapshot committed nothing; local rows are kept."""


def is_disk_full(e: BaseException) -> bool:
    """Whether ``e`` or an exception it was raised from is ENOSPC/EDQUOT (pyarrow puts errno in its text)."""
    seen = 0
    while e is not None and seen < 16:
        if getattr(e, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "[errno 28]" in str(e).lower() \
                or "no space left on device" in str(e).lower():
            return True
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
        seen += 1
    return False


def disk_full(where: str, e: BaseException) -> DiskFullError:
    """The error a full filesystem under ``where`` raises: what, where, and the fix."""
    return DiskFullError(f"{where}: the filesystem is full ({type(e).__name__}: {e}); the write that failed stored "
                         "nothing and every acknowledged row is kept: free space on it (or set disk_limit_gb / "
                         "disk_free_floor_gb so rows leave local disk before it fills), then retry or reopen")


class OldLakeFormatError(LakeError):
    """The lake was written by lakebuffer's own table format (before Delta Lake): not readable here."""


class LockedError(LakeBufferError, RuntimeError):
    """Another process holds the buffer directory open for writing."""


class WorkerError(LakeBufferError, RuntimeError):
    """A background task failed; raised on the next API call so nothing fails silently."""


class BackgroundDiskFullError(WorkerError, DiskFullError):
    """A background task (write-back) met a full filesystem; raised on the next call like any
    ``WorkerError``, and catchable as the ``DiskFullError`` / ``StorageError`` it is."""


class KeyNotFoundError(LakeBufferError, KeyError):
    """A requested rollout key is not in the buffer."""


#: ``translate(part, error)``: the ``LakeBufferError`` a dependency's exception becomes (None: leave it)
Translate = Callable[[Any, BaseException], "LakeBufferError | None"]
_C = TypeVar("_C", bound=type)


def error_boundary(translate: Translate) -> Callable[[_C], _C]:
    """Class decorator: exceptions of a dependency (rocksdict, duckdb, lance) leaving a public method
    (or ``__init__``) of the class become ``LakeBufferError``s.

    Why at the class: the module is the boundary to its dependency, so one translation there covers
    every call, present and future, instead of a try/except at each call site.
    """

    def wrap(cls: _C) -> _C:
        for name, fn in list(vars(cls).items()):
            if inspect.isfunction(fn) and (name == "__init__" or not name.startswith("_")):
                setattr(cls, name, _guarded(fn, translate))
        return cls

    return wrap


def _guarded(fn: Callable, translate: Translate) -> Callable:
    def mapped(part: Any, e: Exception) -> LakeBufferError | None:
        return None if isinstance(e, LakeBufferError) else translate(part, e)

    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def gen(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return (yield from fn(self, *args, **kwargs))
            except Exception as e:
                out = mapped(self, e)
                if out is None:
                    raise
                raise out from e

        return gen

    @functools.wraps(fn)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self, *args, **kwargs)
        except Exception as e:
            out = mapped(self, e)
            if out is None:
                raise
            raise out from e

    return call


def query_error(e: Exception) -> LakeBufferError:
    """A DuckDB error as the user sees it: ``QueryError``, or the ``CorruptionError`` a tier raised
    while DuckDB scanned it (DuckDB passes it on as text inside its own error)."""
    text = str(e)
    marker = "CorruptionError: "
    if marker in text:
        return CorruptionError(text[text.index(marker) + len(marker) :])
    if type(e).__name__ == "OutOfMemoryException":  # DuckDB's share of memory_limit_mb, spilling included
        first = text.splitlines()[0] if text else ""
        return QueryError(f"{type(e).__name__}: {first} -- the query needs more than DuckDB's share of the "
                          "buffer's memory (half of memory_limit_mb, at least 256 MB; it spills sorts and "
                          "aggregates past it): raise memory_limit_mb, or select fewer payload columns")
    if "Max expression depth limit" in text:  # DuckDB's hint to raise it cannot apply: the configuration is locked
        first = text.split(". Use ", 1)[0]
        return QueryError(f"{type(e).__name__}: {first}: the query nests deeper than DuckDB's max_expression_depth "
                          "(1000; lakebuffer's connections lock their configuration): write it flatter")
    return QueryError(f"{type(e).__name__}: {text}")


class OptionError(LakeBufferError, ValueError):
    """An option or argument has a bad name or value (the message names it and what is allowed)."""


class SamplerError(OptionError, TypeError):
    """What was given as a sampler is not one: not a name, nor a class or object with
    ``sample(catalog, n, where, rng)`` (the message says what it is and how to write one)."""
