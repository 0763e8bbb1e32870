"""lakebuffer: a columnar, tiered, persistent replay buffer for RL rollouts.

One entry point: ``lakebuffer.ReplayBuffer``.
"""

from __future__ import annotations

from . import samplers
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
