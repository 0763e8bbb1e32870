"""The sampler plugin interface: choose keys from metadata, never payload.

A sampler is a small class with ``sample(catalog, n, where, rng) -> pa.Array`` of keys. It reads
only the catalog's ``meta`` relation (or ``rollouts`` when the predicate needs other columns);
the buffer then fetches the requested columns for the chosen keys.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import pyarrow as pa

from ..errors import NotEnoughRowsError

if TYPE_CHECKING:
    from ..catalog import Catalog


class Sampler(ABC):
    """Base class of every sampling strategy; options go to ``__init__``."""

    name: ClassVar[str] = ""
    #: True for samplers that read ``sample_count`` and so need replays counted before they run.
    needs_counts: ClassVar[bool] = False

    @abstractmethod
    def sample(self, catalog: Catalog, n: int, where: str | None, rng: np.random.Generator) -> pa.Array:
        """Return the keys of the chosen rollouts (a string array, possibly with repeats)."""

    @staticmethod
    def seed_from(rng: np.random.Generator) -> int:
        """A 63-bit seed for SQL-side hashing, drawn from the caller's RNG (keeps determinism)."""
        return int(rng.integers(0, 2**63 - 1))

    @staticmethod
    def not_enough(n: int, found: int, where: str | None) -> NotEnoughRowsError:
        return NotEnoughRowsError(f"asked for {n} rollouts but only {found} match where={where!r}")

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({opts})"
