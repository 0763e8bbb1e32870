"""The first sample of a predicate shape finds its rows in one pass: the hash threshold is sized as if
the predicate kept 1/8 of the rows (``FIRST_GUESS_SHARE``), not all of them. Guessing "all" found too
few rows for a predicate keeping 30%, then counted the population and sampled again: three statements
where one does (a resumed node's first ``sample``: ~17 ms of 140 at 2 GB, 30-50 ms at 8 GB)."""

from __future__ import annotations

import numpy as np

import lakebuffer as lb
from lakebuffer.catalog import Catalog
from lakebuffer.samplers import _common
from tests.rollouts import make_rollouts


def _statements(monkeypatch) -> list[str]:
    seen: list[str] = []
    query = Catalog.query

    def counted(self, sql, *a, **k):
        seen.append(sql)
        return query(self, sql, *a, **k)

    monkeypatch.setattr(Catalog, "query", counted)
    return seen


def test_a_new_predicate_keeping_30_percent_is_sampled_in_one_pass_and_exactly(tmp_path, monkeypatch):
    with lb.ReplayBuffer.open(tmp_path / "b", memory_limit_mb=64, snapshot_interval_s=0) as buf:
        rows = 20_000
        t = make_rollouts(rows, tokens=2, version=np.arange(rows) % 10, seed=5)
        buf.push(t)
        where = "policy_version >= 7"  # 30% of the rows
        buf.sample(1, where="policy_version >= 0")  # (the sampler's own one-time column probe, not counted)
        monkeypatch.setattr(_common, "_POPULATION", type(_common._POPULATION)())  # no shape seen before
        seen = _statements(monkeypatch)
        keys = buf.sample(256, where=where, return_keys=True, seed=3).to_pylist()
        draws = [s for s in seen if "sampling" in s.lower()]
        assert len(draws) == 1 and not [s for s in seen if "count" in s.lower()], seen
        # exact: the 256 matching rows with the smallest seeded hash, as a full pass finds them
        monkeypatch.setattr(_common, "FIRST_GUESS_SHARE", 1e9)  # threshold 1: one pass over every row
        monkeypatch.setattr(_common, "_POPULATION", type(_common._POPULATION)())
        assert sorted(buf.sample(256, where=where, return_keys=True, seed=3).to_pylist()) == sorted(keys)
        got = buf.get(keys, columns=["policy_version"]).column("policy_version").to_pylist()
        assert len(set(keys)) == 256 and min(got) >= 7


def test_a_rare_predicate_still_gets_all_its_rows(tmp_path, monkeypatch):
    """Below the first guess's reach (1% of the rows) the threshold widens until it has them."""
    with lb.ReplayBuffer.open(tmp_path / "b", memory_limit_mb=64, snapshot_interval_s=0) as buf:
        rows = 20_000
        buf.push(make_rollouts(rows, tokens=2, version=np.arange(rows) % 100, seed=6))
        monkeypatch.setattr(_common, "_POPULATION", type(_common._POPULATION)())
        keys = buf.sample(150, where="policy_version = 42", return_keys=True, seed=1).to_pylist()
        assert len(set(keys)) == 150
        assert set(buf.get(keys, columns=["policy_version"]).column("policy_version").to_pylist()) == {42}
