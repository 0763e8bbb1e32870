"""Issue 23: the numpy decoder of Parquet offset indexes (``lake/offsetindex.py``) returns what the
Thrift decoder returns, for indexes pyarrow writes and for large offsets, and refuses (None) any
index not laid out as it expects, so the caller falls back to the Thrift decoder."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lakebuffer.lake import offsetindex
from lakebuffer.lake.fs import LakeFS
from lakebuffer.lake.pagedecode import thrift
from lakebuffer.lake.rowpages import RowPages


def _thrift_pages(index: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    locs = thrift(index, "OffsetIndex").page_locations
    return (np.array([x.first_row_index for x in locs], np.int64), np.array([x.offset for x in locs], np.int64),
            np.array([x.compressed_page_size for x in locs], np.int64))


def _varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def _zz(v: int) -> bytes:
    return _varint((v << 1) ^ (v >> 63))


def _encode(locs: list[tuple[int, int, int]]) -> bytes:
    """An OffsetIndex in Thrift compact protocol, as parquet writers lay it out."""
    head = bytes([0x19, (len(locs) << 4) | 12]) if len(locs) < 15 else bytes([0x19, 0xFC]) + _varint(len(locs))
    body = b"".join(b"\x16" + _zz(o) + b"\x15" + _zz(s) + b"\x16" + _zz(r) + b"\x00" for o, s, r in locs)
    return head + body + b"\x00"


def test_indexes_pyarrow_writes_decode_as_thrift_does(tmp_path):
    rng = np.random.default_rng(3)
    lens = rng.integers(0, 3000, 4000)
    t = pa.table({"key": [f"k{i:06d}" for i in range(4000)],
                  "ids": pa.ListArray.from_arrays(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32),
                                                  pa.array(rng.integers(0, 150_000, int(lens.sum()), dtype=np.int32))),
                  "reward": rng.random(4000)})
    pq.write_table(t, tmp_path / "f.parquet", data_page_size=8 * 1024, write_page_index=True, row_group_size=2500,
                   use_dictionary=False, write_batch_size=16)
    lay = RowPages(LakeFS(str(tmp_path)), 1 << 30).layout({"path": "f.parquet", "bytes": os.path.getsize(tmp_path / "f.parquet")})
    sizes = []
    for group in lay.chunks:
        for chunk in group.values():
            got = offsetindex.decode(chunk._index)
            want = _thrift_pages(chunk._index)
            assert got is not None
            first, off, size = got
            assert np.array_equal(first, want[0]) and np.array_equal(off, want[1]) and np.array_equal(size, want[2])
            assert first.dtype == np.int32 and size.dtype == np.int32 and off.dtype == np.int64
            sizes.append(len(first))
    assert max(sizes) > 100 and min(sizes) < 15  # long and short list headers both seen


@pytest.mark.parametrize("n", [1, 14, 15, 700])
def test_large_values_and_both_list_headers(n):
    locs = [(2**40 + 12345 * i, 30_000 + i, 2**33 + 7 * i) for i in range(n)]
    got = offsetindex.decode(_encode(locs))
    assert got is not None
    assert got[1].tolist() == [o for o, _s, _r in locs]
    assert got[2].tolist() == [s for _o, s, _r in locs]
    want = _thrift_pages(_encode(locs))
    assert np.array_equal(want[1], got[1]) and np.array_equal(want[2], got[2])
    # first rows are row-group relative (int32 in the layout): what the writer stores fits; here the
    # low 32 bits are kept, as the Thrift path's astype(int32) keeps them
    assert np.array_equal(got[0], want[0].astype(np.int32))


def test_other_layouts_are_refused_not_misread():
    good = _encode([(4, 100, 0), (104, 90, 10), (194, 80, 20)])
    assert offsetindex.decode(good) is not None
    assert offsetindex.decode(b"") is None
    assert offsetindex.decode(good[:-8]) is None  # cut short
    assert offsetindex.decode(b"\x1a" + good[1:]) is None  # not a list in field 1
    swapped = good.replace(b"\x15", b"\x16", 1)  # the size field typed i64: not the expected layout
    assert offsetindex.decode(swapped) is None
    extra = bytearray(good)
    extra[2:2] = b"\x16" + _zz(5)  # a field before the offset: the ids no longer line up
    assert offsetindex.decode(bytes(extra)) is None
