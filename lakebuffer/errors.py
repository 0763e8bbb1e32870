"""One error hierarchy: catch ``LakeBufferError`` for all of them, or the matching built-in."""

from __future__ import annotations


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


class LakeError(LakeBufferError, OSError):
    """The cold lake (S3 or fsspec URL) could not be read or written."""


class LockedError(LakeBufferError, RuntimeError):
    """Another process holds the buffer directory open for writing."""


class WorkerError(LakeBufferError, RuntimeError):
    """A background task failed; raised on the next API call so nothing fails silently."""


class KeyNotFoundError(LakeBufferError, KeyError):
    """A requested rollout key is not in the buffer."""


class OptionError(LakeBufferError, ValueError):
    """An option or argument has a bad name or value (the message names it and what is allowed)."""
