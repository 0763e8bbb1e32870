"""Storage tiers behind one ``Tier`` protocol: hot (RAM), warm (memory-mapped Arrow IPC files); the WAL backs the hot tier."""

from __future__ import annotations

from .base import Location, Staged, Tier
from .hot import HotBatch, HotTier, table_bytes
from .wal import WriteAheadLog
from .warm import WarmTier, has_fragments, warm_path

__all__ = ["HotBatch", "HotTier", "Location", "Staged", "Tier", "WarmTier", "WriteAheadLog", "has_fragments", "table_bytes", "warm_path"]
