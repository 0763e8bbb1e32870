"""Tier conformance, fsspec style: one abstract suite, one subclass (fixture) per ``Tier`` implementation.

Every tier must: round-trip staged rows through ``take`` with projection (only the asked
columns, in the asked row order), show nothing before ``publish``, hide deleted rows, and count
its rows in ``stats``. A new tier (the cold lake) adds a subclass with its own ``tier`` fixture.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from lakebuffer.schema import ROLLOUT_SCHEMA, conform
from lakebuffer.tiers import HotTier, Location, Tier, WarmTier
from tests.rollouts import make_rollouts


def rows(n: int, first: int = 0, seed: int = 0) -> pa.Table:
    keys = pa.array([f"k-{i:06d}" for i in range(first, first + n)])
    return conform(make_rollouts(n, tokens=16, seed=seed), ROLLOUT_SCHEMA, run_id="r",
                   now=np.datetime64(0, "us"), keys=keys)


def visible(tier: Tier) -> int:
    """Rows the tier's Arrow source shows (a table or a dataset)."""
    src = tier.arrow_source()
    return src.num_rows if isinstance(src, pa.Table) else src.count_rows()


class AbstractTierTests:
    """Mixed into one subclass per implementation, which provides the ``tier`` fixture."""

    def test_is_a_tier(self, tier):
        assert isinstance(tier, Tier)
        assert isinstance(tier.name, str) and tier.name

    def test_stage_take_round_trip_with_projection(self, tier):
        t = rows(40)
        staged = tier.stage(t, part=7)
        tier.publish(staged)
        order = np.array([39, 0, 17, 3, 3, 25])
        got = tier.take(Location.of(staged.part, order), ["reward", "key"])
        assert got.column_names == ["reward", "key"]
        assert got.column("key").to_pylist() == [f"k-{i:06d}" for i in order]
        assert got.column("reward").to_pylist() == t.column("reward").take(pa.array(order)).to_pylist()

    def test_take_across_parts_keeps_the_asked_order(self, tier):
        a, b = tier.stage(rows(10), part=1), None
        tier.publish(a)
        b = tier.stage(rows(10, first=10, seed=1), part=2)
        tier.publish(b)
        where = Location.concat([Location.of(b.part, [9, 0]), Location.of(a.part, [5]), Location.of(b.part, [4])])
        got = tier.take(where, ["key"])
        assert got.column("key").to_pylist() == ["k-000019", "k-000010", "k-000005", "k-000014"]

    def test_nothing_visible_before_publish(self, tier):
        before_rows, before_version = tier.stats()["rows"], tier.version
        staged = tier.stage(rows(12), part=3)
        assert tier.stats()["rows"] == before_rows
        assert visible(tier) == before_rows
        assert tier.version == before_version
        tier.publish(staged)
        assert tier.stats()["rows"] == before_rows + 12 == visible(tier)
        assert tier.version != before_version

    def test_delete_hides_rows(self, tier):
        tier.publish(tier.stage(rows(20), part=4))
        version = tier.version
        gone = ["k-000003", "k-000011"]
        tier.delete(gone)
        assert tier.stats()["rows"] == 18 == visible(tier)
        assert tier.version != version
        src = tier.arrow_source()
        keys = (src if isinstance(src, pa.Table) else src.to_table(columns=["key"])).column("key").to_pylist()
        assert not set(gone) & set(keys) and len(keys) == 18

    def test_empty_take(self, tier):
        got = tier.take(Location.of(0, []), ["key", "reward"])
        assert got.num_rows == 0 and got.column_names == ["key", "reward"]


class TestHotTier(AbstractTierTests):
    @pytest.fixture
    def tier(self):
        return HotTier(ROLLOUT_SCHEMA)


class TestWarmTier(AbstractTierTests):
    @pytest.fixture
    def tier(self, tmp_path):
        return WarmTier(tmp_path / "warm", ROLLOUT_SCHEMA)
