"""Team sampling: all agents of one multi-agent team, aligned by step."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import _common as c
from .base import Sampler


class TeamSampler(Sampler):
    """``n`` teams (``episode_id``, ``team_id``) with every agent's row at every returned step.

    A team's agents are the distinct ``agent_id`` among all its rows (matching ``where`` or not).
    A step is returned only if it is complete: exactly one row per agent of the team, all matching
    ``where``; incomplete steps are dropped, so every returned step has every agent. A null
    ``team_id`` is one team per episode. Rows without ``agent_id`` make their steps incomplete.

    Options:
        min_steps: a team is eligible with at least this many complete steps (default 1).
        allow_fewer: return fewer teams instead of raising.

    Teams are sampled uniformly without replacement (smallest seeded hash of the pair) and come
    back one after another; within a team rows are ordered by ``(step, agent_id)``, so the rows of
    a team reshape to ``[steps, agents]``. Raises ``NotEnoughRowsError`` when fewer than ``n``
    eligible teams exist.
    """

    name = "team"

    def __init__(self, min_steps: int = 1, allow_fewer: bool = False) -> None:
        if int(min_steps) != min_steps or min_steps < 1:
            raise ValueError(f"min_steps must be a positive integer, got {min_steps!r}")
        self.min_steps = int(min_steps)
        self.allow_fewer = bool(allow_fewer)

    def sample(self, catalog, n: int, where: str | None, rng: np.random.Generator) -> pa.Array:
        n = self.check_n(n)
        seed = self.seed_from(rng)
        if n == 0:
            return c.empty_keys()
        source, pred = c.resolve(catalog, where)
        sql = catalog.render("sample_teams", source=source, where=pred, th=c.value_hash(["e", "t"], seed),
                             min_steps=self.min_steps, n=n)
        rows = catalog.query(sql, sync=False)
        found = len(pc.unique(rows.column("team"))) if rows.num_rows else 0
        self.check_enough(n, found, pred, "teams")
        return rows.column("key").combine_chunks()
