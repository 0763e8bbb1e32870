"""Issue 26, item 6: what the first ``sample`` after an ingest used to pay is done before it.

After a burst of pushes the catalog had metadata inserts queued (up to 8k rows), views to
re-register and, for a ``where`` shape learnt on the small table, a population estimate that sized
the hash threshold for the old table; the first ``sample`` paid all three (BENCHMARKS.md, "first
sample after an ingest"). Now the p1 worker applies the inserts once writes have been quiet for
``WARM_QUIET_S`` and ``flush()`` at once; a sync registers objects without redefining views; the
estimate scales with the table. These tests check the state, not a timing.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import lakebuffer as lb
from lakebuffer import catalog as catalog_module
from lakebuffer.engine.tasks import P1, TaskQueue


def _push(buf, first: int, n: int = 256) -> None:
    v = np.arange(first, first + n)
    buf.push({"prompt_id": [f"p{i}" for i in v], "policy_version": v // 64, "prompt_ids": [[1, 2, 3]] * n,
              "response_ids": [list(range(200))] * n, "reward": (v % 7 / 7).astype(np.float32)})


def _ingest(buf, batches: int = 40) -> None:
    for i in range(batches):  # ~2 MB under a 1 MB budget: write-back runs during and after it
        _push(buf, 1000 + i * 256)


def _settled(cat, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cat.pending[0] == 0:  # replay counts stay queued by design
            return True
        time.sleep(0.02)
    return False


def test_after_an_ingest_goes_quiet_the_catalog_is_warm_before_the_next_sample(tmp_path):
    with lb.ReplayBuffer.open(tmp_path / "b", memory_limit_mb=1, snapshot_interval_s=0) as buf:
        _push(buf, 0)
        buf.sample(16, where="reward > 0.5", seed=0, return_keys=True)  # a trainer's loop: the shape is known
        cat = buf._catalog
        warmed = cat.warmed
        _ingest(buf)
        assert _settled(cat), f"queued metadata rows and replay counts: {cat.pending}"
        # the inserts may also have been applied by size on the way; the quiet warm-up still follows them
        deadline = time.monotonic() + 10.0
        while cat.warmed == warmed and time.monotonic() < deadline:
            time.sleep(0.02)
        assert cat.warmed > warmed
        assert buf.stats()["warm"]["rows"] > 0  # the ingest did move rows to the warm tier
        keys = buf.sample(256, where="reward > 0.5", seed=1, return_keys=True)
        assert len(keys) == 256
        assert buf.sql("SELECT count(*) AS n FROM rollouts").column(0)[0].as_py() == len(buf) == 256 + 40 * 256


def test_flush_leaves_no_queued_metadata(tmp_path, monkeypatch):
    monkeypatch.setattr(catalog_module, "WARM_QUIET_S", 30.0)  # the background warm-up cannot be what did it
    with lb.ReplayBuffer.open(tmp_path / "b", memory_limit_mb=1, snapshot_interval_s=0) as buf:
        _ingest(buf, 20)
        buf.flush()
        cat = buf._catalog
        assert cat.pending[0] == 0


def test_no_warm_up_while_pushes_keep_coming(tmp_path, monkeypatch):
    """The warm-up re-registers views under the engine lock pushes take: it waits for a quiet spell."""
    monkeypatch.setattr(catalog_module, "WARM_QUIET_S", 0.5)
    with lb.ReplayBuffer.open(tmp_path / "b", memory_limit_mb=64, snapshot_interval_s=0) as buf:
        cat = buf._catalog
        end = time.monotonic() + 1.0
        i = 0
        while time.monotonic() < end:  # a push every ~50 ms for 1 s: never 0.5 s quiet
            _push(buf, i * 16, 16)
            i += 1
            time.sleep(0.05)
        assert cat.warmed == 0
        deadline = time.monotonic() + 5.0  # (the warm-up empties the queue, then counts itself)
        while cat.warmed == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert cat.warmed == 1 and cat.pending[0] == 0


def test_submit_later_runs_after_its_delay_and_is_best_effort():
    q = TaskQueue(workers=1)
    try:
        ran: list[float] = []
        t0 = time.monotonic()
        done = q.submit_later(P1, lambda: ran.append(time.monotonic() - t0), 0.2)
        assert q.drain(5)  # drain does not wait for a delayed task
        assert not ran
        done.result(5)
        assert ran and ran[0] >= 0.2
        dropped = q.submit_later(P1, lambda: ran.append(-1.0), 30)
    finally:
        q.close()
    assert dropped.cancelled() and ran[-1] != -1.0
    with pytest.raises(lb.WorkerError):
        q.submit_later(P1, lambda: None, 0)


def test_a_sync_registers_new_objects_without_redefining_the_views(tmp_path):
    """Views bind the registered names at query time: re-registering the tiers' objects is enough."""
    with lb.ReplayBuffer.open(tmp_path / "b", memory_limit_mb=1, snapshot_interval_s=0) as buf:
        cat = buf._catalog
        ddl: list[str] = []
        define = cat.define_views
        cat.define_views = lambda sources, statements: (ddl.extend(statements), define(sources, statements))
        for i in range(12):
            _push(buf, i * 256)
            assert buf.sql("SELECT count(*) FROM rollouts").column(0)[0].as_py() == (i + 1) * 256
        buf.flush()
        stats = buf.stats()
        assert stats["warm"]["rows"] > 0 and stats["hot"]["rows"] > 0
        assert buf.sql("SELECT count(*) FROM hot").column(0)[0].as_py() == stats["hot"]["rows"]
        assert buf.sql("SELECT count(*) FROM warm").column(0)[0].as_py() == stats["warm"]["rows"]
        assert ddl == []  # the views defined at open serve every later registration
