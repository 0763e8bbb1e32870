"""``update_priority``: TorchRL-style per-rollout priorities for the ``priority`` sampler.

A priority set here replaces, for that rollout, the value of the sampler's ``priority`` expression
(default ``abs(advantage)``). The catalog owns the values (a ``priorities`` table next to ``meta``)
and hands them to the index for persistence before they apply, so they survive a reopen; a
delete removes them with the row.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from ..errors import KeyNotFoundError, OptionError
from ..schema import key_list
from .state import BufferState


def priority_values(n: int, priority: float | Sequence[float] | object) -> np.ndarray:
    """One finite, non-negative priority for each of ``n`` keys (a scalar is repeated), else
    ``OptionError`` (also checked by a sharded buffer before any shard is asked)."""
    values = np.asarray(priority, dtype=np.float64)
    values = np.full(n, float(values)) if values.ndim == 0 else values.reshape(-1)
    if len(values) != n:
        raise OptionError(f"update_priority: {n} keys but {len(values)} priorities (give one per key or a scalar)")
    if not np.all(np.isfinite(values) & (values >= 0)):
        bad = values[~(np.isfinite(values) & (values >= 0))][0]
        raise OptionError(f"update_priority: priorities must be finite and >= 0, got {bad!r}")
    return values


def update_priority(s: BufferState, keys: Sequence[str] | pa.Array, priority: float | Sequence[float] | object) -> int:
    """Set the priority of each key (a scalar for all, or one value per key); how many were set."""
    names = key_list(keys)
    values = priority_values(len(names), priority)
    if len(names) == 0:
        return 0
    _, _, found = s.index.lookup(names)
    if not found.all():
        missing = names[int(np.flatnonzero(~found)[0])]
        raise KeyNotFoundError(f"update_priority: key {missing!r} is not in the buffer")
    # a key given twice: its last value wins (np.unique keeps the first, so look from the end)
    arr = np.asarray(names, dtype=object)[::-1]
    _, first = np.unique(arr, return_index=True)
    keep = np.sort(first)
    s.catalog.set_priorities(pa.array(arr[keep], pa.string()), pa.array(values[::-1][keep]))
    return len(keep)
