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

    Teams are sampled uniformly without replacement (the eligible teams of smallest seeded hash
    of the pair; candidates come from a hash threshold, then are checked) and come back one after
    another; within a team rows are ordered by ``(step, agent_id)``, so a team's rows reshape to
    ``[steps, agents]``. Raises ``NotEnoughRowsError`` when fewer than ``n`` eligible teams exist.
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
        fields = {"source": source, "where": pred, "th": c.value_hash(["episode_id", "team_id"], seed)}
        cache_key = ("team", id(catalog), source, self.min_steps, c.shape_of(pred))
        k = c.candidates_to_draw(cache_key, n, 0.8)
        with catalog.lock:
            while True:
                teams, exhausted = c.smallest_by_hash(catalog, k, template="sample_team_candidates",
                                                      fields=fields, cache_key=cache_key)
                rows = catalog.query(catalog.render("sample_team_rows", **fields), sync=False,
                                     sample_teams=teams.select(["e", "tm", "h"]))
                steps = rows.group_by("h").aggregate([("step", "count_distinct")])
                eligible = steps.column("h").filter(pc.greater_equal(steps.column("step_count_distinct"),
                                                                     self.min_steps))
                valid_idx = np.flatnonzero(pc.is_in(teams.column("h"), value_set=eligible)
                                           .to_numpy(zero_copy_only=False))
                if len(valid_idx) >= n or exhausted:
                    break
                k = c.next_k(k, n, len(valid_idx), teams.num_rows, len(valid_idx))
        c.remember_pass_rate(cache_key, len(valid_idx), teams.num_rows)
        self.check_enough(n, len(valid_idx), pred, "teams")
        chosen = teams.column("h").take(pa.array(valid_idx[:n], pa.int64()))
        return c.rows_of_chosen(rows, "h", chosen, [("step", "ascending"), ("agent_id", "ascending")])

