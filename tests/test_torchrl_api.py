"""TorchRL-shaped API on ReplayBuffer: extend, len, iter, sample(return_info=True) with importance
weights, update_priority (persisted) and retention bounds (max_rows, max_policy_lag)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import lakebuffer as lb
from tests.rollouts import make_rollouts


def _with_advantage(n: int, adv, seed: int = 0, version=0) -> pa.Table:
    t = make_rollouts(n, tokens=4, seed=seed, version=version)
    return t.append_column("advantage", pa.array(np.asarray(adv, dtype=np.float32)))


def test_extend_len_and_iter(tmp_path):
    with lb.ReplayBuffer.open(tmp_path / "b", snapshot_interval_s=0) as buf:
        k1 = buf.extend(make_rollouts(30, tokens=4))
        k2 = buf.push(make_rollouts(20, tokens=4, seed=1))
        assert len(buf) == 50
        batches = list(buf)
        assert all(isinstance(b, pa.RecordBatch) for b in batches)
        seen = pa.Table.from_batches(batches).column("key").to_pylist()
        assert sorted(seen) == sorted(k1.to_pylist() + k2.to_pylist())


def test_importance_weights_match_hand_computation(tmp_path):
    # stored as float32: compute by hand from the same values
    adv = np.array([0.1, -0.5, 2.0, 0.0, 1.5, -3.0, 0.7, 0.2, 4.0, -1.0], dtype=np.float32).astype(np.float64)
    alpha, beta, eps = 0.7, 0.6, 0.05
    with lb.ReplayBuffer.open(tmp_path / "b", snapshot_interval_s=0) as buf:
        keys = buf.push(_with_advantage(10, adv)).to_pylist()
        rows, info = buf.sample(4, sampler="priority", alpha=alpha, beta=beta, eps=eps, return_info=True,
                                where="reward >= 0", seed=3)
        assert info["keys"].to_pylist() == rows.column("key").to_pylist()
        p = (np.abs(adv) + eps) ** alpha
        P = p / p.sum()
        w = (len(adv) * P) ** -beta
        w = w / w.max()
        idx = [keys.index(k) for k in info["keys"].to_pylist()]
        np.testing.assert_allclose(info["weights"].to_numpy(), w[idx], rtol=1e-9)
        np.testing.assert_allclose(info["probabilities"].to_numpy(), P[idx], rtol=1e-9)
        # the population is what `where` matches: restrict it and N, sum and max change with it
        adv_f = np.abs(adv[[0, 1, 2]]) + eps
        sub = "key IN ('" + "','".join(keys[:3]) + "')"
        _, info = buf.sample(2, where=sub, sampler="priority", alpha=alpha, beta=beta, eps=eps,
                             return_info=True, return_keys=True, seed=1)
        p = adv_f ** alpha
        w = (3 * p / p.sum()) ** -beta
        w = w / w.max()
        idx = [keys.index(k) for k in info["keys"].to_pylist()]
        np.testing.assert_allclose(info["weights"].to_numpy(), w[idx], rtol=1e-9)


def test_return_info_for_unweighted_sampler_has_keys_only(tmp_path):
    with lb.ReplayBuffer.open(tmp_path / "b", snapshot_interval_s=0) as buf:
        buf.push(make_rollouts(10, tokens=4))
        rows, info = buf.sample(3, return_info=True)
        assert set(info) == {"keys"}
        assert info["keys"].to_pylist() == rows.column("key").to_pylist()


def _draw_counts(buf, n=400):
    keys = buf.sample(n, sampler="priority", replacement=True, return_keys=True, seed=7)
    vals, counts = np.unique(np.asarray(keys.to_pylist()), return_counts=True)
    return dict(zip(vals.tolist(), counts.tolist()))


def test_update_priority_changes_sampling_and_survives_reopen(tmp_path):
    path = tmp_path / "b"
    with lb.ReplayBuffer.open(path, snapshot_interval_s=0) as buf:
        keys = buf.push(_with_advantage(10, np.ones(10))).to_pylist()
        before = _draw_counts(buf)
        assert max(before.values()) < 100  # ~40 each
        assert buf.update_priority([keys[3]], 1000.0) == 1
        assert buf.update_priority(keys[5:7], [0.0, 0.0]) == 2  # never drawn again
        after = _draw_counts(buf)
        assert after[keys[3]] > 300
        assert keys[5] not in after and keys[6] not in after
        _, info = buf.sample(2, sampler="priority", return_info=True, return_keys=True, seed=1)
        assert keys[3] in info["keys"].to_pylist()
        with pytest.raises(lb.KeyNotFoundError):
            buf.update_priority(["nope"], 1.0)
        with pytest.raises(lb.OptionError):
            buf.update_priority(keys[:2], [1.0])
        with pytest.raises(lb.OptionError):
            buf.update_priority(keys[:1], -1.0)
    with lb.ReplayBuffer.open(path, snapshot_interval_s=0) as buf:
        assert _draw_counts(buf) == after
        buf.delete(keys=[keys[3]])  # a deleted row's priority goes with it
        assert buf.index.priorities().keys() == {keys[5], keys[6]}
        assert buf.sql("SELECT count(*) AS n FROM priorities").column("n")[0].as_py() == 2


def test_retention_keeps_exactly_max_rows_newest(tmp_path):
    path = tmp_path / "b"
    pushed: list[str] = []
    with lb.ReplayBuffer.open(path, snapshot_interval_s=0, max_rows=25) as buf:
        for i in range(5):
            pushed += buf.push(make_rollouts(10, tokens=4, seed=i)).to_pylist()
            assert len(buf) == min(10 * (i + 1), 25)
        assert sorted(buf.sql("SELECT key FROM rollouts").column("key").to_pylist()) == sorted(pushed[-25:])
    with lb.ReplayBuffer.open(path, snapshot_interval_s=0, max_rows=25) as buf:
        assert len(buf) == 25
        buf.push(make_rollouts(5, tokens=4, seed=9))
        assert len(buf) == 25


def test_retention_by_policy_lag(tmp_path):
    with lb.ReplayBuffer.open(tmp_path / "b", snapshot_interval_s=0, max_policy_lag=2) as buf:
        for v in range(6):
            buf.push(make_rollouts(4, tokens=4, version=v, seed=v))
        versions = buf.sql("SELECT DISTINCT policy_version AS v FROM rollouts ORDER BY v").column("v").to_pylist()
        assert versions == [3, 4, 5]
    with pytest.raises(lb.OptionError):
        lb.ReplayBuffer.open(tmp_path / "c", max_rows=-1)
