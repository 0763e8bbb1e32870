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

    Segments are sampled uniformly without replacement among all valid segments (the valid
    starts of smallest seeded hash; candidates are drawn by a hash threshold, then checked);
    distinct segments may overlap (share rows) unless ``stride >= length``. Returns
    ``n * length`` keys, segment after segment, each in step order. Raises
    ``NotEnoughRowsError`` when fewer than ``n`` segments exist.
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
        fields = {"source": source, "where": pred, "h": c.key_hash(catalog, source, seed),
                  "stride": self.stride, "length": self.length, "last": self.length - 1}
        cache_key = ("segment", id(catalog), source, self.length, self.stride, c.shape_of(pred))
        k = c.candidates_to_draw(cache_key, n, 0.5)
        with catalog.lock:
            while True:
                starts, exhausted = c.smallest_by_hash(catalog, k, template="sample_segment_starts",
                                                       fields=fields, cache_key=cache_key)
                rows = catalog.query(catalog.render("sample_segment_rows", **fields), sync=False,
                                     sample_starts=starts.select(["key", "e", "a", "step"]))
                stats = rows.group_by("start").aggregate([("step", "count"), ("step", "count_distinct")])
                ok = pc.and_(pc.equal(stats.column("step_count"), self.length),
                             pc.equal(stats.column("step_count_distinct"), self.length))
                valid = pc.is_in(starts.column("key"), value_set=stats.column("start").filter(ok))
                valid_idx = np.flatnonzero(valid.to_numpy(zero_copy_only=False))
                if len(valid_idx) >= n or exhausted:
                    break
                k = c.next_k(k, n, len(valid_idx), starts.num_rows, len(valid_idx))
        c.remember_pass_rate(cache_key, len(valid_idx), starts.num_rows)
        self.check_enough(n, len(valid_idx), pred, "segments")
        chosen = starts.column("key").take(pa.array(valid_idx[:n], pa.int64()))
        return c.rows_of_chosen(rows, "start", chosen, [("step", "ascending")])

