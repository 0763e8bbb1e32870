"""Prioritized-time (p-time) sampling: newer rollouts are exponentially more likely."""

from __future__ import annotations

import math

from . import _common as c
from .priority import WeightedSampler

_DEFAULT_HALF_LIFE = {"policy_version": 4.0, "created_at": 600.0}


class PrioritizedTimeSampler(WeightedSampler):
    """Weight ``2 ** ((x - x_newest) / half_life)`` = ``exp((x - x_newest) / temperature)``.

    ``x`` is ``policy_version`` or ``created_at`` (in seconds): a rollout ``half_life`` versions
    (or seconds) older than another is half as likely. Only weight ratios matter, so no
    "newest" reference is queried: the log-weight is ``x / temperature`` and the sampling keys
    are computed in log space (no underflow however old a row is).

    Options:
        by: ``"policy_version"`` (default), ``"created_at"``, or any numeric SQL expression over
            metadata columns (e.g. ``"step"``).
        half_life: in units of ``by`` (versions, seconds); default 4 versions / 600 s / 4 units.
        temperature: alternative to ``half_life`` (``half_life = temperature * ln 2``); give one.
        replacement: ``False`` (default) weighted without replacement (Efraimidis-Spirakis),
            ``True`` i.i.d. weighted draws (frequencies follow the weights exactly).
        allow_fewer: return fewer keys instead of raising.

    Raises ``NotEnoughRowsError`` when fewer than ``n`` rows match ``where`` (without
    replacement) or none do (with replacement).
    """

    name = "prioritized_time"

    def __init__(self, by: str = "policy_version", half_life: float | None = None,
                 temperature: float | None = None, replacement: bool = False,
                 allow_fewer: bool = False) -> None:
        if half_life is not None and temperature is not None:
            raise ValueError("give half_life or temperature, not both")
        c.check_expression(by, "by")
        if temperature is not None:
            temperature = float(temperature)
            if not temperature > 0:
                raise ValueError(f"temperature must be > 0, got {temperature}")
            half_life = temperature * math.log(2.0)
        elif half_life is None:
            half_life = _DEFAULT_HALF_LIFE.get(by, 4.0)
        half_life = float(half_life)
        if not (half_life > 0 and math.isfinite(half_life)):
            raise ValueError(f"half_life must be a positive number, got {half_life}")
        self.by = by
        self.half_life = half_life
        self.replacement = bool(replacement)
        self.allow_fewer = bool(allow_fewer)

    @property
    def temperature(self) -> float:
        return self.half_life / math.log(2.0)

    def log_weight(self, catalog, source: str, where: str | None) -> str:
        if self.by == "created_at":
            x = "(epoch_us(created_at)::DOUBLE / 1000000.0)"
        else:
            x = f"({c.check_expression(self.by, 'by')})::DOUBLE"
        return f"{x} * {c.literal(1.0 / self.temperature)}"
