"""Replay events (policy lag measured at replay) and a restored buffer's memory of its source lake."""

from __future__ import annotations

import numpy as np

import lakebuffer as lb


def _push(buf, n=10):
    buf.push({"prompt_id": [f"p{i}" for i in range(n)], "policy_version": np.arange(n),
              "prompt_ids": [[1, 2]] * n, "response_ids": [[3]] * n, "reward": np.ones(n, dtype=np.float32)})


def test_sample_records_replay_events_with_the_replaying_version_and_they_survive_reopen(tmp_path):
    with lb.ReplayBuffer.open(tmp_path / "run", snapshot_interval_s=0) as buf:
        _push(buf)
        buf.set_policy_version(9, step=40)
        keys = buf.sample(4, seed=1, return_keys=True)
        buf.set_policy_version(12)
        buf.sample(3, where="policy_version >= 7", seed=2)
        lag = buf.sql("SELECT r.key, r.replay_version, r.replay_step, r.replay_version - m.policy_version AS lag "
                      "FROM replays r JOIN meta m USING (key) ORDER BY r.replayed_at, r.key")
        assert lag.num_rows == 7
        first = lag.filter(lag.column("replay_step").is_valid())
        assert sorted(first.column("key").to_pylist()) == sorted(keys.to_pylist())
        versions = buf.get(keys, columns=["policy_version"]).column("policy_version").to_pylist()
        assert sorted(first.column("lag").to_pylist()) == sorted(9 - v for v in versions)
        later = lag.filter(lag.column("replay_step").is_null())
        assert set(later.column("replay_version").to_pylist()) == {12}
        assert set(later.column("lag").to_pylist()) <= {3, 4, 5}  # versions 7-9 replayed by 12
    with lb.ReplayBuffer.open(tmp_path / "run", snapshot_interval_s=0) as buf:
        again = buf.sql("SELECT count(*) AS n, count(replay_step) AS stepped FROM replays")
        assert again.to_pylist() == [{"n": 7, "stepped": 4}]


def _inserted_events(buf) -> int:
    """Rows already in DuckDB's ``replays`` table (bypassing ``query``, which would insert the queue)."""
    with buf._catalog.lock:
        return buf._catalog.con.execute("SELECT count(*) FROM replays").fetchall()[0][0]


def test_replay_events_reach_duckdb_only_for_a_statement_that_reads_them(tmp_path):
    """Issue 17: inserting the events before every statement cost every ``sample`` 5-40 ms; they wait
    for a statement that reads ``replays`` (or a full queue), and such a statement sees every one."""
    with lb.ReplayBuffer.open(tmp_path / "run", snapshot_interval_s=0) as buf:
        _push(buf)
        for seed in range(5):
            buf.sample(4, seed=seed)
        assert buf.sql("SELECT count(*) AS n FROM meta").column("n")[0].as_py() == 10
        assert _inserted_events(buf) == 0
        assert buf.sql("SELECT count(*) AS n FROM Replays").column("n")[0].as_py() == 20
        assert _inserted_events(buf) == 20


def test_a_full_replay_event_queue_is_inserted_in_the_background(tmp_path, monkeypatch):
    from lakebuffer import catalog

    monkeypatch.setattr(catalog, "_QUEUED_REPLAY_ROWS", 16)
    with lb.ReplayBuffer.open(tmp_path / "run", snapshot_interval_s=0) as buf:
        _push(buf)
        for seed in range(5):
            buf.sample(8, seed=seed)
        buf.flush()  # the background work has run
        assert _inserted_events(buf) >= 24  # queues past 16 rows went in without a statement asking
        assert buf.sql("SELECT count(*) AS n FROM replays").column("n")[0].as_py() == 40


def test_restored_buffer_remembers_its_source_lake(tmp_path):
    lake = str(tmp_path / "lake")
    with lb.ReplayBuffer.open(tmp_path / "a", lake=lake, run_id="r", snapshot_interval_s=0) as buf:
        _push(buf)
        buf.snapshot(wait=True)
    with lb.ReplayBuffer.open(tmp_path / "b", lake=lake, run_id="r", snapshot_interval_s=0) as buf:
        assert len(buf) == 10
        assert buf.stats()["cold"]["restored_from"] == lake
    with lb.ReplayBuffer.open(tmp_path / "b", snapshot_interval_s=0) as buf:  # reopened without lake=
        cold = buf.stats()["cold"]
        assert cold["url"] == lake and cold["restored_from"] == lake
        assert cold["rows"] == 10
    with lb.ReplayBuffer.open(tmp_path / "a", snapshot_interval_s=0) as buf:  # not restored
        assert buf.stats()["cold"]["restored_from"] is None
