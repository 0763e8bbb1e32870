"""Conformance suite for cold stores (``lakebuffer.lake.ColdStore``), fsspec style: one abstract class
of cases (``ColdStoreSuite``) mixed into one test class per implementation, each providing ``store``
(an empty, writable store with small row groups and files, so a snapshot spans several files).

Implementations: ``Lake`` on a local directory (``file://``) and on a real S3 HTTP server (moto, see
tests/s3server.py). fsspec's ``memory://`` is gone with the Delta format: deltalake reaches the store
itself and cannot see fsspec's in-memory files (``test_memory_url_is_refused``).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from lakebuffer.lake import ColdStore, Lake
from tests.rollouts import make_rollouts

RUN = "run-a"
SMALL = {"row_group_rows": 32, "target_file_bytes": 16 * 1024}


def rollouts(n: int, *, seed: int, versions: tuple[int, ...] = (0, 1, 2)) -> pa.Table:
    """``n`` rollouts with unique keys (``k<seed>-<i>``) over a few policy buckets."""
    t = make_rollouts(n, tokens=16, version=np.asarray(versions)[np.arange(n) % len(versions)], seed=seed)
    return t.add_column(0, "key", pa.array([f"k{seed}-{i:05d}" for i in range(n)], pa.string()))


def content(table: pa.Table) -> pa.Table:
    """The rows as a comparable value: the rollout columns, sorted by key (a multiset of rows)."""
    cols = ["key", "prompt_id", "policy_version", "prompt_ids", "response_ids", "response_logprobs", "reward", "verified"]
    return table.select(cols).sort_by("key").combine_chunks()


def scanned(store: ColdStore, run: str = RUN) -> pa.Table:
    batches = list(store.scan_batches(run))
    return pa.Table.from_batches(batches) if batches else pa.table({"key": pa.array([], pa.string())})


def without_keys(table: pa.Table, keys: list[str]) -> pa.Table:
    return table.filter(pc.invert(pc.is_in(table.column("key"), pa.array(keys, pa.string()))))


def stored_data_files(store: Lake) -> set[str]:
    """Every Parquet object under the lake, committed or not, as URLs comparable with ``files()``."""
    paths = store.fs.find(store.store.root)
    return {store.store.url_of(store.store.strip(p)[len(store.store.root) + 1 :]) for p in paths if p.endswith(".parquet")}


class ColdStoreSuite:
    """The cases every cold store passes. Subclasses provide the ``store`` fixture."""

    def test_is_a_cold_store(self, store):
        assert isinstance(store, ColdStore)

    def test_commit_scan_round_trip(self, store):
        t = rollouts(300, seed=1)
        m = store.commit_snapshot(RUN, t.to_batches(max_chunksize=50))
        assert m is not None and store.snapshots(RUN) == [m["snapshot_id"]] and store.runs() == [RUN]
        assert len(store.files(RUN)) > 1  # several files: the snapshot streamed through rotation
        got = scanned(store)
        assert got.num_rows == t.num_rows and got.column("run_id").unique().to_pylist() == [RUN]
        assert content(got).equals(content(t))
        assert content(store.dataset(RUN).to_table()).equals(content(t))
        assert set(t.column_names) <= set(store.schema(RUN).names)

    def test_failed_upload_is_invisible(self, store):
        base = rollouts(100, seed=1)
        store.commit_snapshot(RUN, [base])
        before = (store.latest_manifest(RUN), store.files(), store.stats())

        def failing() -> Iterator[pa.RecordBatch]:
            # enough rows to complete and upload several files before the failure
            yield from rollouts(400, seed=2).to_batches(max_chunksize=40)
            raise RuntimeError("generator died mid-snapshot")

        with pytest.raises(RuntimeError, match="mid-snapshot"):
            store.commit_snapshot(RUN, failing(), deleted_keys=["k1-00000"])
        assert (store.latest_manifest(RUN), store.files(), store.stats()) == before
        assert content(scanned(store)).equals(content(base))
        assert content(store.dataset().to_table()).equals(content(base))
        assert len(store.deleted_keys()) == 0
        # the aborted writer removed what it had uploaded: nothing but committed files is stored
        assert stored_data_files(store) == set(store.files())
        store.verify()

    def test_every_delta_reader_sees_the_same_rows(self, store):
        import deltalake

        t1, t2 = rollouts(120, seed=1), rollouts(80, seed=2)
        store.commit_snapshot(RUN, [t1])
        store.commit_snapshot(RUN, [t2], deleted_keys=["k1-00000", "k1-00007"])
        expected = content(without_keys(pa.concat_tables([t1, t2]), ["k1-00000", "k1-00007"]))
        dt = deltalake.DeltaTable(store.url, storage_options=store.delta_storage_options)
        assert content(dt.to_pyarrow_table()).equals(expected)
        assert sorted(dt.file_uris()) == sorted(store.files())

    def test_gc_never_removes_a_live_file(self, store):
        t1, t2 = rollouts(200, seed=1), rollouts(150, seed=2)
        store.commit_snapshot(RUN, [t1])
        store.commit_snapshot(RUN, [t2], deleted_keys=["k1-00000", "k1-00001"])
        store.compact(target_file_bytes=64 * 1024)  # replaced files become garbage
        expected = without_keys(pa.concat_tables([t1, t2]), ["k1-00000", "k1-00001"])
        assert store.gc(older_than_s=0) > 0
        assert stored_data_files(store) == set(store.files())
        assert content(scanned(store)).equals(content(expected))
        assert content(store.dataset().to_table()).equals(content(expected))
        assert store.verify()["files"] == len(store.files())
        assert store.gc(older_than_s=0) == 0  # nothing left to collect, still everything readable
        store.verify()

    def test_compact_keeps_content(self, store):
        parts = [rollouts(60, seed=s) for s in range(1, 6)]
        for i, p in enumerate(parts):
            store.commit_snapshot(RUN, [p], deleted_keys=[f"k{i}-00003"] if i else ())
        before_scan, before_ds = content(scanned(store)), content(store.dataset().to_table())
        assert before_scan.equals(before_ds) and before_scan.num_rows == 300 - 4
        files_before = len(store.files(RUN))
        stats = store.compact(target_file_bytes=1 << 20)
        assert stats["files_rewritten"] > 0 and len(store.files(RUN)) < files_before
        assert content(scanned(store)).equals(before_scan)
        assert content(store.dataset().to_table()).equals(before_scan)
        store.verify()


class TestLocalLake(ColdStoreSuite):
    @pytest.fixture
    def store(self, tmp_path) -> Lake:
        return Lake(f"file://{tmp_path}/lake", **SMALL)


class TestS3Lake(ColdStoreSuite):
    @pytest.fixture
    def store(self, s3_server, s3_bucket) -> Lake:
        return Lake(f"{s3_bucket}/lake", s3_server.storage_options, **SMALL)


def test_memory_url_is_refused():
    from lakebuffer.errors import LakeError

    with pytest.raises(LakeError, match="memory"):
        Lake("memory://lake-x")
