"""The sampler plugin interface: choose keys from metadata, never payload.

A sampler is a small class with ``sample(catalog, n, where, rng) -> pa.Array`` of keys (subclassing
``Sampler`` gives the defaults below; any class with that method also registers, see ``registry``). It reads
only the catalog's ``meta`` relation (or ``rollouts`` when the predicate needs other columns);
the buffer then fetches the requested columns for the chosen keys, in the order returned.

Contract every built-in sampler keeps:

* deterministic given ``rng`` (SQL-side randomness is a seeded hash whose seed comes from
  ``Sampler.seed_from(rng)``) and the set of matching rows: not their tier or insertion order;
* combinable with the caller's SQL ``where`` (a bad one raises ``QueryError``);
* when fewer rows (groups, episodes, ...) match than asked it raises ``NotEnoughRowsError``,
  unless it was built with ``allow_fewer=True``, in which case it returns what there is.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar

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
    #: return fewer keys instead of raising ``NotEnoughRowsError`` (an instance option).
    allow_fewer: bool = False
    #: True for samplers whose constructor passes unknown options on to another sampler.
    forwards_options: ClassVar[bool] = False

    @classmethod
    def passed_on_options(cls, options: dict[str, Any]) -> list[str]:
        """Option names, beside ``__init__``'s own, that a sampler built with ``options`` accepts."""
        return []

    @abstractmethod
    def sample(self, catalog: Catalog, n: int, where: str | None, rng: np.random.Generator) -> pa.Array:
        """Return the keys of the chosen rollouts (a string array, possibly with repeats)."""

    def info(self, catalog: Catalog, keys: pa.Array, where: str | None) -> dict[str, pa.Array]:
        """What ``sample(..., return_info=True)`` returns beside the rows: the keys drawn; weighted
        samplers add importance weights."""
        return {"keys": keys}

    @staticmethod
    def seed_from(rng: np.random.Generator) -> int:
        """A 63-bit seed for SQL-side hashing, drawn from the caller's RNG (keeps determinism)."""
        return int(rng.integers(0, 2**63 - 1))

    @staticmethod
    def not_enough(n: int, found: int, where: str | None, unit: str = "rollouts") -> NotEnoughRowsError:
        return NotEnoughRowsError(f"asked for {n} {unit} but only {found} match where={where!r}")

    def check_enough(self, n: int, found: int, where: str | None, unit: str = "rollouts") -> None:
        """Raise ``NotEnoughRowsError`` if ``found < n`` and this sampler does not allow fewer."""
        if found < n and not self.allow_fewer:
            raise self.not_enough(n, found, where, unit)

    @staticmethod
    def check_n(n: int) -> int:
        n = int(n)
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        return n

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({opts})"
