"""Storage tiers behind one ``Tier`` protocol: hot (RAM), warm (local Lance); the WAL backs the hot tier."""

from __future__ import annotations

from .base import Location, Staged, Tier
from .hot import HotBatch, HotTier, table_bytes
from .wal import WriteAheadLog
from .warm import WarmTier

__all__ = ["HotBatch", "HotTier", "Location", "Staged", "Tier", "WarmTier", "WriteAheadLog", "table_bytes"]
