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


def update_priority(s: BufferState, keys: Sequence[str] | pa.Array, priority: float | Sequence[float] | object) -> int:
    """Set the priority of each key (a scalar for all, or one value per key); how many were set."""
    names = key_list(keys)
    values = np.asarray(priority, dtype=np.float64)
    if values.ndim == 0:
        values = np.full(len(names), float(values))
    values = values.reshape(-1)
    if len(values) != len(names):
        raise OptionError(f"update_priority: {len(names)} keys but {len(values)} priorities (give one per key or a scalar)")
    if len(names) == 0:
        return 0
    if not np.all(np.isfinite(values)) or np.any(values < 0):
        bad = values[~(np.isfinite(values) & (values >= 0))][0]
        raise OptionError(f"update_priority: priorities must be finite and >= 0, got {bad!r}")
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
