"""Issue 15, the local guarantees: unique keys (1), read-only SQL and predicates (4), faults end
cleanly (8), input hygiene (9). Each test reproduces what was seen, then checks the guarantee in general."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pytest

import lakebuffer as lb
from tests.rollouts import make_rollouts


def open_buf(path, **kw):
    kw.setdefault("memory_limit_mb", 4)
    kw.setdefault("snapshot_interval_s", 0)
    return lb.ReplayBuffer.open(path, **kw)


def keyed(keys: list[str], seed: int = 0) -> pa.Table:
    return make_rollouts(len(keys), tokens=3, seed=seed).append_column("key", pa.array(keys, pa.string()))


def assert_keys_unique(buf, acked: list[str]) -> None:
    counts = buf.sql("SELECT count(*) AS n, count(DISTINCT key) AS d FROM rollouts").to_pylist()[0]
    rows, distinct = counts["n"], counts["d"]
    assert rows == distinct == len(acked) == len(set(acked))
    assert sorted(buf.sql("SELECT key FROM rollouts").column("key").to_pylist()) == sorted(acked)


# --- 1. a key is stored at most once -----------------------------------------------------------
def test_user_keys_cannot_take_the_generated_form(tmp_path):
    with open_buf(tmp_path / "b", run_id="r") as buf:
        acked = buf.push(make_rollouts(2, tokens=3)).to_pylist()
        with pytest.raises(lb.SchemaError, match="generates"):
            buf.push(keyed(["r-0000000002", "r-0000000003"]))
        acked += buf.push(make_rollouts(2, tokens=3, seed=1)).to_pylist()
        assert_keys_unique(buf, acked)
        # other forms that merely start with the prefix stay the user's
        acked += buf.push(keyed(["r-x", "r-00000000021a", "rr-0000000005"])).to_pylist()
        assert_keys_unique(buf, acked)


def test_concurrent_pushes_of_the_same_keys_store_each_once(tmp_path):
    acked: list[str] = []
    refused = []
    lock = threading.Lock()
    with open_buf(tmp_path / "b", memory_limit_mb=64) as buf:
        def producer(seed: int) -> None:
            for i in range(200):
                try:
                    got = buf.push(keyed([f"same-{i}"], seed=seed)).to_pylist()
                except lb.SchemaError:
                    refused.append(i)
                    continue
                with lock:
                    acked.extend(got)

        threads = [threading.Thread(target=producer, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(refused) == 600
        assert_keys_unique(buf, acked)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_interleaved_generated_and_user_keys_from_threads_are_unique(tmp_path, seed):
    """Property: whatever the interleaving, rows == distinct keys == acknowledged keys, and a
    refused push stores nothing (hot pushes and pushes large enough to go straight to warm)."""
    acked: list[str] = []
    lock = threading.Lock()
    errors: list[BaseException] = []
    with open_buf(tmp_path / "b", memory_limit_mb=2, run_id="p") as buf:
        def producer(t: int) -> None:
            rng = np.random.default_rng(seed * 100 + t)
            try:
                for i in range(40):
                    n = int(rng.choice([1, 3, 40, 600]))  # 600 rows of 3 tokens exceed the hot share
                    if rng.random() < 0.5:
                        table = make_rollouts(n, tokens=3, seed=i)
                    else:  # user keys from a small shared pool: collisions across threads are frequent
                        pool = rng.choice(900, size=n, replace=False)
                        table = keyed([f"u{k}" for k in pool], seed=i)
                    try:
                        got = buf.push(table).to_pylist()
                    except lb.SchemaError as e:
                        assert "already stored" in str(e)
                        continue
                    with lock:
                        acked.extend(got)
            except BaseException as e:  # noqa: BLE001 - surfaced below
                errors.append(e)

        threads = [threading.Thread(target=producer, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        buf.flush()
        assert_keys_unique(buf, acked)
    with open_buf(tmp_path / "b", memory_limit_mb=2) as buf:  # and after recovery
        assert_keys_unique(buf, acked)


def test_a_push_with_one_stored_key_stores_nothing(tmp_path):
    with open_buf(tmp_path / "b", memory_limit_mb=2) as buf:
        buf.push(keyed(["a", "b"]))
        with pytest.raises(lb.SchemaError, match="already stored"):
            buf.push(keyed(["c", "d", "b"]))
        big = [f"big{i}" for i in range(2000)] + ["a"]  # the push straight to the warm tier
        with pytest.raises(lb.SchemaError, match="already stored"):
            buf.push(keyed(big))
        assert_keys_unique(buf, ["a", "b"])


def test_generated_keys_skip_past_stored_ones_when_the_counter_is_lost(tmp_path):
    from rocksdict import Options, Rdict

    with open_buf(tmp_path / "b", run_id="r") as buf:
        acked = buf.push(make_rollouts(5, tokens=3)).to_pylist()
    db = Rdict(str(tmp_path / "b" / "index"), options=Options(raw_mode=True),
               column_families={"meta": Options(raw_mode=True)})
    del db[b"c/next_seq"]  # the counter lost (an index rebuilt from the fragments has none)
    db.close()
    with open_buf(tmp_path / "b") as buf:
        acked += buf.push(make_rollouts(3, tokens=3)).to_pylist()
        assert acked[-3:] == ["r-0000000005", "r-0000000006", "r-0000000007"]
        assert_keys_unique(buf, acked)


# --- 8. faults end cleanly ---------------------------------------------------------------------
def test_close_that_fails_on_disk_releases_the_lock_and_raises_a_lakebuffer_error(tmp_path):
    path = tmp_path / "b"
    buf = open_buf(path)
    keys = buf.push(make_rollouts(50, tokens=8)).to_pylist()
    # a real I/O fault at close: the index directory is gone when RocksDB flushes its memtable
    (path / "index").rename(tmp_path / "index.away")
    with pytest.raises(lb.StorageError, match="index"):
        buf.close()
    (tmp_path / "index.away").rename(path / "index")
    with open_buf(path) as again:  # same process: neither the directory lock nor RocksDB's is kept
        assert sorted(again.get(keys, ["key"]).column("key").to_pylist()) == sorted(keys)


def test_dependency_errors_reach_the_user_as_lakebuffer_errors(tmp_path):
    with open_buf(tmp_path / "b") as buf:
        with pytest.raises(lb.SchemaError, match="UTF-8"):
            buf.get(["k\ud800"])
        with pytest.raises(lb.SchemaError, match="UTF-8"):
            buf.delete(keys=["k\ud800"])


# --- 9. input hygiene -----------------------------------------------------------------------------
@pytest.mark.parametrize("rewards", [
    pa.array([0.5, float("inf")], pa.float32()),
    pa.array([0.5, float("-inf")], pa.float64()),
    pa.array([0.5, 1e300], pa.float64()),  # finite as float64, inf once cast to the schema's float32
    pa.array([0.5, float("nan")], pa.float64()),
])
def test_non_finite_rewards_are_refused_after_the_cast(tmp_path, rewards):
    with open_buf(tmp_path / "b") as buf:
        t = make_rollouts(2, tokens=3)
        with pytest.raises(lb.SchemaError, match="non-finite"):
            buf.push(t.set_column(t.column_names.index("reward"), "reward", rewards))
        assert len(buf) == 0
        assert buf.push(make_rollouts(2, tokens=3)).to_pylist()  # the buffer is fine afterwards


def test_a_key_with_a_lone_surrogate_is_a_schema_error(tmp_path):
    with open_buf(tmp_path / "b") as buf:
        rows = make_rollouts(2, tokens=3).to_pylist()
        rows[0]["key"], rows[1]["key"] = "fine", "k\ud800"
        with pytest.raises(lb.SchemaError, match="UTF-8"):
            buf.push(rows)
        with pytest.raises(lb.SchemaError, match="(?i)utf-8"):
            buf.push({"key": ["fine", "k\ud800"], **{c: [r[c] for r in rows] for c in rows[0] if c != "key"}})
        rows[1]["key"], rows[0]["prompt_id"] = "ok", "p\udfff"
        with pytest.raises(lb.SchemaError, match="UTF-8"):
            buf.push(rows)
        assert len(buf) == 0


def test_scan_over_a_truncated_fragment_is_a_corruption_error(tmp_path):
    path = tmp_path / "b"
    with open_buf(path) as buf:
        buf.push(make_rollouts(500, tokens=16))
        buf.evict_all()
    files = sorted((path / "warm").iterdir())
    victim = files[len(files) // 2]
    with open(victim, "r+b") as f:
        f.truncate(victim.stat().st_size // 2)
    with open_buf(path) as buf:
        with pytest.raises(lb.CorruptionError, match="warm fragment") as err:
            for _ in buf.scan(batch_size=64):
                pass
        assert "fsck" in str(err.value)
        with pytest.raises(lb.CorruptionError, match="warm fragment"):
            list(buf.scan(where="reward >= 0", columns=["key", "response_ids"], batch_size=64))


# --- 4. read-only means read-only; predicates are predicates -----------------------------------
FILE_READ = "(SELECT count(*) FROM read_text('/etc/passwd')) > 0"


@pytest.fixture
def lake_and_buffer(tmp_path):
    lake = tmp_path / "lake"
    buf = open_buf(tmp_path / "b", lake=str(lake), run_id="r")
    buf.push(make_rollouts(64, tokens=4))
    buf.snapshot(wait=True)
    yield buf, lake
    buf.close()


def test_a_where_that_reads_files_is_refused_everywhere(lake_and_buffer):
    from lakebuffer.dataset import RolloutDataset

    buf, lake = lake_and_buffer
    view = lb.ReplayBuffer.open_lake(str(lake))
    calls = {
        "buf.sample": lambda: buf.sample(4, where=FILE_READ),
        "buf.count": lambda: buf.count(FILE_READ),
        "buf.scan": lambda: list(buf.scan(where=FILE_READ)),
        "buf.delete": lambda: buf.delete(where=FILE_READ),
        "view.sample": lambda: view.sample(4, where=FILE_READ),
        "view.count": lambda: view.count(FILE_READ),
        "view.scan": lambda: list(view.scan(where=FILE_READ)),
        "dataset": lambda: RolloutDataset(buf, where=FILE_READ),
    }
    for name, call in calls.items():
        with pytest.raises(lb.QueryError):
            call()
            pytest.fail(f"{name} accepted a where that reads a file")
    assert buf.count() == 64 and view.count() == 64
    view.close()


WRITES_TO_THE_LAKE = [
    "COPY (SELECT 'x') TO '{lake}/_delta_log/00000000000000000000.json' (FORMAT csv, HEADER false)",
    "COPY rollouts TO '{lake}/copy.parquet'",
    "EXPORT DATABASE '{lake}/export'",
    "ATTACH '{lake}/x.duckdb' AS x",
    "ATTACH ':memory:' AS x",
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_text('{lake}/_delta_log/00000000000000000000.json')",
    "SELECT * FROM glob('{lake}/*')",
    "SELECT * FROM read_parquet('{lake}/**/*.parquet')",
    "INSTALL httpfs",
    "LOAD httpfs",
    "SET enable_external_access = true",
    "RESET lock_configuration",
    "PRAGMA enable_profiling",
    "CREATE OR REPLACE TEMP VIEW rollouts AS SELECT 1 AS key",
    "DROP VIEW meta",
    "EXPLAIN ANALYZE CREATE TABLE t AS SELECT 1",
    "SELECT 1; DROP VIEW rollouts",
]


def test_a_lake_view_cannot_write_or_read_beyond_its_lake(lake_and_buffer):
    buf, lake = lake_and_buffer
    settings = (lake / "_delta_log/00000000000000000000.json").read_bytes()
    files = sorted(p.relative_to(lake) for p in lake.rglob("*"))
    view = lb.ReplayBuffer.open_lake(str(lake))
    expected = view.sql("SELECT key, reward FROM rollouts ORDER BY key")
    for stmt in WRITES_TO_THE_LAKE:
        with pytest.raises((lb.QueryError, lb.ReadOnlyError)):
            view.sql(stmt.format(lake=lake))
            pytest.fail(f"a lake view ran {stmt!r}")
    assert view.sql("SELECT key, reward FROM rollouts ORDER BY key").equals(expected)
    assert view.count() == 64 and view.get(expected.column("key")[:3]).num_rows == 3
    view.close()
    assert (lake / "_delta_log/00000000000000000000.json").read_bytes() == settings
    assert sorted(p.relative_to(lake) for p in lake.rglob("*")) == files
    again = lb.ReplayBuffer.open_lake(str(lake))  # every reader of the lake still reads it
    assert again.count() == 64
    again.close()


BUFFER_CATALOG_WRITES = [
    "DROP TABLE meta",
    "DELETE FROM meta",
    "UPDATE meta SET reward = 0",
    "INSERT INTO meta SELECT * FROM meta",
    "CREATE OR REPLACE VIEW rollouts AS SELECT * FROM hot",
    "DROP VIEW rollouts",
    "ALTER TABLE meta RENAME TO m2",
    "CREATE TABLE mine AS SELECT 1",
    "CHECKPOINT",
    "CALL pragma_version()",
    "DETACH memory",
    "USE system",
    "BEGIN TRANSACTION",
]


def test_buffer_sql_cannot_change_the_catalog_or_touch_files(lake_and_buffer, tmp_path):
    buf, lake = lake_and_buffer
    settings = (lake / "_delta_log/00000000000000000000.json").read_bytes()
    expected = buf.sql("SELECT key, reward, sample_count FROM rollouts ORDER BY key")
    for stmt in BUFFER_CATALOG_WRITES + WRITES_TO_THE_LAKE:
        with pytest.raises((lb.QueryError, lb.ReadOnlyError)):
            buf.sql(stmt.format(lake=lake))
            pytest.fail(f"buf.sql ran {stmt!r}")
    assert buf.sql("SELECT key, reward, sample_count FROM rollouts ORDER BY key").equals(expected)
    assert (lake / "_delta_log/00000000000000000000.json").read_bytes() == settings
    assert not (lake / "copy.parquet").exists()
    # the buffer still works on every path afterwards
    assert len(buf) == 64 and buf.count("reward >= 0") == 64
    assert buf.sample(8, seed=1).num_rows == 8
    keys = buf.push(make_rollouts(4, tokens=4, seed=3))
    assert buf.get(keys).num_rows == 4 and len(buf) == 68
    assert buf.sql("SELECT count(*) AS n FROM cold").column("n")[0].as_py() == 64


def test_what_sql_may_do(lake_and_buffer):
    buf, lake = lake_and_buffer
    view = lb.ReplayBuffer.open_lake(str(lake))
    for reader in (buf, view):
        assert reader.sql("SELECT count(*) AS n FROM rollouts").column("n")[0].as_py() == 64
        assert reader.sql("WITH t AS (SELECT reward FROM meta) SELECT count(*) AS n FROM t").num_rows == 1
        assert reader.sql("FROM meta LIMIT 2").num_rows == 2
        assert reader.sql("SELECT count(*) AS n FROM rollouts WHERE reward > ?", [2.0]).column("n")[0].as_py() == 0
        assert "key" in reader.sql("DESCRIBE rollouts").column("column_name").to_pylist()
        assert reader.sql("SUMMARIZE SELECT reward FROM meta").num_rows == 1
        assert reader.sql("SHOW TABLES").num_rows >= 1
        assert reader.sql("EXPLAIN SELECT * FROM meta").num_rows >= 1
        assert reader.sql("EXPLAIN ANALYZE SELECT count(*) FROM meta").num_rows >= 1
        assert reader.sql("PIVOT (SELECT verified, policy_version FROM meta) ON verified USING count(*)").num_rows == 1
        assert reader.sql("/* a comment */ VALUES (1), (2)").num_rows == 2
    view.close()
