"""Episode sampling: whole episodes (multi-turn / agentic trajectories) in step order."""

from __future__ import annotations

from .group import GroupSampler


class EpisodeSampler(GroupSampler):
    """Whole episodes by ``episode_id``: every row of each sampled episode, in step order.

    Options:
        unit: ``"episodes"`` (default): ``n`` episodes; ``"rows"``: the fewest whole episodes
            holding at least ``n`` rows.
        match: ``"all"`` (default): an episode is eligible if every row matches ``where``;
            ``"any"``: if at least one does. The whole episode is returned either way.
        allow_fewer: return fewer episodes instead of raising.

    Episodes are equally likely whatever their length and come back one after another in random
    order; within an episode rows are ordered by ``(step, team_id, agent_id, key)``. Rows without
    an ``episode_id`` are never chosen. Raises ``NotEnoughRowsError`` when fewer than ``n``
    episodes (or rows) match.
    """

    name = "episode"
    by = "episode_id"
    unit_name = "episodes"

    def row_order(self) -> list[tuple[str, str]]:
        return [("step", "ascending"), ("team_id", "ascending"), ("agent_id", "ascending"), ("key", "ascending")]
