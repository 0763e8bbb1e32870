"""Retention: a bound on stored rows (``max_rows``) and on staleness (``max_policy_lag``).

Checked after each push; when a bound is passed the oldest rows (push order: batch id, then key)
or the rows more than ``max_policy_lag`` versions behind the newest are deleted through
``engine.deletes``, the one delete path, so they leave every tier and the lake (tombstones for
rows already snapshotted) the same way a user's ``delete`` does. The row count comes from the
batch records (no query), so a push under ``max_rows`` pays nothing; ``max_policy_lag`` costs
one query over ``meta`` per push.
"""

from __future__ import annotations

import pyarrow as pa

from . import deletes
from .budget import Budget
from .state import BufferState
from .writeback import WriteBack


class Retention:
    def __init__(self, state: BufferState, budget: Budget, writeback: WriteBack, *, max_rows: int | None,
                 max_policy_lag: int | None) -> None:
        self.s, self.budget, self.writeback = state, budget, writeback
        self.max_rows, self.max_policy_lag = max_rows, max_policy_lag

    @property
    def active(self) -> bool:
        return self.max_rows is not None or self.max_policy_lag is not None

    def stored_rows(self) -> int:
        with self.s.lock:
            return sum(i.rows for i in self.s.batches.values())

    def after_push(self) -> int:
        """Apply the bounds; how many rows were deleted."""
        if not self.active:
            return 0
        deleted = 0
        if self.max_policy_lag is not None:
            deleted += self._apply_lag()
        if self.max_rows is not None:
            excess = self.stored_rows() - self.max_rows
            if excess > 0:
                keys = self._select("retention_oldest", n=excess)
                deleted += deletes.delete(self.s, self.budget, self.writeback, keys, None)
        return deleted

    def _apply_lag(self) -> int:
        keys = self._select("retention_stale", lag=int(self.max_policy_lag or 0))
        if len(keys) == 0:
            return 0
        return deletes.delete(self.s, self.budget, self.writeback, keys, None)

    def _select(self, name: str, **fields: int) -> pa.Array:
        cat = self.s.catalog
        cat.sync()
        return cat.query(cat.render(name, **fields)).column("key").combine_chunks()
