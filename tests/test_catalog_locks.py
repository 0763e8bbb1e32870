"""A push never waits for the catalog's DuckDB connection (issue 23 item 4: push p99 under a disk budget).

A push queues its rows' metadata for DuckDB; the queue has a lock of its own, so a push goes on while
a long statement (a user's SQL, a replay-count UPDATE) or a lake registration holds the connection,
and the next statement still sees every row pushed before it. A lake registration reads the Delta log
before it takes the connection's lock (that read was a third of a paced push's time).
"""

from __future__ import annotations

import threading
import time

import lakebuffer as lb
from tests.rollouts import make_rollouts


def test_a_push_goes_on_while_a_statement_holds_the_catalog(tmp_path):
    with lb.ReplayBuffer.open(tmp_path / "b", memory_limit_mb=64, snapshot_interval_s=0) as buf:
        buf.push(make_rollouts(8, seed=1))
        catalog = buf._catalog
        held, release = threading.Event(), threading.Event()

        def long_statement() -> None:
            with catalog.lock:
                held.set()
                release.wait(30)

        t = threading.Thread(target=long_statement)
        t.start()
        try:
            assert held.wait(10)
            t0 = time.perf_counter()
            keys = buf.push(make_rollouts(16, seed=2)).to_pylist()
            took = time.perf_counter() - t0
        finally:
            release.set()
            t.join()
        assert took < 5, took  # (the statement held the connection for as long as the test let it)
        # the next statement sees the rows pushed while the connection was busy
        got = buf.sql("SELECT count(*) AS n FROM rollouts").column("n")[0].as_py()
        assert got == 24
        assert sorted(buf.sample(16, where=f"key IN ({', '.join(repr(k) for k in keys)})", return_keys=True).to_pylist()) \
            == sorted(keys)


def test_a_lake_registration_reads_the_delta_log_outside_the_catalogs_lock(tmp_path, monkeypatch):
    from lakebuffer.lake.table import Lake

    with lb.ReplayBuffer.open(tmp_path / "b", lake=str(tmp_path / "lake"), memory_limit_mb=64,
                              snapshot_interval_s=0) as buf:
        catalog = buf._catalog
        seen = []
        real = Lake.view_of

        def view_of(self, *a, **k):
            free = []
            probe = threading.Thread(target=lambda: free.append(catalog.lock.acquire(timeout=0) and (catalog.lock.release() or True)))
            probe.start()
            probe.join()
            seen.append(bool(free and free[0]))
            return real(self, *a, **k)

        monkeypatch.setattr(Lake, "view_of", view_of)
        buf.push(make_rollouts(32, seed=3))
        buf.snapshot(wait=True)  # a commit registers the lake's views anew
        assert seen and all(seen), seen
        assert buf.sql("SELECT count(*) AS n FROM cold").column("n")[0].as_py() == 32
