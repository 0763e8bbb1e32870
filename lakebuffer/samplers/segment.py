"""Segment sampling: fixed-length chunks of consecutive steps, for recurrent policies."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import _common as c
from .base import Sampler


class SegmentSampler(Sampler):
    """``n`` segments of ``length`` consecutive steps of one track, each in step order.

    A track is one agent's rows of one episode (``episode_id``, ``agent_id``; single-agent data
    has a null ``agent_id`` and one track per episode). A segment is ``length`` rows of a track
    with consecutive ``step`` values (no gap, no duplicate step), all matching ``where``.

    Options:
        length: steps per segment (required, >= 1).
        stride: only segments starting at a step divisible by ``stride`` (default 1: any start;
            ``stride=length`` gives non-overlapping aligned chunks).
        allow_fewer: return fewer segments instead of raising.

    Segments are sampled uniformly without replacement among all valid segments; distinct
    segments may overlap (share rows) unless ``stride >= length``. Returns ``n * length`` keys,
    segment after segment, each in step order. Raises ``NotEnoughRowsError`` when fewer than
    ``n`` segments exist.
    """

    name = "segment"

    def __init__(self, length: int, stride: int = 1, allow_fewer: bool = False) -> None:
        if int(length) != length or length < 1:
            raise ValueError(f"length must be a positive integer, got {length!r}")
        if int(stride) != stride or stride < 1:
            raise ValueError(f"stride must be a positive integer, got {stride!r}")
        self.length = int(length)
        self.stride = int(stride)
        self.allow_fewer = bool(allow_fewer)

    def sample(self, catalog, n: int, where: str | None, rng: np.random.Generator) -> pa.Array:
        n = self.check_n(n)
        seed = self.seed_from(rng)
        if n == 0:
            return c.empty_keys()
        source, pred = c.resolve(catalog, where)
        sql = catalog.render("sample_segments", source=source, where=pred, h=c.value_hash(["key"], seed),
                             length=self.length, last=self.length - 1, stride=self.stride, n=n)
        rows = catalog.query(sql, sync=False)
        found = len(pc.unique(rows.column("seg"))) if rows.num_rows else 0
        self.check_enough(n, found, pred, "segments")
        return rows.column("key").combine_chunks()
