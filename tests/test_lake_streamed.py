"""Streamed reads of lake files larger than ``whole_file_bytes`` (deletes, compaction, restore on S3).

A streamed file is an fsspec file object under a ``ParquetFile``: with s3fs's default read cache (50 MiB
read ahead) it held most of a file per open file, and such an object sits in a reference cycle, so its
buffers lived until the cycle collector ran (a delete over 25 files of 35 MB held 143 MB of RssAnon;
the S3 memory test's ``compact`` reached 633 MB of a 383 MB bound with 16 policy versions a partition).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from lakebuffer.lake import Lake
from lakebuffer.lake.entries import entries_of
from lakebuffer.lake.options import LakeOptions
from lakebuffer.lake.reader import FileReader, open_streamed, read_group
from tests.test_lake import rollouts


def _lake(s3_server, s3_bucket) -> Lake:
    lake = Lake(f"{s3_bucket}/lake", s3_server.storage_options, row_group_rows=64)
    lake.commit_snapshot("run-a", [rollouts(400, seed=1, tokens=512, versions=(0,))])
    return lake


def _opened(lake: Lake, monkeypatch) -> list:
    """Every file object the lake's fsspec filesystem opens from now on (the real ones, recorded)."""
    files: list = []
    real = lake.store.fs.open

    def recording(*a, **kw):
        f = real(*a, **kw)
        files.append(f)
        return f

    monkeypatch.setattr(lake.store.fs, "open", recording)
    return files


def test_a_streamed_file_is_read_without_a_read_cache(s3_server, s3_bucket, monkeypatch):
    lake = _lake(s3_server, s3_bucket)
    entry = entries_of(lake.delta.table(), "run-a")[0]
    files = _opened(lake, monkeypatch)
    pf = open_streamed(lake.store, entry, verify=True)
    rows = sum(read_group(lake.store, entry, pf, i).num_rows for i in range(pf.metadata.num_row_groups))
    assert rows == int(entry["rows"])
    data = [f for f in files if f.path.endswith(".parquet") and "r" in f.mode]
    assert data, "the file was not opened through the lake's filesystem"
    # the sha256 pass streams in chunks of its own; the reader's file keeps no bytes it has read
    reader = data[-1]
    assert type(reader.cache).__name__ == "BaseCache", type(reader.cache)
    assert reader.blocksize <= 1 << 20


def test_the_file_reader_closes_each_streamed_file_when_it_moves_on(s3_server, s3_bucket, monkeypatch):
    lake = _lake(s3_server, s3_bucket)
    entries = entries_of(lake.delta.table(), "run-a")
    assert len(entries) >= 1
    small = LakeOptions(memory_bytes=1 << 10, target_file_bytes=1 << 10)  # every file is streamed
    assert all(int(e["bytes"]) > small.whole_file_bytes for e in entries)
    files = _opened(lake, monkeypatch)
    keys, seen = [], []
    for entry, pf, i in FileReader(lake.store, small, entries, verify=True).row_groups():
        if pf not in seen:
            assert all(p.closed for p in seen), "a file stayed open after its last row group"
            seen.append(pf)
        keys.append(read_group(lake.store, entry, pf, i).column("key"))
    assert all(p.closed for p in seen)
    assert all(f.closed for f in files if f.path.endswith(".parquet"))
    assert pc.count_distinct(pa.chunked_array(keys)).as_py() == sum(int(e["rows"]) for e in entries)
