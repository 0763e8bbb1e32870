"""``RolloutReader``: what every readable collection of rollouts offers.

``ReplayBuffer`` (one live run), ``LakeView`` (read-only, every run in a lake) and
``ShardedReplayBuffer`` (N buffers on Ray) implement it; the dataset layer and tools depend on
this protocol, never on one class's internals. A structural ``typing.Protocol`` rather than a
base class: the three share no code, and a user's own reader needs no lakebuffer base to fit.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa


@runtime_checkable
class RolloutReader(Protocol):
    """Read access to rollouts: SQL, sampling, lookups by key, streaming scans and counts."""

    @property
    def schema(self) -> pa.Schema:
        """The rollout schema (every column a reader can return)."""
        ...

    def sql(self, query: str, params: list | dict | None = None) -> pa.Table:
        """DuckDB SQL over the ``rollouts`` view (and ``meta``)."""
        ...

    def sample(self, n: int, where: str | None = None, sampler: Any = "uniform",
               columns: Sequence[str] | None = None, seed: int | None = 0, return_keys: bool = False,
               **options: Any) -> pa.Table | pa.Array:
        """``n`` rollouts matching ``where``, chosen by ``sampler``, deterministic given ``seed``."""
        ...

    def get(self, keys: Sequence[str] | pa.Array, columns: Sequence[str] | None = None) -> pa.Table:
        """Rows by key in the order given; ``KeyNotFoundError`` for an unknown key."""
        ...

    def scan(self, where: str | None = None, columns: Sequence[str] | None = None,
             batch_size: int = 4096) -> Iterator[pa.RecordBatch]:
        """Every matching row once, as record batches (bounded memory)."""
        ...

    def count(self, where: str | None = None) -> int:
        """How many rollouts match ``where`` (all if None)."""
        ...

    def stats(self) -> dict[str, Any]:
        ...

    def close(self) -> None:
        ...
