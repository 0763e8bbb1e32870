"""Samples and deletes at the same time (issue 24 item 5).

Before: a ``sample()`` concurrent with ``delete()`` raised ``KeyNotFoundError`` for a key it had just
drawn (the delete ran between the selection and the fetch), and under 4 producer threads a delete
waited for the task queue to be empty, which the producers kept refilling (2 deletes in 60 s).
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import lakebuffer as lb
from tests.rollouts import make_rollouts

DELETE_BOUND_S = 10.0  # generous for a loaded 2-core machine; a quiet one takes well under a second


def _fill(buf, batches: int, rows: int) -> dict[str, float]:
    """Push ``batches`` batches; the reward each key was pushed with."""
    reward: dict[str, float] = {}
    for i in range(batches):
        t = make_rollouts(rows, tokens=16, seed=i)
        keys = buf.push(t)
        reward.update(zip(keys.to_pylist(), t.column("reward").to_pylist()))
    return reward


def test_samples_concurrent_with_deletes_return_existing_rows(tmp_path):
    with lb.ReplayBuffer.open(tmp_path / "b", memory_limit_mb=8, snapshot_interval_s=0) as buf:
        reward = _fill(buf, 20, 50)
        buf.evict_all()
        reward |= _fill(buf, 20, 50)  # 2,000 rows, half warm, half hot
        assert buf.stats()["warm"]["rows"] > 0 and buf.stats()["hot"]["rows"] > 0
        order = list(reward)
        np.random.default_rng(1).shuffle(order)
        to_delete = order[:1200]
        deleted_at: dict[str, float] = {}
        errors: list[BaseException] = []
        stop = threading.Event()
        samples: list[tuple[float, list[str], list[float]]] = []

        def sampler(seed: int) -> None:
            i = 0
            try:
                while not stop.is_set():
                    started = time.monotonic()
                    t = buf.sample(48, columns=["key", "reward"], seed=seed * 100_000 + i)
                    samples.append((started, t.column("key").to_pylist(), t.column("reward").to_pylist()))
                    i += 1
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        def deleter() -> None:
            try:
                for j in range(0, len(to_delete), 40):
                    chunk = to_delete[j:j + 40]
                    assert buf.delete(keys=chunk) == len(chunk)
                    done = time.monotonic()
                    deleted_at.update(dict.fromkeys(chunk, done))
                    time.sleep(0.02)  # let samples run between deletes
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=sampler, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        d = threading.Thread(target=deleter)
        d.start()
        d.join(120)
        stop.set()
        for t in threads:
            t.join(60)
        assert not errors, repr(errors[0])
        assert len(deleted_at) == len(to_delete) and len(samples) > 10
        for started, keys, rewards in samples:
            assert len(keys) == 48 and len(set(keys)) == 48
            for k, r in zip(keys, rewards):
                assert r == reward[k]  # the row is the one pushed under that key
                gone = deleted_at.get(k)
                assert gone is None or started < gone, f"{k} sampled after its delete returned"
        assert len(buf) == 2000 - 1200


@pytest.mark.slow  # ~6 s of four producers and periodic snapshots: make test-slow
def test_delete_completes_under_four_producers(tmp_path):
    # periodic snapshots to a local lake, back to back while writes keep the lake behind: what kept
    # the task queue from ever being empty
    with lb.ReplayBuffer.open(tmp_path / "b", memory_limit_mb=256, snapshot_interval_s=1,
                              push_timeout_s=120) as buf:
        first = buf.push(make_rollouts(400, tokens=16)).to_pylist()
        stop = threading.Event()
        errors: list[BaseException] = []
        pushed = [0]

        def producer(seed: int) -> None:
            batch = make_rollouts(64, tokens=256, seed=seed)
            try:
                while not stop.is_set():
                    buf.push(batch)
                    pushed[0] += 1
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        producers = [threading.Thread(target=producer, args=(k,)) for k in range(4)]
        for t in producers:
            t.start()
        try:
            time.sleep(1.5)  # the producers are at full speed, write-back and snapshots running
            took = []
            for j in range(4):
                t0 = time.monotonic()
                assert buf.delete(keys=first[j * 100:(j + 1) * 100]) == 100
                took.append(time.monotonic() - t0)
            by_where = time.monotonic()
            assert buf.delete(where="reward < 0.01") >= 0
            took.append(time.monotonic() - by_where)
        finally:
            stop.set()
            for t in producers:
                t.join(120)
        assert not errors, repr(errors[0])
        assert pushed[0] > 20
        assert max(took) < DELETE_BOUND_S, f"delete took {[round(x, 2) for x in took]} s under 4 producers"
        assert buf.count(f"key = '{first[0]}'") == 0 and buf.count(f"key = '{first[399]}'") == 0
        print("delete seconds under 4 producers:", [round(x, 2) for x in took])
        # deletes that ran while snapshot steps were uploading those rows: the lake drops them too
        buf.snapshot()
        with lb.ReplayBuffer.open_lake(buf.lake_url) as view:
            gone = view.sql("SELECT count(*) AS n FROM rollouts WHERE key IN (SELECT unnest(?))", [first])
            assert gone.column("n")[0].as_py() == 0
            assert view.sql("SELECT count(*) AS n FROM rollouts").column("n")[0].as_py() == len(buf)


def test_delete_does_not_wait_for_a_snapshot_in_progress(tmp_path):
    """A snapshot of a backlog runs in many steps; the delete used to wait for all of them (a drain)."""
    with lb.ReplayBuffer.open(tmp_path / "b", memory_limit_mb=256, snapshot_interval_s=0,
                              snapshot_max_rows=200) as buf:
        keys = []
        for i in range(60):
            keys += buf.push(make_rollouts(100, tokens=64, seed=i)).to_pylist()
        buf.snapshot(wait=False)  # 30 steps of 200 rows, one task
        time.sleep(0.3)
        t0 = time.monotonic()
        assert buf.delete(keys=keys[:50] + keys[-50:]) == 100  # rows in the lake and rows not yet
        took = time.monotonic() - t0
        lag = buf.stats()["cold"]["lag_rows"]
        assert lag > 0, f"the delete waited {took:.1f} s for the whole snapshot"
        buf.flush()
        buf.snapshot()
        with lb.ReplayBuffer.open_lake(buf.lake_url) as view:
            n = view.sql("SELECT count(*) AS n FROM rollouts WHERE key IN (SELECT unnest(?))", [keys[:50] + keys[-50:]])
            assert n.column("n")[0].as_py() == 0  # rows the snapshot read before the delete left the lake too
            assert view.sql("SELECT count(*) AS n FROM rollouts").column("n")[0].as_py() == 5900 == len(buf)
