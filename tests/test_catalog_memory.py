"""The catalog's own RAM is counted against the buffer's budget without reading DuckDB's memory on every
write: ``duckdb_memory()`` costs ~0.5 ms, and a push followed by a query or a delete paid it twice (every
TransferQueue clear). It is read at most every ``MEMORY_MEASURE_EVERY_S``, or sooner once more than
``MEMORY_MEASURE_ROWS`` rows changed, so the figure lags by a bounded number of rows, never by time alone."""

from __future__ import annotations

import time

import lakebuffer as lb
from lakebuffer import catalog as catalog_module
from lakebuffer.resources import sql_text
from tests.rollouts import make_rollouts


def _count_readings(monkeypatch) -> list[float]:
    readings: list[float] = []
    real = catalog_module.sql_text

    def counting(name: str) -> str:
        if name == "catalog_memory":
            readings.append(time.monotonic())
        return real(name)

    monkeypatch.setattr(catalog_module, "sql_text", counting)
    return readings


def test_small_writes_read_duckdbs_memory_at_most_once_per_interval(tmp_path, monkeypatch):
    monkeypatch.setattr(catalog_module, "MEMORY_MEASURE_EVERY_S", 30.0)
    with lb.ReplayBuffer.open(tmp_path / "b", memory_limit_mb=64, snapshot_interval_s=0) as buf:
        buf.push(make_rollouts(8, seed=0))
        buf.flush()
        first = buf.stats()["catalog"]["bytes"]
        assert first > 0  # the first write is measured
        readings = _count_readings(monkeypatch)
        for i in range(30):  # what a TransferQueue put + clear does, and a sample after each push
            keys = buf.push(make_rollouts(16, seed=i + 1))
            buf.sample(4, where="reward > -1", seed=i)
            assert buf.delete(keys=keys) == 16
        assert readings == []  # 90 small writes within the interval: no reading
        # more rows than MEMORY_MEASURE_ROWS change: read at once, however recent the last reading
        buf.push(make_rollouts(catalog_module.MEMORY_MEASURE_ROWS + 1, tokens=4, seed=99))
        buf.sample(4, where="reward > -1", seed=0)
        assert len(readings) == 1
        assert buf.stats()["catalog"]["bytes"] > first  # 4,105 more rows of metadata


def test_the_interval_passing_brings_a_fresh_reading(tmp_path, monkeypatch):
    monkeypatch.setattr(catalog_module, "MEMORY_MEASURE_EVERY_S", 0.2)
    with lb.ReplayBuffer.open(tmp_path / "b", memory_limit_mb=64, snapshot_interval_s=0) as buf:
        buf.push(make_rollouts(8, seed=0))
        buf.sample(2, seed=0)
        readings = _count_readings(monkeypatch)
        keys = buf.push(make_rollouts(8, seed=1))
        buf.sample(2, seed=1)
        assert readings == []  # within the interval
        time.sleep(0.3)
        buf.delete(keys=keys)
        assert len(readings) == 1  # the next write after the interval reads it
        direct = buf._catalog.con.execute(sql_text("catalog_memory")).fetchall()[0][0]  # the catalog's own query
        assert buf.stats()["catalog"]["bytes"] == direct
