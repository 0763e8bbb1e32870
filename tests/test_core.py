"""The core contract: push/get/sample/sql/delete/restart across the hot and warm tiers."""

from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

import lakebuffer as lb
from tests.rollouts import make_rollouts


def open_buf(path, **kw):
    kw.setdefault("memory_limit_mb", 4)
    kw.setdefault("snapshot_interval_s", 0)
    return lb.ReplayBuffer.open(path, **kw)


# --- input types -------------------------------------------------------------------------------
def _as_inputs(t: pa.Table) -> dict:
    rows = t.to_pylist()
    return {
        "table": t,
        "record_batch": t.combine_chunks().to_batches()[0],
        "polars": pl.from_arrow(t),
        "list_of_dicts": rows,
        "dict_of_columns": {c: t.column(c).to_pylist() for c in t.column_names},
    }


@pytest.mark.parametrize("kind", ["table", "record_batch", "polars", "list_of_dicts", "dict_of_columns"])
def test_push_round_trips_every_input_type(tmp_path, kind):
    src = make_rollouts(24, tokens=5, version=3, seed=1)
    with open_buf(tmp_path / kind) as buf:
        keys = buf.push(_as_inputs(src)[kind])
        assert len(keys) == 24 and len(set(keys.to_pylist())) == 24
        got = buf.get(keys)
        for col in src.column_names:
            assert got.column(col).to_pylist() == src.column(col).to_pylist(), col
        # defaults were filled
        assert set(got.column("run_id").to_pylist()) == {kind}
        assert got.column("group_id").to_pylist() == src.column("prompt_id").to_pylist()
        assert got.column("sample_count").to_pylist() == [0] * 24
        assert got.column("created_at").null_count == 0


def test_user_keys_are_kept_and_duplicates_rejected(tmp_path):
    t = make_rollouts(4, tokens=3).append_column("key", pa.array(["a", "b", "c", "d"]))
    with open_buf(tmp_path) as buf:
        assert buf.push(t).to_pylist() == ["a", "b", "c", "d"]
        with pytest.raises(lb.SchemaError, match="already stored"):
            buf.push(make_rollouts(1, tokens=3).append_column("key", pa.array(["c"])))
        with pytest.raises(lb.SchemaError, match="duplicate"):
            buf.push(make_rollouts(2, tokens=3).append_column("key", pa.array(["x", "x"])))
        assert len(buf) == 4


def test_2d_numpy_token_matrix_is_accepted(tmp_path):
    ids = np.arange(12, dtype=np.int32).reshape(3, 4)
    with open_buf(tmp_path) as buf:
        keys = buf.push({"prompt_id": ["a", "b", "c"], "policy_version": [1, 1, 1], "prompt_ids": ids,
                         "response_ids": ids, "reward": [0.1, 0.2, 0.3]})
        assert buf.get(keys, ["response_ids"]).column(0).to_pylist() == ids.tolist()


# --- budget and tiers -------------------------------------------------------------------------
def test_budget_respected_while_pushing_four_times_the_budget(tmp_path):
    limit_mb = 2
    batch = make_rollouts(64, tokens=256)  # ~200 KB per batch
    with open_buf(tmp_path, memory_limit_mb=limit_mb) as buf:
        pushed = 0
        peak = 0
        while pushed < 4 * limit_mb * 2**20:
            buf.push(batch)
            pushed += batch.nbytes
            st = buf.stats()
            peak = max(peak, st["hot"]["bytes"])
            assert st["hot"]["bytes"] <= st["hot"]["limit_bytes"]
        buf.flush()
        st = buf.stats()
        assert peak <= limit_mb * 2**20
        assert st["warm"]["rows"] > 0 and st["hot"]["rows"] > 0, st
        assert st["hot"]["rows"] + st["warm"]["rows"] == len(buf)


def test_rows_spread_over_both_tiers_all_returned_by_sql(tmp_path):
    with open_buf(tmp_path, memory_limit_mb=1) as buf:
        keys = []
        for v in range(10):
            keys += buf.push(make_rollouts(64, tokens=128, version=v, seed=v)).to_pylist()
        buf.flush()
        tiers = buf.sql("SELECT (SELECT count(*) FROM hot) AS h, (SELECT count(*) FROM warm) AS w").to_pylist()[0]
        assert tiers["h"] > 0 and tiers["w"] > 0
        assert tiers["h"] + tiers["w"] == 640
        got = buf.sql("SELECT key FROM rollouts").column("key").to_pylist()
        assert sorted(got) == sorted(keys)  # every row exactly once
        per_version = buf.sql("SELECT policy_version, count(*) AS n FROM rollouts GROUP BY 1 ORDER BY 1").to_pylist()
        assert per_version == [{"policy_version": v, "n": 64} for v in range(10)]


def test_large_push_goes_straight_to_warm_and_is_complete(tmp_path):
    big = make_rollouts(2000, tokens=256)  # ~6 MB > budget
    with open_buf(tmp_path, memory_limit_mb=2) as buf:
        keys = buf.push(big)
        assert len(buf) == 2000
        assert buf.stats()["hot"]["bytes"] <= 2 * 2**20
        got = buf.get(keys[::97], ["reward"])
        assert got.column("reward").to_pylist() == big.column("reward").take(pa.array(range(0, 2000, 97))).to_pylist()


# --- sampling, get, projection ----------------------------------------------------------------
def test_predicate_sampling_returns_only_matching_rows(tmp_path):
    with open_buf(tmp_path, memory_limit_mb=1) as buf:
        for v in range(12):
            buf.push(make_rollouts(64, tokens=64, version=v, seed=v))
        where = "reward > 0.5 AND policy_version >= 7"
        s = buf.sample(100, where=where, columns=["key", "reward", "policy_version"], seed=3)
        assert s.num_rows == 100
        assert len(set(s.column("key").to_pylist())) == 100
        assert all(r > 0.5 for r in s.column("reward").to_pylist())
        assert all(v >= 7 for v in s.column("policy_version").to_pylist())
        expected = buf.sql(f"SELECT count(*) FROM rollouts WHERE {where}").column(0)[0].as_py()
        with pytest.raises(lb.NotEnoughRowsError):
            buf.sample(expected + 1, where=where)


def test_sampling_is_deterministic_given_seed(tmp_path):
    with open_buf(tmp_path, memory_limit_mb=1) as buf:
        for v in range(4):
            buf.push(make_rollouts(64, tokens=64, version=v, seed=v))
        a = buf.sample(32, seed=11, return_keys=True).to_pylist()
        b = buf.sample(32, seed=11, return_keys=True).to_pylist()
        c = buf.sample(32, seed=12, return_keys=True).to_pylist()
        assert a == b and a != c


def test_uniform_with_replacement_can_repeat_and_matches(tmp_path):
    with open_buf(tmp_path) as buf:
        buf.push(make_rollouts(10, tokens=4, version=1))
        keys = buf.sample(200, where="policy_version = 1", sampler=lb.samplers.UniformSampler(replacement=True),
                          return_keys=True, seed=0).to_pylist()
        assert len(keys) == 200 and len(set(keys)) == 10


def test_get_projection_returns_only_asked_columns_in_key_order(tmp_path):
    with open_buf(tmp_path, memory_limit_mb=1) as buf:
        keys = []
        for v in range(6):
            keys += buf.push(make_rollouts(64, tokens=128, version=v, seed=v)).to_pylist()
        buf.flush()
        wanted = keys[::-37]  # mixes tiers, reversed order
        got = buf.get(wanted, columns=["reward", "policy_version"])
        assert got.column_names == ["reward", "policy_version"]
        with_keys = buf.get(wanted, columns=["key"])
        assert with_keys.column("key").to_pylist() == wanted
        with pytest.raises(lb.KeyNotFoundError):
            buf.get(["no-such-key"])


def _read_kb() -> int:
    """Bytes this process has read by read/pread system calls (``rchar``; warm reads are positioned reads),
    plus what the warm reader asked the kernel to copy out of its maps (``vmread``: not in ``rchar``)."""
    for line in open("/proc/self/io"):
        if line.startswith("rchar:"):
            return (int(line.split()[1]) + _VM_COPIED[0]) // 1024
    return 0


_VM_COPIED = [0]


@pytest.mark.parametrize("path", ["vmread", "preadv"])
def test_asking_for_reward_does_not_read_response_ids_from_disk(tmp_path, monkeypatch, path):
    """Reads read only the asked columns' bytes, on both warm read paths (copies from the maps by
    ``process_vm_readv``, counted as they are asked; ``preadv`` where the kernel refuses that). A fragment's
    first read in a process checks its whole file against its checksum: switched off here to see what a
    read itself reads."""
    from lakebuffer.tiers import vmread

    if path == "preadv":
        monkeypatch.setattr(vmread, "_usable", False)
    else:
        assert vmread.available(), "process_vm_readv refused here: only the preadv path is tested"
        real = vmread.copy

        def counted(out, addr, n):
            _VM_COPIED[0] += int(n.sum())
            return real(out, addr, n)

        monkeypatch.setattr(vmread, "copy", counted)
    with open_buf(tmp_path, memory_limit_mb=1) as buf:
        keys = buf.push(make_rollouts(1000, tokens=2048)).to_pylist()  # big: straight to warm
    with open_buf(tmp_path, memory_limit_mb=1) as buf:
        buf.warm.verify_reads = False
        buf.warm.ensure_verified(buf.warm.fragment_ids())  # opens them: the IPC metadata is read
        start = _read_kb()
        buf.get(keys[:200], columns=["reward"])
        small = _read_kb() - start
        buf.get(keys[:200], columns=["reward", "response_ids"])
        large = _read_kb() - start - small
        payload_kb = 200 * 2048 * 4 // 1024  # 200 rows of 2048 int32 tokens
        assert small < payload_kb / 4 < large, (small, large)
        # and SQL over the warm tier pushes the projection down to the fragments' reads
        before = _read_kb()
        buf.sql("SELECT avg(reward) FROM warm")
        sql_small = _read_kb() - before
        buf.sql("SELECT avg(len(response_ids)) FROM warm")
        sql_large = _read_kb() - before - sql_small
        assert sql_small * 5 < sql_large and sql_large > 1000 * 2048 * 4 / 1024 / 2, (sql_small, sql_large)


# --- restart, delete --------------------------------------------------------------------------
@pytest.mark.parametrize("durability", ["wal", "memory"])
def test_restart_gives_back_every_row_with_the_same_keys(tmp_path, durability):
    src = []
    with open_buf(tmp_path, memory_limit_mb=1, durability=durability) as buf:
        keys = []
        for v in range(8):
            t = make_rollouts(64, tokens=128, version=v, seed=v)
            src.append(t)
            keys += buf.push(t).to_pylist()
    with open_buf(tmp_path, memory_limit_mb=1, durability=durability) as buf:
        assert len(buf) == len(keys)
        got = buf.get(keys, ["key", "reward", "response_ids"])
        assert got.column("key").to_pylist() == keys
        src_all = pa.concat_tables(src)
        assert got.column("reward").to_pylist() == src_all.column("reward").to_pylist()
        assert got.column("response_ids").to_pylist() == src_all.column("response_ids").to_pylist()
        more = buf.push(make_rollouts(8, tokens=4)).to_pylist()
        assert not set(more) & set(keys)  # key sequence continues after restart


def test_index_agrees_with_data_after_deletes(tmp_path):
    with open_buf(tmp_path, memory_limit_mb=1) as buf:
        keys = []
        for v in range(8):
            keys += buf.push(make_rollouts(64, tokens=128, version=v, seed=v)).to_pylist()
        buf.flush()
        assert buf.delete(keys=keys[:10] + ["missing"]) == 10
        n_v3 = buf.sql("SELECT count(*) FROM rollouts WHERE policy_version = 3").column(0)[0].as_py()
        assert buf.delete(where="policy_version = 3") == n_v3 == 64
        assert buf.delete(where="policy_version = 3") == 0
        before = len(buf)
        for bad in ("key IN (SELECT key FROM meta)", "TRUE; DELETE FROM meta", "key IN (SELECT * FROM read_csv('x'))"):
            with pytest.raises(lb.QueryError):  # a delete's where is a predicate: no subqueries, no statements
                buf.delete(where=bad)
        assert len(buf) == before
        live = set(buf.sql("SELECT key FROM rollouts").column("key").to_pylist())
        assert len(live) == 512 - 74
        assert live.isdisjoint(keys[:10])
        idx_keys = {k for k, _, _ in buf.index.iter_keys()}
        assert idx_keys == live
        meta_keys = set(buf.sql("SELECT key FROM meta").column("key").to_pylist())
        assert meta_keys == live
        survivors = sorted(live)[:50]
        assert buf.get(survivors, ["key"]).column("key").to_pylist() == survivors
        with pytest.raises(lb.KeyNotFoundError):
            buf.get(keys[:1])
    with open_buf(tmp_path, memory_limit_mb=1) as buf:  # deletes survive restart
        assert set(buf.sql("SELECT key FROM rollouts").column("key").to_pylist()) == live


# --- bad input --------------------------------------------------------------------------------
def test_missing_column_raises_schema_error_and_stores_nothing(tmp_path):
    with open_buf(tmp_path) as buf:
        with pytest.raises(lb.SchemaError, match="reward"):
            buf.push(make_rollouts(4).drop_columns(["reward"]))
        assert len(buf) == 0 and buf.stats()["hot"]["rows"] == 0


def test_wrong_type_raises_schema_error_naming_column(tmp_path):
    t = make_rollouts(4)
    bad = t.set_column(t.column_names.index("reward"), "reward", pa.array(["a", "b", "c", "d"]))
    with open_buf(tmp_path) as buf:
        with pytest.raises(lb.SchemaError, match="'reward'"):
            buf.push(bad)
        bad2 = t.set_column(t.column_names.index("policy_version"), "policy_version", pa.array([1.5] * 4))
        with pytest.raises(lb.SchemaError, match="policy_version"):
            buf.push(bad2)
        assert len(buf) == 0


def test_nan_reward_rejected(tmp_path):
    t = make_rollouts(4)
    bad = t.set_column(t.column_names.index("reward"), "reward", pa.array([0.1, float("nan"), 0.2, 0.3], pa.float32()))
    with open_buf(tmp_path) as buf:
        with pytest.raises(lb.SchemaError, match="NaN"):
            buf.push(bad)
        assert len(buf) == 0


def test_unknown_column_needs_declaration_and_extra_columns_work(tmp_path):
    t = make_rollouts(4).append_column("difficulty", pa.array([1, 2, 3, 4], pa.int16()))
    with open_buf(tmp_path / "a") as buf:
        with pytest.raises(lb.SchemaError, match="difficulty"):
            buf.push(t)
    schema = pa.schema([pa.field("difficulty", pa.int16())])
    with open_buf(tmp_path / "b", schema=schema) as buf:
        buf.push(t)
        assert buf.sample(2, where="difficulty >= 3", columns=["difficulty"]).column(0).to_pylist() != []
        assert sorted(buf.sql("SELECT difficulty FROM rollouts").column(0).to_pylist()) == [1, 2, 3, 4]


def test_bad_predicate_raises_query_error_with_duckdb_message(tmp_path):
    with open_buf(tmp_path) as buf:
        buf.push(make_rollouts(8))
        with pytest.raises(lb.QueryError, match="no_such_column"):
            buf.sample(2, where="no_such_column > 1")
        with pytest.raises(lb.QueryError):
            buf.sample(2, where="reward >")
        with pytest.raises(lb.QueryError):
            buf.sample(2, where="reward > 0; DROP TABLE meta")
        with pytest.raises(lb.QueryError):
            buf.sql("SELEC 1")
        assert len(buf) == 8  # nothing lost


def test_closed_buffer_raises_clear_error(tmp_path):
    buf = open_buf(tmp_path)
    buf.push(make_rollouts(2))
    buf.close()
    with pytest.raises(lb.ClosedError, match="closed"):
        buf.push(make_rollouts(2))
    with pytest.raises(lb.ClosedError):
        buf.sample(1)


def test_second_writer_is_refused(tmp_path):
    with open_buf(tmp_path):
        with pytest.raises(lb.LockedError):
            open_buf(tmp_path)


def test_error_hierarchy_has_one_root_and_builtin_bases():
    assert issubclass(lb.SchemaError, ValueError) and issubclass(lb.SchemaError, lb.LakeBufferError)
    assert issubclass(lb.QueryError, ValueError) and issubclass(lb.ClosedError, RuntimeError)
    assert issubclass(lb.BackpressureError, TimeoutError) and issubclass(lb.CorruptionError, OSError)
    assert issubclass(lb.KeyNotFoundError, KeyError)


def test_sql_views_and_sample_counts(tmp_path):
    with open_buf(tmp_path) as buf:
        buf.push(make_rollouts(16, tokens=4))
        keys = buf.sample(16, return_keys=True).to_pylist()
        buf.flush()
        counts = buf.sql("SELECT sum(sample_count) FROM meta").column(0)[0].as_py()
        assert counts == 16 and len(set(keys)) == 16
        assert buf.get(keys[:3], ["sample_count"]).column(0).to_pylist() == [1, 1, 1]
    with open_buf(tmp_path) as buf:
        assert buf.sql("SELECT sum(sample_count) FROM meta").column(0)[0].as_py() == 16


def test_replay_counts_are_live_before_any_flush(tmp_path):
    with open_buf(tmp_path) as buf:
        keys = buf.push(make_rollouts(8, tokens=4)).to_pylist()
        buf.sample(8, seed=0, return_keys=True)  # every key once
        buf.sample(8, seed=1, return_keys=True)  # ... and twice
        assert buf.get(keys, ["sample_count"]).column(0).to_pylist() == [2] * 8  # queued counts included
        assert buf.sql("SELECT min(sample_count), max(sample_count) FROM rollouts").to_pylist()[0] == {
            "min(sample_count)": 2, "max(sample_count)": 2}
        assert buf.sample(8, sampler="max_reuse", k=3, return_keys=True, seed=2).to_pylist() != []
        with pytest.raises(lb.NotEnoughRowsError):
            buf.sample(1, sampler="max_reuse", k=3, seed=3)  # all 8 were sampled 3 times now


def test_replay_counts_stay_queued_until_their_queue_is_large(tmp_path, monkeypatch):
    # their UPDATE joins all of meta and holds the catalog: it must not run every few samples
    with open_buf(tmp_path) as buf:
        buf.push(make_rollouts(256, tokens=4))
        len(buf)  # inserts applied
        for seed in range(40):  # 10k replays: past the 8k insert threshold, below the counts one
            buf.sample(256, seed=seed, return_keys=True)
        buf.flush()
        assert buf._catalog.pending == (0, 40 * 256)
        monkeypatch.setattr("lakebuffer.catalog._QUEUED_COUNT_ROWS", 1000)
        buf.sample(256, seed=40, return_keys=True)
        buf.flush()  # the background flush ran
        assert buf._catalog.pending == (0, 0)
        with buf._catalog.counts_deferred():  # nothing queued: meta itself holds every replay
            assert buf.sql("SELECT sum(sample_count) FROM meta").column(0)[0].as_py() == 41 * 256


def test_bad_options_are_refused_before_anything_is_created(tmp_path):
    with pytest.raises(ValueError, match="durability"):
        lb.ReplayBuffer.open(tmp_path / "a", durability="fsync-everything")
    with pytest.raises(ValueError, match="memory_limit_mb"):
        lb.ReplayBuffer.open(tmp_path / "b", memory_limit_mb=0)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    with pytest.raises(dataclasses.FrozenInstanceError):
        lb.BufferOptions().durability = "memory"
