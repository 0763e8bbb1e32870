"""Readers conformance suite: one abstract suite, run once per reader implementation (fsspec style).

``ReaderSuite`` holds the cases; each ``Test*`` subclass only says how to build its reader over
the same deterministic rollouts (``DATA``), through the public API only:

* ``TestLocalLake``: ``ReplayBuffer`` with a ``file://`` lake, rows spread over the hot and warm tiers;
* ``TestS3Lake``: ``ReplayBuffer`` with a lake on the moto S3 server (127.0.0.1, tests/s3server.py);
* ``TestLakeView``: ``ReplayBuffer.open_lake(url)`` after a snapshot (read-only);
* ``TestSharded``: ``ShardedReplayBuffer`` over 2 Ray actors (skipped without Ray);
* ``TestShardedTwoNodes``: the same on a real 2-node Ray cluster on loopback, one shard a node (slow).

``open_reader(kind, table, root, ...)`` is also how tests/test_samplers.py runs its sampler cases
under every reader. Readers are built once per class (class-scoped fixtures) and Ray once per module.
"""

from __future__ import annotations

import collections
import contextlib
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import lakebuffer as lb
from tests.rollouts import make_rollouts

KINDS = ("local", "s3", "lakeview", "sharded")
READ_ONLY = {"lakeview"}
RAY = importlib.util.find_spec("ray") is not None
# 6 policy versions x 64 rows, 8 rows per prompt: the same rows (and, per run_id, keys) everywhere
DATA = pa.concat_tables([make_rollouts(64, tokens=64, version=v, seed=v, first_prompt=8 * v) for v in range(6)])
WHERE = "reward > 0.4 AND policy_version >= 2"


def _fill(reader: Any, table: pa.Table, batch: int) -> None:
    for i in range(0, table.num_rows, batch):
        reader.push(table.slice(i, batch))


@contextlib.contextmanager
def ray_session() -> Iterator[None]:
    """A small local Ray (2 CPUs), started unless one is already up, shut down if started here."""
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False)
    try:
        yield
    finally:
        if started:
            ray.shutdown()


@contextlib.contextmanager
def open_reader(
    kind: str,
    table: pa.Table,
    root: Path,
    *,
    s3_server: Any = None,
    run_id: str = "world",
    memory_limit_mb: float = 0.2,
    batch: int = 64,
) -> Iterator[Any]:
    """A reader of kind ``kind`` holding exactly ``table``'s rows, closed on exit.

    ``local``/``s3`` keep the filled buffer open (after a flush and a snapshot); ``lakeview`` fills a
    buffer, snapshots it, closes it and opens the lake read-only; ``sharded`` pushes through 2 Ray
    actors (the caller runs it inside ``ray_session()``). ``s3`` needs the ``s3_server`` fixture.
    """
    root = Path(root)
    kw: dict[str, Any] = {"memory_limit_mb": memory_limit_mb, "snapshot_interval_s": 0, "run_id": run_id}
    bucket = None
    if kind == "s3":
        bucket = s3_server.make_bucket()
        kw.update(lake=f"{bucket}/lake", storage_options=s3_server.storage_options)
    elif kind in ("local", "lakeview"):
        kw["lake"] = f"file://{root / 'lake'}"
    elif kind != "sharded":
        raise ValueError(f"unknown reader kind {kind!r}; choose from {KINDS}")
    try:
        if kind == "sharded":
            from lakebuffer.distributed import ShardedReplayBuffer

            reader: Any = ShardedReplayBuffer(2, root / "sharded", **kw)
            try:
                _fill(reader, table, batch)
                reader.flush()
                yield reader
            finally:
                reader.close()
            return
        buf = lb.ReplayBuffer.open(root / "buf", **kw)
        try:
            _fill(buf, table, batch)
            buf.flush()
            buf.snapshot(wait=True)
            if kind != "lakeview":
                yield buf
                return
        finally:
            buf.close()
        with lb.ReplayBuffer.open_lake(kw["lake"], storage_options=kw.get("storage_options")) as view:
            yield view
    finally:
        if bucket is not None:
            with contextlib.suppress(Exception):
                s3_server.remove_bucket(bucket.removeprefix("s3://"))


def keys_of(reader: Any, n: int, **kw: Any) -> list[str]:
    return reader.sample(n, return_keys=True, **kw).to_pylist()


class ReaderSuite:
    """The cases every reader passes. Subclasses provide a class-scoped ``reader`` fixture and ``kind``."""

    kind: str = ""

    def test_counts_agree(self, reader):
        assert len(reader) == DATA.num_rows
        assert reader.sql("SELECT count(*) FROM rollouts").column(0)[0].as_py() == DATA.num_rows

    def test_same_seed_same_sample_other_seed_other_sample(self, reader):
        a = keys_of(reader, 50, seed=1)
        assert len(a) == len(set(a)) == 50
        assert keys_of(reader, 50, seed=1) == a
        assert keys_of(reader, 50, seed=2) != a  # 50 of 384: two seeds agreeing is impossible in practice
        rows = reader.sample(50, seed=1, columns=["key", "reward"])
        assert rows.column("key").to_pylist() == a

    def test_where_is_honoured(self, reader):
        expected = int(np.sum((DATA.column("reward").to_numpy() > 0.4) & (DATA.column("policy_version").to_numpy() >= 2)))
        n = min(60, expected)
        got = reader.sample(n, where=WHERE, seed=3, columns=["reward", "policy_version"]).to_pylist()
        assert len(got) == n
        assert all(r["reward"] > 0.4 and r["policy_version"] >= 2 for r in got)
        with pytest.raises(lb.NotEnoughRowsError):
            reader.sample(expected + 1, where=WHERE)

    def test_get_returns_rows_in_the_order_asked(self, reader):
        keys = keys_of(reader, 40, seed=4)
        order = list(np.random.default_rng(0).permutation(keys))
        got = reader.get(order, columns=["key", "reward"])
        assert got.column_names == ["key", "reward"]
        assert got.column("key").to_pylist() == order
        by_key = dict(zip(*reader.sample(40, seed=4, columns=["key", "reward"]).to_pydict().values()))
        assert got.column("reward").to_pylist() == [by_key[k] for k in order]
        assert reader.get(pa.array(order[:3]), columns=["key"]).column("key").to_pylist() == order[:3]

    def test_get_of_a_missing_key_raises_key_not_found(self, reader):
        existing = keys_of(reader, 1, seed=5)[0]
        missing = f"{existing.rsplit('-', 1)[0]}-9999999999"  # the reader's own key shape, never made
        with pytest.raises(lb.KeyNotFoundError):
            reader.get([existing, missing], columns=["key"])

    def test_scan_yields_every_row_exactly_once(self, reader):
        if not hasattr(reader, "scan"):
            pytest.skip(f"{type(reader).__name__} has no scan")
        seen = collections.Counter()
        for batch in reader.scan(columns=["key"], batch_size=100):
            seen.update(batch.column("key").to_pylist())
        assert sum(seen.values()) == DATA.num_rows and set(seen.values()) == {1}
        assert set(seen) == set(reader.sql("SELECT key FROM rollouts").column("key").to_pylist())
        some = [r for b in reader.scan(where=WHERE, columns=["reward", "policy_version"]) for r in b.to_pylist()]
        assert some and all(r["reward"] > 0.4 and r["policy_version"] >= 2 for r in some)

    @pytest.mark.parametrize("where", ["no_such_column > 1", "reward > 0; DROP TABLE meta", "reward >"])
    def test_a_bad_where_raises_query_error(self, reader, where):
        with pytest.raises(lb.QueryError):
            reader.sample(5, where=where)
        if hasattr(reader, "scan"):
            with pytest.raises(lb.QueryError):
                next(iter(reader.scan(where=where)))

    @pytest.mark.parametrize("where", [
        "key IN (SELECT key FROM read_parquet('/etc/passwd'))",  # a predicate reads only the rows it is given
        "reward > (SELECT max(reward) FROM meta)",  # no subqueries at all in a user's where
        "reward > 0) UNION ALL (SELECT 1",
        "COPY meta TO '/tmp/x.csv'",
    ])
    def test_a_where_cannot_read_files_or_run_statements(self, reader, where):
        with pytest.raises(lb.QueryError):
            reader.sample(5, where=where)
        with pytest.raises(lb.QueryError):
            reader.count(where)
        if hasattr(reader, "scan"):
            with pytest.raises(lb.QueryError):
                next(iter(reader.scan(where=where)))

    def test_update_priority_steers_the_priority_sampler(self, reader):
        """Priorities set by key reach the sampler wherever the row lives (a shard: routed by key),
        with and without replacement (the sharded reader's top-k merge and its metadata union)."""
        if self.kind in READ_ONLY:
            pytest.skip("a read-only reader has no update_priority")
        keys = keys_of(reader, 3, seed=11)
        assert reader.update_priority(keys[:2], [1e12, 1e12]) == 2
        assert reader.update_priority(keys[2:], 0.0) == 1
        opts = dict(sampler="priority", priority="1.0")  # every other row: weight 1
        assert sorted(keys_of(reader, 2, seed=12, **opts)) == sorted(keys[:2])
        drawn = keys_of(reader, 40, seed=13, replacement=True, **opts)
        assert set(drawn) <= set(keys[:2]) and len(drawn) == 40
        assert keys[2] not in keys_of(reader, DATA.num_rows - 1, seed=14, **opts)  # priority 0: never drawn
        missing = f"{keys[0].rsplit('-', 1)[0]}-9999999999"
        with pytest.raises(lb.KeyNotFoundError):
            reader.update_priority([missing], 1.0)
        with pytest.raises(lb.OptionError):
            reader.update_priority(keys[:2], [1.0])
        with pytest.raises(lb.OptionError):
            reader.update_priority(keys[:1], -1.0)
        reader.update_priority(keys, 1.0)  # as every other row again

    def test_read_only_readers_refuse_writes(self, reader):
        if self.kind not in READ_ONLY:
            pytest.skip("a writable reader")
        with pytest.raises(lb.ReadOnlyError):
            reader.push(DATA.slice(0, 4))
        with pytest.raises(lb.ReadOnlyError):
            reader.delete(where="TRUE")
        with pytest.raises(lb.ReadOnlyError):
            reader.snapshot()
        assert len(reader) == DATA.num_rows  # nothing was written


class TestLocalLake(ReaderSuite):
    kind = "local"

    @pytest.fixture(scope="class")
    @classmethod
    def reader(cls, tmp_path_factory):
        with open_reader(cls.kind, DATA, tmp_path_factory.mktemp("reader-local")) as r:
            st = r.stats()
            assert st["hot"]["rows"] > 0 and st["warm"]["rows"] > 0, "rows should span the hot and warm tiers"
            yield r


class TestS3Lake(ReaderSuite):
    kind = "s3"

    @pytest.fixture(scope="class")
    @classmethod
    def reader(cls, tmp_path_factory, s3_server):
        with open_reader(cls.kind, DATA, tmp_path_factory.mktemp("reader-s3"), s3_server=s3_server) as r:
            yield r


class TestLakeView(ReaderSuite):
    kind = "lakeview"

    @pytest.fixture(scope="class")
    @classmethod
    def reader(cls, tmp_path_factory):
        with open_reader(cls.kind, DATA, tmp_path_factory.mktemp("reader-lakeview")) as r:
            yield r


@pytest.mark.skipif(not RAY, reason="Ray is not installed")
class TestSharded(ReaderSuite):
    kind = "sharded"

    @pytest.fixture(scope="class")
    @classmethod
    def reader(cls, tmp_path_factory):
        with ray_session(), open_reader(cls.kind, DATA, tmp_path_factory.mktemp("reader-sharded")) as r:
            yield r


@pytest.mark.skipif(not RAY, reason="Ray is not installed")
@pytest.mark.slow  # two raylets: ~10-30 s to start on a loaded 2-core machine
class TestShardedTwoNodes(ReaderSuite):
    kind = "sharded"

    @pytest.fixture(scope="class")
    @classmethod
    def reader(cls, tmp_path_factory):
        from tests.raycluster import ray_nodes

        with ray_nodes(2), open_reader(cls.kind, DATA, tmp_path_factory.mktemp("reader-two-nodes")) as r:
            assert len(set(r.shard_nodes)) == 2, "one shard on each node"
            yield r
