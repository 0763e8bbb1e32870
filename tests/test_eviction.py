"""Issue 16 part 4: semantic eviction (``evict=``) decides which batches stay in RAM."""

from __future__ import annotations

import pyarrow as pa
import pytest

import lakebuffer as lb
from lakebuffer.errors import OptionError
from tests.rollouts import make_rollouts

VERSIONS = [5, 1, 9, 3, 7, 2, 8, 0, 6, 4]
BIG = 50


def batch(version: int, reward: float, seed: int) -> pa.Table:
    t = make_rollouts(64, tokens=1024, seed=seed)
    t = t.set_column(t.schema.get_field_index("policy_version"), "policy_version", pa.array([version] * 64, pa.int64()))
    return t.set_column(t.schema.get_field_index("reward"), "reward", pa.array([reward] * 64, pa.float32()))


def fill(path, evict: str) -> tuple[lb.ReplayBuffer, list[pa.Array]]:
    """Ten ~0.5 MB batches fit a 16 MB budget's high mark together; then one 5 MB batch needs room,
    so the ten compete at once for the little left (a few stay): the policy alone picks which."""
    buf = lb.ReplayBuffer.open(path, memory_limit_mb=16, snapshot_interval_s=0, evict=evict)
    keys = [buf.push(batch(v, reward=float(-v), seed=i)) for i, v in enumerate(VERSIONS)]
    buf.flush()
    assert buf.stats()["hot"]["batches"] == len(VERSIONS)  # nothing evicted yet
    big = pa.concat_tables([batch(BIG, reward=0.0, seed=100 + i) for i in range(7)])
    keys.append(buf.push(big))
    buf.flush()
    return buf, keys


def hot_versions(buf: lb.ReplayBuffer) -> list[int]:
    """Versions of the ten batches still in RAM."""
    hot = buf.sql("SELECT DISTINCT policy_version AS v FROM hot").column("v").to_pylist()
    return sorted(v for v in hot if v != BIG)


def test_oldest_version_keeps_the_newest_policies_hot(tmp_path):
    buf, keys = fill(tmp_path, "oldest_version")
    with buf:
        hot = hot_versions(buf)
        assert 0 < len(hot) < len(VERSIONS)
        assert hot == sorted(VERSIONS)[-len(hot):]  # exactly the newest versions, whatever the push order
        assert len(buf) == 64 * (len(VERSIONS) + 7)  # evicted rows are in the warm tier, not gone
        assert buf.get(pa.concat_arrays(keys)).num_rows == 64 * (len(VERSIONS) + 7)


def test_a_sql_keep_priority_keeps_the_highest_scores_hot(tmp_path):
    # reward = -version: the keep priority "reward" wants the OLDEST versions, the opposite of above
    buf, _ = fill(tmp_path, "reward")
    with buf:
        hot = hot_versions(buf)
        assert 0 < len(hot) < len(VERSIONS)
        assert hot == sorted(VERSIONS)[: len(hot)]


def test_lru_keeps_the_most_recent_pushes_hot(tmp_path):
    buf, _ = fill(tmp_path, "lru")
    with buf:
        hot = hot_versions(buf)
        assert hot == sorted(VERSIONS[-len(hot):])  # the last pushes, whatever their version


def test_stats_name_the_policy(tmp_path):
    with lb.ReplayBuffer.open(tmp_path, snapshot_interval_s=0, evict="policy_version * 10 + reward") as buf:
        assert buf.stats()["hot"]["evict"] == "policy_version * 10 + reward"
    with lb.ReplayBuffer.open(tmp_path, snapshot_interval_s=0) as buf:  # an option of this open, not stored
        assert buf.stats()["hot"]["evict"] == "lru"


@pytest.mark.parametrize("evict, why", [
    ("no_such_column + 1", "no_such_column"),
    ("response_ids", "not metadata columns"),
    ("1; DROP TABLE meta", "evict"),
    ("", "evict"),
])
def test_a_bad_policy_is_refused_before_anything_is_stored(tmp_path, evict, why):
    with pytest.raises(OptionError, match=why):
        lb.ReplayBuffer.open(tmp_path, snapshot_interval_s=0, evict=evict)
    with lb.ReplayBuffer.open(tmp_path, snapshot_interval_s=0) as buf:  # the directory is usable: lock released
        assert len(buf) == 0
