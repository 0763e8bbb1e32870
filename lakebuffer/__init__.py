"""lakebuffer: a columnar, tiered, persistent replay buffer for RL rollouts.

One entry point: ``lakebuffer.ReplayBuffer``.
"""

from __future__ import annotations

import os

# Before any Rust library loads (deltalake, datafusion): mimalloc keeps freed pages mapped for a while by
# default, which is anonymous RSS the RAM budget pays for (the cold-path memory run at 16x: push 191 -> 130 MB,
# cold sample + get 340 -> 289 MB of growth); a user's own setting wins.
os.environ.setdefault("MIMALLOC_PURGE_DELAY", "0")

from . import samplers  # noqa: E402
from .buffer import ReplayBuffer
from .errors import (
    BackpressureError,
    ClosedError,
    CorruptionError,
    DiskFullError,
    KeyNotFoundError,
    LakeBufferError,
    LakeError,
    LockedError,
    NotEnoughRowsError,
    OptionError,
    QueryError,
    ReadOnlyError,
    SamplerError,
    SchemaError,
    StorageError,
    WorkerError,
)
from .options import BufferOptions
from .readers import RolloutReader
from .results import Snapshot
from .schema import ROLLOUT_SCHEMA

__version__ = "0.1.0"

__all__ = [
    "ROLLOUT_SCHEMA",
    "BackpressureError",
    "BufferOptions",
    "ClosedError",
    "CorruptionError",
    "DiskFullError",
    "KeyNotFoundError",
    "LakeBufferError",
    "LakeError",
    "LockedError",
    "NotEnoughRowsError",
    "OptionError",
    "QueryError",
    "ReadOnlyError",
    "ReplayBuffer",
    "RolloutReader",
    "SamplerError",
    "SchemaError",
    "Snapshot",
    "StorageError",
    "WorkerError",
    "samplers",
]
