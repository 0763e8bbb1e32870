"""Reward filtering (PF-PPO style): keep high-reward rollouts, by threshold or top fraction."""

from __future__ import annotations

from typing import Any

from . import _common as c
from .filtered import FilteredSampler


class RewardSampler(FilteredSampler):
    """Samples among rows whose reward passes a threshold or is in the top fraction.

    Options (give ``min_reward`` or ``top_fraction``):
        min_reward: keep rows with ``reward >= min_reward``.
        top_fraction: keep the rows whose reward is in the top ``top_fraction`` (0 < f <= 1) of
            the rows matching ``where``: ``reward >= quantile_disc(reward, 1 - f)``, so rows tied
            at the cut are all kept.
        bottom_fraction: with ``top_fraction``, also keep the bottom fraction (PF-PPO's
            "best + worst" filtering); default 0.
        base: the sampler applied to the kept rows (default ``"uniform"``); other options go to it.

    Raises ``NotEnoughRowsError`` when fewer than ``n`` kept rows match ``where``.
    """

    name = "reward"

    def __init__(self, min_reward: float | None = None, top_fraction: float | None = None,
                 bottom_fraction: float = 0.0, base: Any = "uniform", **base_options: Any) -> None:
        if (min_reward is None) == (top_fraction is None):
            raise ValueError("give exactly one of min_reward= or top_fraction=")
        if top_fraction is not None and not 0.0 < float(top_fraction) <= 1.0:
            raise ValueError(f"top_fraction must be in (0, 1], got {top_fraction!r}")
        if not 0.0 <= float(bottom_fraction) < 1.0:
            raise ValueError(f"bottom_fraction must be in [0, 1), got {bottom_fraction!r}")
        if bottom_fraction and top_fraction is None:
            raise ValueError("bottom_fraction goes with top_fraction")
        self.min_reward = None if min_reward is None else float(min_reward)
        self.top_fraction = None if top_fraction is None else float(top_fraction)
        self.bottom_fraction = float(bottom_fraction)
        if self.min_reward is not None:
            c.literal(self.min_reward)
        super().__init__(base, **base_options)

    def extra_predicate(self, catalog, where: str | None) -> str:
        if self.min_reward is not None:
            return f"reward >= {c.literal(self.min_reward)}"
        source, pred = c.resolve(catalog, where)
        sql = catalog.render("sample_reward_cuts", source=source, where=pred,
                             hi=c.literal(1.0 - self.top_fraction), lo=c.literal(self.bottom_fraction))
        row = catalog.query(sql, sync=False).to_pylist()[0]
        if row["hi"] is None:
            return "FALSE"
        keep = f"reward >= {c.literal(float(row['hi']))}"
        if self.bottom_fraction > 0:
            keep = f"{keep} OR reward <= {c.literal(float(row['lo']))}"
        return keep
