"""The ``Tier`` protocol: what every storage tier (hot RAM, warm local disk, the cold lake) offers.

Why a protocol and not a base class: the tiers share no code, only a shape, and the cold tier
(the lake package) must be able to implement it without importing anything from here but these
names. The shape is the one the engine needs to move data one way (hot -> warm -> cold) while
reads reach every tier:

* ``stage`` writes rows where no reader sees them yet and says where they went (a ``Staged``);
  ``publish`` makes them visible. The engine publishes together with the index update, under
  its lock, so a row is never visible twice or not at all.
* ``take`` reads rows by ``Location`` (numbered parts and row positions, vectorised: one call for
  many parts), only the asked columns, in the asked order. A cold tier answers it with
  (file, row) locations.
* ``delete`` hides rows by key; ``arrow_source`` is the Arrow object (table, dataset) the catalog
  registers for SQL, and ``version`` changes whenever it would change; ``stats`` counts rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa


@dataclass(frozen=True)
class Location:
    """Where rows live inside one tier: row ``row[i]`` of part ``part[i]`` (int64 arrays).

    A part is the tier's unit of storage: a hot batch id, a warm fragment id, a cold file number.
    """

    part: np.ndarray
    row: np.ndarray

    @classmethod
    def of(cls, part: int | np.ndarray, row: Sequence[int] | np.ndarray) -> Location:
        """Locations of ``row`` positions in ``part`` (one part id for all, or one per row)."""
        rows = np.asarray(row, dtype=np.int64)
        parts = np.broadcast_to(np.asarray(part, dtype=np.int64), rows.shape).copy()
        return cls(parts, rows)

    @classmethod
    def concat(cls, locations: Sequence[Location]) -> Location:
        if not locations:
            return cls(np.zeros(0, np.int64), np.zeros(0, np.int64))
        return cls(np.concatenate([loc.part for loc in locations]), np.concatenate([loc.row for loc in locations]))

    def __len__(self) -> int:
        return len(self.row)


@dataclass(frozen=True)
class Staged:
    """Rows a tier has written but not yet published: their part and what verifies it later."""

    part: int
    rows: int
    nbytes: int
    files: tuple[str, ...] = ()
    checksum: int | None = None
    handle: Any = None  # the tier's own token for ``publish`` (a table, a dataset version)


@runtime_checkable
class Tier(Protocol):
    """A storage tier (see the module docstring for the contract)."""

    name: str

    @property
    def version(self) -> int:
        """Changes whenever ``arrow_source`` would return something different."""
        ...

    def stage(self, table: pa.Table, part: int | None = None) -> Staged:
        """Write ``table`` invisibly; ``part`` is the caller's id where the tier has none of its own."""
        ...

    def publish(self, staged: Staged) -> None:
        """Make staged rows visible to ``take``, ``arrow_source`` and ``stats``."""
        ...

    def take(self, where: Location, columns: Sequence[str]) -> pa.Table:
        """The rows at ``where``, in that order, with only ``columns``."""
        ...

    def delete(self, keys: Sequence[str]) -> None:
        """Hide the rows with these keys."""
        ...

    def arrow_source(self) -> Any:
        """An Arrow table or dataset of the visible rows (what the catalog registers)."""
        ...

    def stats(self) -> dict[str, int]:
        """At least ``rows`` (visible rows) and ``bytes``."""
        ...
