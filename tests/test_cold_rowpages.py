"""Issue 23: the row reader (``lake/rowpages.py``) serves cold ``get`` from the pages of the asked rows.

It decodes what the lake writer writes (every column type of the rollout schema, nulls in scalars,
lists, list items and strings, dictionary-coded strings, fixed-size binaries), returns rows equal to
pyarrow's, reads a small part of the files, keeps its footers within its cache, and leaves to the
older reader every file whose bytes it cannot verify: a damaged page is never returned by it (the
caller then reports the ``CorruptionError``; ``test_cold_pages.py``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lakebuffer as lb
from lakebuffer.errors import CorruptionError
from lakebuffer.lake.fs import LakeFS
from lakebuffer.lake.rowhash import HASH_COLUMN, hash_column, schema_with_hash
from lakebuffer.lake.rowpages import RowPages, Unreadable
from lakebuffer.lake.writer import by_key, parquet_options
from tests.test_cold_pages import _fill


def _table(n: int = 300, seed: int = 0) -> pa.Table:
    """Every column kind the writer stores, with nulls where the type allows them."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(0, 40, n)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    items = rng.integers(-5, 5000, int(offsets[-1]), dtype=np.int64)
    item_null = rng.random(int(offsets[-1])) < 0.1
    row_null = rng.random(n) < 0.15
    opt_list = pa.ListArray.from_arrays(pa.array(offsets), pa.array(items, mask=item_null), mask=pa.array(row_null))
    req_list = pa.ListArray.from_arrays(pa.array(offsets), pa.array(rng.random(int(offsets[-1]), dtype=np.float32)))
    words = [None if rng.random() < 0.2 else f"w{int(rng.integers(0, 30))}" for _ in range(n)]
    return pa.table({
        "key": [f"k{i:06d}" for i in range(n)],
        "tokens": opt_list,
        "logprobs": req_list,
        "reward": pa.array(rng.random(n), mask=rng.random(n) < 0.2),
        "step": pa.array(rng.integers(0, 1 << 40, n), pa.int64()),
        "small": pa.array(rng.integers(-100, 100, n), pa.int8()),
        "count": pa.array(rng.integers(0, 1 << 31, n), pa.uint32()),
        "ok": pa.array(rng.random(n) > 0.5, mask=rng.random(n) < 0.1),
        "word": pa.array(words, pa.string()),
        "label": pa.array([f"label-{i}" for i in range(n)], pa.string()),
        "at": pa.array(rng.integers(0, 1 << 50, n), pa.timestamp("us", tz="UTC")),
        "blob": pa.array([bytes([i % 256]) * 4 for i in range(n)], pa.binary(4)),
    })


def _write(path: Path, t: pa.Table, rows_per_group: int = 128) -> None:
    t = by_key(t)
    names = t.column_names
    schema = schema_with_hash(t.schema)  # as the lake writer: ``_lb_hash`` required, last
    full = t.append_column(schema.field(HASH_COLUMN), hash_column(t, names))
    with pq.ParquetWriter(path, schema, **parquet_options(schema)) as w:
        w.write_table(full.cast(schema), row_group_size=rows_per_group)


def _entry(root: Path, name: str) -> dict:
    return {"path": name, "bytes": os.path.getsize(root / name)}


def test_rows_of_every_column_kind_equal_pyarrows(tmp_path):
    t = _table()
    _write(tmp_path / "f.parquet", t)
    reader = RowPages(LakeFS(str(tmp_path)), 1 << 20)
    entry = _entry(tmp_path, "f.parquet")
    cols = [c for c in t.column_names if c != "key"]
    # every column kind is decoded here (none left to the older reader)
    assert reader.serves(entry, cols)
    ref = pq.read_table(tmp_path / "f.parquet").drop_columns([HASH_COLUMN])
    rows = np.array([0, 1, 5, 127, 128, 129, 200, 299, 17, 17 + 128], np.int64)  # across row groups, unsorted
    got = reader.take(entry, ref.column("key").take(pa.array(rows)).to_pylist(), rows, cols)
    want = ref.take(pa.array(rows))
    for c in ["key", *cols]:
        assert got.column(c).to_pylist() == want.column(c).to_pylist(), c
        assert got.column(c).type == want.column(c).type, c
    assert reader.counts["rows"] == len(rows)


def test_lists_without_nulls_are_decoded_all_pages_at_once_and_equal_pyarrows(tmp_path, monkeypatch):
    """Token ids and log-probs (lists with no null row, empty list or null item) are decoded by one pass
    over all their pages (``simple_list_rows``): rows equal pyarrow's at page starts, ends and within,
    across row groups; a column with nulls in the same take goes page by page, equal too."""
    import lakebuffer.lake.rowplan as rowplan

    rng = np.random.default_rng(5)
    n = 400
    lens = rng.integers(1, 3000, n)  # ~6 KB rows: ~5 a 32 KiB page, many pages a row group
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    ids = pa.ListArray.from_arrays(pa.array(offsets), pa.array(rng.integers(0, 150_000, int(offsets[-1]), dtype=np.int32)))
    lp = pa.LargeListArray.from_arrays(pa.array(offsets.astype(np.int64)), pa.array(-rng.random(int(offsets[-1]), dtype=np.float32)))
    with_nulls = pa.ListArray.from_arrays(pa.array(offsets), pa.array(rng.integers(0, 9, int(offsets[-1])),
                                                                      mask=rng.random(int(offsets[-1])) < 0.05))
    t = pa.table({"key": [f"k{i:06d}" for i in range(n)], "ids": ids, "lp": lp, "mixed": with_nulls})
    _write(tmp_path / "f.parquet", t, rows_per_group=150)
    ref = pq.read_table(tmp_path / "f.parquet").drop_columns([HASH_COLUMN])
    calls: list[str] = []
    real = rowplan.simple_list_rows

    def spy(leaf, bodies, which, rows):
        got = real(leaf, bodies, which, rows)
        calls.append(f"{leaf.name}:{'pass' if got is not None else 'pages'}")
        return got

    monkeypatch.setattr(rowplan, "simple_list_rows", spy)
    reader = RowPages(LakeFS(str(tmp_path)), 1 << 20)
    entry = _entry(tmp_path, "f.parquet")
    lay = reader.layout(entry)
    firsts = sorted({int(lay.row_starts[g]) + int(r) for g in range(len(lay.chunks)) for r in lay.chunks[g]["ids"].pages()[0]})
    edges = sorted({r for f in firsts for r in (f - 1, f, f + 1) if 0 <= r < n})  # each page's first and last rows
    rows = np.array(edges + rng.choice(n, 60, replace=False).tolist(), np.int64)
    got = reader.take(entry, ref.column("key").take(pa.array(rows)).to_pylist(), rows, ["ids", "lp", "mixed"])
    want = ref.take(pa.array(rows))
    for c in ["key", "ids", "lp", "mixed"]:
        assert got.column(c).to_pylist() == want.column(c).to_pylist(), c
        assert got.column(c).type == want.column(c).type, c
    assert len(firsts) > 10  # many pages
    assert sorted(calls) == ["ids:pass", "lp:pass", "mixed:pages"], calls


def test_damaged_levels_of_a_list_page_are_refused_not_returned(tmp_path, monkeypatch):
    """A list page whose levels or values do not hold its rows is refused by the one-pass decoder, or
    (damage the page CRC did not catch, simulated after the check) its rows fail their digests: a take
    never returns them."""
    import lakebuffer.lake.rowplan as rowplan
    from lakebuffer.lake.pagedecode import Unreadable as Refused
    from lakebuffer.lake.pagedecode import decompress, page_header, simple_list_rows

    rng = np.random.default_rng(6)
    lens = rng.integers(1, 3000, 60)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    t = pa.table({"key": [f"k{i:06d}" for i in range(60)],
                  "ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(rng.integers(0, 9, int(offsets[-1]), dtype=np.int32)))})
    _write(tmp_path / "f.parquet", t, rows_per_group=60)
    reader = RowPages(LakeFS(str(tmp_path)), 1 << 20)
    entry = _entry(tmp_path, "f.parquet")
    lay = reader.layout(entry)
    first, offs, sizes = lay.chunks[0]["ids"].pages()
    raw = (tmp_path / "f.parquet").read_bytes()[int(offs[1]):int(offs[1]) + int(sizes[1])]
    ph, comp = page_header(raw)
    body = np.array(decompress(ph, comp, lay.chunks[0]["ids"].codec))
    leaf = lay.leaves["ids"]
    in_page = int(first[2] - first[1])
    one = np.zeros(1, np.int64)
    ok = simple_list_rows(leaf, [(ph, body)], one, np.array([in_page - 1]))
    assert ok is not None and ok.to_pylist() == [t.column("ids")[int(first[1]) + in_page - 1].as_py()]
    with pytest.raises(Refused, match="beyond"):
        simple_list_rows(leaf, [(ph, body)], one, np.array([in_page]))
    with pytest.raises(Refused, match="cut short"):
        simple_list_rows(leaf, [(ph, body[:len(body) - 4])], one, np.array([0]))

    rows = np.arange(int(first[1]), int(first[2]), dtype=np.int64)  # every row of page 1
    keys = t.column("key").take(pa.array(rows)).to_pylist()
    assert reader.take(entry, keys, rows, ["ids"]).column("ids").to_pylist() == t.column("ids").take(pa.array(rows)).to_pylist()
    real = rowplan.decompress
    hit = []

    def damaged(ph_, comp_, codec):
        out = np.array(real(ph_, comp_, codec))
        if len(out) == len(body) and (out == body).all():  # that page: its levels' first run made longer
            out[4] ^= 0x02
            hit.append(1)
        return out

    monkeypatch.setattr(rowplan, "decompress", damaged)
    with pytest.raises(Refused):
        reader.take(entry, keys, rows, ["ids"])
    assert hit == [1]


def test_a_page_header_claiming_absurd_sizes_is_damage_refused_before_any_allocation(tmp_path):
    """A page's header is outside its CRC: one whose uncompressed size or value count is beyond any page
    the writer makes (a flipped varint byte) is ``PageDamaged`` before a decoder sizes anything by it."""
    import warnings

    from lakebuffer.lake.pagedecode import MAX_PAGE_BYTES, MAX_PAGE_ENTRIES, PageDamaged, page_header

    with warnings.catch_warnings():  # fastparquet's import asks pandas for an option pandas 3 deprecates
        warnings.simplefilter("ignore")
        from fastparquet.cencoding import ThriftObject

    t = _table()
    _write(tmp_path / "f.parquet", t)
    reader = RowPages(LakeFS(str(tmp_path)), 1 << 20)
    lay = reader.layout(_entry(tmp_path, "f.parquet"))
    _first, offs, sizes = lay.chunks[0]["logprobs"].pages()
    raw = (tmp_path / "f.parquet").read_bytes()[int(offs[0]):int(offs[0]) + int(sizes[0])]
    ph, comp = page_header(raw)
    body = bytes(comp)

    def with_header(change) -> bytes:
        fields = dict(ph.contents)
        fields[5] = dict(fields[5])
        change(fields)
        return bytes(ThriftObject("PageHeader", fields).to_bytes()) + body

    assert page_header(with_header(lambda f: None))[0].contents[2] == ph.contents[2]  # re-serialized: still a page
    with pytest.raises(PageDamaged, match="claims"):
        page_header(with_header(lambda f: f.__setitem__(2, MAX_PAGE_BYTES + 1)))
    with pytest.raises(PageDamaged, match="claims"):
        page_header(with_header(lambda f: f[5].__setitem__(1, MAX_PAGE_ENTRIES + 1)))


def test_a_key_that_is_not_the_rows_is_refused_not_returned(tmp_path):
    t = _table()
    _write(tmp_path / "f.parquet", t)
    reader = RowPages(LakeFS(str(tmp_path)), 1 << 20)
    entry = _entry(tmp_path, "f.parquet")
    # row 3 holds k000003: asked as another key, its digest does not match
    with pytest.raises(Unreadable, match="digest"):
        reader.take(entry, ["k000004"], np.array([3]), ["tokens"])
    with pytest.raises(Unreadable, match="beyond"):
        reader.take(entry, ["k999999"], np.array([300]), ["tokens"])


def test_a_damaged_page_is_never_returned(tmp_path):
    t = _table()
    path = tmp_path / "f.parquet"
    _write(path, t)
    reader = RowPages(LakeFS(str(tmp_path)), 1 << 20)
    entry = _entry(tmp_path, "f.parquet")
    md = pq.read_metadata(path)
    ok = 0
    for j in range(md.num_columns):
        c = md.row_group(0).column(j)
        name = c.path_in_schema.split(".")[0]
        if name == "key":
            continue  # the row reader does not read key pages: the digest proves the asked key
        start = c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset
        original = path.read_bytes()
        data = bytearray(original)
        data[int(start + c.total_compressed_size - 3)] ^= 0x04  # inside the chunk's last page's values
        path.write_bytes(bytes(data))
        try:
            # a digest is checked against the columns returned: damage in the digests shows with all of them
            asked = [name] if name != HASH_COLUMN else [n for n in t.column_names if n != "key"]
            reader.take(entry, [f"k{r:06d}" for r in range(128)], np.arange(128), asked)
        except Unreadable:
            ok += 1
        finally:
            path.write_bytes(original)
    assert ok == md.num_columns - 1  # every damaged chunk refused (its page CRC or a row digest)


def _digest_spans(reader: RowPages, entry: dict, rows: np.ndarray, cols: list[str]) -> list[int]:
    """The sizes of the reads a take plans for ``_lb_hash`` (one per distinct page or row)."""
    import lakebuffer.lake.rowpages as rowpages

    plan = reader._plan(entry, [f"k{r:06d}" for r in rows], rows, cols)
    return [size for (_off, size), n in plan.wanted.items() if plan.codecs[n] == rowpages.RAW] if plan.direct \
        else [-1]


def test_digests_are_read_row_by_row_where_the_file_stores_them_plain_and_are_still_checked(tmp_path):
    """The writer stores ``_lb_hash`` uncompressed and PLAIN, so a take reads each asked row's digest
    bytes alone (width bytes a row, not a page). A flipped byte in any row's digest fails that row;
    a file written the older way (zstd digests) is read page by page with the same result."""
    t = _table()
    path = tmp_path / "f.parquet"
    _write(path, t)
    md = pq.read_metadata(path)
    hash_chunk = md.row_group(0).column(md.num_columns - 1)
    assert hash_chunk.path_in_schema == HASH_COLUMN and hash_chunk.compression == "UNCOMPRESSED"
    reader = RowPages(LakeFS(str(tmp_path)), 1 << 20)
    entry = _entry(tmp_path, "f.parquet")
    cols = [c for c in t.column_names if c != "key"]
    width = 8 * len(t.column_names)
    rows = np.array([3, 4, 130, 299, 64], np.int64)
    assert _digest_spans(reader, entry, rows, cols) == [width] * len(rows)
    want = reader.take(entry, [f"k{r:06d}" for r in rows], rows, cols)
    assert want.column("key").to_pylist() == [f"k{r:06d}" for r in rows]

    # the older layout: same rows, read page by page
    old = tmp_path / "old.parquet"
    opts = parquet_options(pa.schema([*t.schema, pa.field(HASH_COLUMN, pa.binary(width), nullable=False)]))
    opts.update(compression="zstd", compression_level=1)
    opts.pop("column_encoding")
    full = by_key(t)
    schema = schema_with_hash(t.schema)
    full = full.append_column(HASH_COLUMN, hash_column(full, t.column_names)).cast(schema)
    with pq.ParquetWriter(old, schema, **opts) as w:
        w.write_table(full, row_group_size=128)
    assert pq.read_metadata(old).row_group(0).column(md.num_columns - 1).compression == "ZSTD"
    old_entry = _entry(tmp_path, "old.parquet")
    assert _digest_spans(reader, old_entry, rows, cols) == [-1]
    assert reader.take(old_entry, [f"k{r:06d}" for r in rows], rows, cols).equals(want)

    # damage: one byte of one row's digest, for every digest byte position class (first, middle, last)
    original = path.read_bytes()
    plan = reader._plan(entry, ["k000130"], np.array([130]), cols)
    (off, size), = [span for span, n in plan.wanted.items() if plan.codecs[n] == "raw"]
    for at in (off, off + size // 2, off + size - 1):
        data = bytearray(original)
        data[at] ^= 0x10
        path.write_bytes(bytes(data))
        reader.forget("f.parquet")
        with pytest.raises(Unreadable, match="digest"):
            reader.take(entry, ["k000130"], np.array([130]), cols)
        # its neighbours are not touched by that byte and are still served
        assert reader.take(entry, ["k000129", "k000131"], np.array([129, 131]), cols).num_rows == 2
    path.write_bytes(original)


def test_unsupported_chunks_are_left_to_the_older_reader(tmp_path):
    t = pa.table({"key": ["a", "b"], "nested": pa.array([[[1]], [[2, 3]]], pa.list_(pa.list_(pa.int32())))})
    _write(tmp_path / "f.parquet", t)
    reader = RowPages(LakeFS(str(tmp_path)), 1 << 20)
    entry = _entry(tmp_path, "f.parquet")
    assert not reader.serves(entry, ["nested"])
    with pytest.raises(Unreadable):
        reader.take(entry, ["a"], np.array([0]), ["nested"])
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    assert not reader.serves(_entry(tmp_path, "junk.parquet"), [])


def test_the_footer_cache_stays_within_its_bytes(tmp_path):
    for i in range(12):
        _write(tmp_path / f"f{i}.parquet", _table(200, seed=i))
    one = RowPages(LakeFS(str(tmp_path)), 1 << 30)
    size = one.layout(_entry(tmp_path, "f0.parquet")).nbytes
    reader = RowPages(LakeFS(str(tmp_path)), 3 * size)
    for i in range(12):
        reader.layout(_entry(tmp_path, f"f{i}.parquet"))
        assert reader.held_bytes() <= 3 * size
    assert reader.held_bytes() > 0


def _cold_buffer(path: Path, lake: str, **kw) -> lb.ReplayBuffer:
    return lb.ReplayBuffer.open(path, lake=lake, memory_limit_mb=2, snapshot_interval_s=0, disk_limit_gb=2 / 1024, **kw)


def _cold(buf: lb.ReplayBuffer) -> list[str]:
    return buf.sql("SELECT key FROM cold_rows ORDER BY key").column("key").to_pylist()


def _check_buffer_get(buf: lb.ReplayBuffer, ref: pa.Table) -> None:
    cold = _cold(buf)
    assert len(cold) > 200
    picks = [cold[i] for i in np.random.default_rng(1).choice(len(cold), 64, replace=False).tolist()]
    got = buf.get(picks)  # every column
    idx = {k: i for i, k in enumerate(ref.column("key").to_pylist())}
    want = ref.take(pa.array([idx[k] for k in picks]))
    for c in want.column_names:
        assert got.column(c).to_pylist() == want.column(c).to_pylist(), c
    reader = next(iter(buf._state.cold._page_readers.values())).rows
    assert reader.counts["rows"] >= 64 and reader.counts["left"] == 0, reader.counts
    # the lake's files store their digests so that a get reads each row's digest bytes alone
    entry = buf.lake.latest_manifest(buf.run_id)["files"][0]
    assert reader._plan(entry, ["?"], np.array([0]), ["response_ids"]).direct


def test_a_buffers_cold_get_is_served_by_the_row_reader(tmp_path):
    with _cold_buffer(tmp_path / "buf", str(tmp_path / "lake")) as buf:
        _check_buffer_get(buf, _fill(buf, batches=16))


def test_a_get_larger_than_a_part_is_read_part_by_part(tmp_path, monkeypatch):
    import lakebuffer.lake.rowpages as rowpages

    monkeypatch.setattr(rowpages, "PART_BYTES", 64 * 1024)  # a few files' pages a part (memory bound)
    parts = []
    real = rowpages.RowPages._bodies_of
    monkeypatch.setattr(rowpages.RowPages, "_bodies_of",
                        lambda self, items, plans, part, errors: parts.append(len(part)) or real(self, items, plans, part, errors))
    with _cold_buffer(tmp_path / "buf", str(tmp_path / "lake")) as buf:
        _check_buffer_get(buf, _fill(buf, batches=16))
    assert len(parts) > 1


def _drop_from_page_cache(paths: list[Path]) -> bool:
    """Drop the files' clean pages (``POSIX_FADV_DONTNEED``); whether they then are out of the cache."""
    out = True
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            try:
                os.preadv(fd, [bytearray(1)], os.fstat(fd).st_size // 2, os.RWF_NOWAIT)
                out = False
            except BlockingIOError:
                pass
        finally:
            os.close(fd)
    return out


@pytest.mark.parametrize("ahead", ["all", "one part"])
def test_a_get_from_disk_announces_its_pages_and_decodes_part_by_part(tmp_path, monkeypatch, ahead):
    """Local files whose pages are not in the page cache: the take's page ranges are announced
    (``ANNOUNCE_AHEAD`` bytes ahead of the part being read: all of a small take, or part by part) and
    the parts are decoded while the kernel reads on (``OVERLAP_BYTES``); from the page cache nothing is
    announced and the take is one part. The rows are the same."""
    import lakebuffer.lake.rowpages as rowpages

    monkeypatch.setattr(rowpages, "OVERLAP_BYTES", 64 * 1024)
    if ahead == "one part":
        monkeypatch.setattr(rowpages, "ANNOUNCE_AHEAD", 64 * 1024)
    announced, parts, events = [], [], []
    real_announce, real_bodies = rowpages.RowPages._announce, rowpages.RowPages._bodies_of
    real_in_cache = rowpages.RowPages._in_page_cache
    probes: list[bool] = []

    def announce(self, entry, plan):
        announced.append(entry["path"])
        events.append("announce")
        return real_announce(self, entry, plan)

    def bodies(self, items, plans, part, errors):
        parts.append(len(part))
        events.append("read")
        return real_bodies(self, items, plans, part, errors)

    def in_cache(self, entry, plan):
        probes.append(real_in_cache(self, entry, plan))
        return probes[-1]

    monkeypatch.setattr(rowpages.RowPages, "_announce", announce)
    monkeypatch.setattr(rowpages.RowPages, "_bodies_of", bodies)
    monkeypatch.setattr(rowpages.RowPages, "_in_page_cache", in_cache)
    with _cold_buffer(tmp_path / "buf", str(tmp_path / "lake")) as buf:
        ref = _fill(buf, batches=16)
        cold = _cold(buf)  # (a scan: it reads the files whole)
        picks = [cold[i] for i in np.random.default_rng(2).choice(len(cold), 64, replace=False).tolist()]
        idx = {k: i for i, k in enumerate(ref.column("key").to_pylist())}
        want = ref.take(pa.array([idx[k] for k in picks])).select(["key", "response_ids", "reward"])
        files = [Path(buf.lake.store.abs(e["path"])) for e in buf.lake.latest_manifest(buf.run_id)["files"]]
        # the premise is what the take's own probe saw (a fadvise can leave some pages behind: the
        # assertions follow the probe, and a few tries give the disk path its chance)
        for _ in range(4):
            _drop_from_page_cache(files)
            for seen in (announced, parts, events, probes):
                seen.clear()
            got = buf.get(picks, ["key", "response_ids", "reward"])
            if probes and not probes[0]:
                break
        on_disk = bool(probes) and not probes[0]
        assert len(probes) <= 1, probes  # one probe per take
        assert got.to_pylist() == want.to_pylist()
        assert bool(announced) == on_disk and (len(parts) > 1) == on_disk, (announced, parts, on_disk)
        if on_disk:  # every file of the take announced once; all before the first read, or along the reads
            assert sorted(announced) == sorted(set(announced)) and len(announced) == sum(parts)
            first_read, last_announce = events.index("read"), len(events) - 1 - events[::-1].index("announce")
            assert (first_read < last_announce) == (ahead == "one part"), events
        announced.clear()
        parts.clear()
        assert buf.get(picks, ["key", "response_ids", "reward"]).to_pylist() == want.to_pylist()  # page cache
        assert announced == [] and len(parts) == 1, (announced, parts)


def test_a_buffers_cold_get_on_s3_is_served_by_the_row_reader(tmp_path, s3_server, s3_bucket):
    with _cold_buffer(tmp_path / "buf", f"{s3_bucket}/lake", storage_options=s3_server.storage_options) as buf:
        _check_buffer_get(buf, _fill(buf, batches=10))


def test_a_damaged_page_in_the_buffers_lake_is_a_corruption_error_naming_the_file(tmp_path):
    with _cold_buffer(tmp_path / "buf", str(tmp_path / "lake")) as buf:
        _fill(buf, batches=16)
        cold = _cold(buf)
        key = cold[len(cold) // 2]
        before = buf.get([key], ["response_ids"])
        m = buf.lake.latest_manifest(buf.run_id)
        paths = [Path(buf.lake.store.abs(e["path"])) for e in m["files"]]
        hit = next(p for p in paths if key in pq.read_table(p, columns=["key"]).column("key").to_pylist())
        row = pq.read_table(hit, columns=["key"]).column("key").to_pylist().index(key)
        md = pq.read_metadata(hit)
        starts = np.cumsum([0] + [md.row_group(g).num_rows for g in range(md.num_row_groups)])
        g = int(np.searchsorted(starts, row, side="right") - 1)
        col = next(md.row_group(g).column(j) for j in range(md.num_columns)
                   if md.row_group(g).column(j).path_in_schema.startswith("response_ids"))
        original = hit.read_bytes()
        data = bytearray(original)
        for off in range(col.data_page_offset + 64, col.data_page_offset + col.total_compressed_size, 4096):
            data[off] ^= 0x01  # every page of the chunk: the row's page among them
        hit.write_bytes(bytes(data))
        reader = next(iter(buf._state.cold._page_readers.values()))
        asked = []
        real = reader._take_datafusion
        reader._take_datafusion = lambda items, columns: asked.append(len(items)) or real(items, columns)
        try:
            with pytest.raises(CorruptionError, match=str(hit)):
                buf.get([key], ["response_ids"])
        finally:
            hit.write_bytes(original)
            reader._take_datafusion = real
        # the page failed its CRC: the file is damaged; DataFusion (which checks no page CRC, and could
        # return the row if the damage missed its bytes) was not asked
        assert asked == [], asked
        assert buf.get([key], ["response_ids"]).equals(before)


def test_pages_not_in_the_page_cache_are_read_by_the_pool_and_equal(tmp_path, monkeypatch):
    """A file whose pages would wait for the disk is read on the fetch threads (their waits overlap);
    one in the page cache is read at once. Either way the rows are the same."""
    import lakebuffer.lake.rowpages as rowpages

    if rowpages.NOWAIT is None:
        pytest.skip("this platform has no RWF_NOWAIT: every local file is read on the fetch threads")
    threads: list[str] = []
    real = rowpages.RowPages._fetch

    def spy(self, entry, plan, cached_only=False):
        if not cached_only:
            threads.append(__import__("threading").current_thread().name)
        return real(self, entry, plan, cached_only)

    monkeypatch.setattr(rowpages.RowPages, "_fetch", spy)
    with _cold_buffer(tmp_path / "buf", str(tmp_path / "lake")) as buf:
        ref = _fill(buf, batches=16)
        _check_buffer_get(buf, ref)  # files just written: in the page cache, read at once
        assert threads == []
        # the disk's view: every cached-only read refused (as after the page cache dropped the files)
        monkeypatch.setattr(rowpages, "_read_cached", lambda fd, a, b: (_ for _ in ()).throw(rowpages.WouldBlock()))
        _check_buffer_get(buf, ref)
        assert len(threads) > 1 and all(n.startswith("lakebuffer-pages") for n in threads), threads


def test_a_cached_read_returns_the_bytes_or_refuses(tmp_path):
    import lakebuffer.lake.rowpages as rowpages

    if rowpages.NOWAIT is None:
        pytest.skip("no RWF_NOWAIT here")
    data = os.urandom(100_000)
    (tmp_path / "f").write_bytes(data)
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        os.pread(fd, len(data), 0)  # in the page cache now
        assert bytes(rowpages._read_cached(fd, 1000, 70_000)) == data[1000:70_000]
        assert len(rowpages._read_cached(fd, 99_000, 120_000)) == 1000  # past the end: short (the caller refuses it)
    finally:
        os.close(fd)
    reader = RowPages(LakeFS(str(tmp_path)), 1 << 20)
    with pytest.raises(Unreadable, match="shorter"):
        reader._read_ranges("f", [(99_000, 120_000)], cached_only=True)


def test_a_reopened_buffer_reads_its_cold_layouts_ahead_so_its_first_get_reads_none(tmp_path, monkeypatch):
    import lakebuffer.lake.rowpages as rowpages

    lake = str(tmp_path / "lake")
    with _cold_buffer(tmp_path / "buf", lake) as buf:
        ref = _fill(buf, batches=16)
    reads: list[str] = []
    real = rowpages.RowPages._read_layout
    monkeypatch.setattr(rowpages.RowPages, "_read_layout",
                        lambda self, entry, rel: reads.append(rel) or real(self, entry, rel))
    with _cold_buffer(tmp_path / "buf", lake) as buf:
        assert buf._state.tasks.barrier(timeout=60)  # the open's read-ahead has run
        ahead = len(reads)
        files = buf._state.cold.stats()["files"]
        assert ahead == files > 1, (ahead, files)  # every cold file once (they fit the cache)
        reader = next(iter(buf._state.cold._page_readers.values())).rows
        assert 0 < reader.held_bytes() <= rowpages.READ_AHEAD_SHARE * reader.cache_bytes
        _check_buffer_get(buf, ref)
        assert len(reads) == ahead  # the get read no footer or offset index of its own


def test_an_open_with_cold_rows_prepares_the_digest_tables_before_any_take(tmp_path, monkeypatch):
    """The rolling digest's power tables (process-wide) are at full size after the open's read-ahead,
    before any cold take: the first take does not grow them page by page (~16 ms of a resumed first call)."""
    from lakebuffer.lake import rowhash

    lake = str(tmp_path / "lake")
    with _cold_buffer(tmp_path / "buf", lake) as buf:
        ref = _fill(buf, batches=16)
    monkeypatch.setattr(rowhash, "_pows", {})  # as in a fresh process
    with _cold_buffer(tmp_path / "buf", lake) as buf:
        assert buf._state.tasks.barrier(timeout=60)
        sizes = {base: len(arr) for base, arr in rowhash._pows.items()}
        assert sizes == {rowhash._P: rowhash._POW_CACHE, rowhash._P_INV: rowhash._POW_CACHE}
        _check_buffer_get(buf, ref)  # digests checked with the prepared tables
        assert {base: len(arr) for base, arr in rowhash._pows.items()} == sizes


def test_read_ahead_stops_at_its_share_of_the_cache(tmp_path):
    for i in range(12):
        _write(tmp_path / f"f{i}.parquet", _table(200, seed=i))
    entries = [_entry(tmp_path, f"f{i}.parquet") for i in range(12)]
    size = RowPages(LakeFS(str(tmp_path)), 1 << 30).layout(entries[0]).nbytes
    reader = RowPages(LakeFS(str(tmp_path)), 4 * size)
    import lakebuffer.lake.rowpages as rowpages

    read = rowpages.READ_AHEAD_FILES
    try:
        rowpages.READ_AHEAD_FILES = 2
        n = reader.read_ahead(entries, share=0.5)
    finally:
        rowpages.READ_AHEAD_FILES = read
    assert n == 2 and reader.held_bytes() <= 4 * size  # 2 files fill half the cache: it stops there
    assert RowPages(LakeFS(str(tmp_path)), 1 << 30).read_ahead(entries) == 12
    one = RowPages(LakeFS(str(tmp_path)), 1 << 30)
    assert one.read_ahead(entries[:1]) == 1 and one.held_bytes() == size  # a lone file is read too


def test_a_layout_two_threads_ask_for_at_once_is_read_once(tmp_path, monkeypatch):
    import threading
    import time

    import lakebuffer.lake.rowpages as rowpages

    _write(tmp_path / "f.parquet", _table(200))
    reader = RowPages(LakeFS(str(tmp_path)), 1 << 30)
    calls = []
    real = rowpages.RowPages._read_layout

    def slow(self, entry, rel):
        calls.append(rel)
        time.sleep(0.2)  # the second thread asks while this read runs
        return real(self, entry, rel)
    monkeypatch.setattr(rowpages.RowPages, "_read_layout", slow)
    got = []
    threads = [threading.Thread(target=lambda: got.append(reader.layout(_entry(tmp_path, "f.parquet")))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(got) == 2 and got[0] is got[1]


def test_read_ahead_stops_when_a_whole_step_reads_nothing(tmp_path, monkeypatch):
    """An unreachable or damaged lake: one step of failed reads, then it gives up (a close never waits
    for a read-ahead trying every file)."""
    import lakebuffer.lake.rowpages as rowpages

    for i in range(6):
        _write(tmp_path / f"f{i}.parquet", _table(50, seed=i))
    entries = [_entry(tmp_path, f"f{i}.parquet") for i in range(6)]
    reader = RowPages(LakeFS(str(tmp_path)), 1 << 30)
    tried = []

    def down(self, entry, rel):
        tried.append(rel)
        raise Unreadable("the lake is unreachable")
    monkeypatch.setattr(rowpages.RowPages, "_read_layout", down)
    monkeypatch.setattr(rowpages, "READ_AHEAD_FILES", 2)
    assert reader.read_ahead(entries) == 2 and len(tried) == 2 and reader.held_bytes() == 0


def test_a_resume_reads_and_parses_the_page_layouts_before_open_returns(tmp_path, monkeypatch):
    """A fresh-node resume's ``open`` returns with the cold files' layouts held and their offset indexes
    parsed (read in the background they took the GIL from the first take), so its first cold get parses
    none; a reopen of the writing directory reads them in the background and leaves the parsing to takes."""
    from lakebuffer.lake import pagelayout

    lake = str(tmp_path / "lake")
    with _cold_buffer(tmp_path / "buf", lake) as buf:
        ref = _fill(buf, batches=16)
        run_id = buf.run_id
        files = {e["path"] for e in buf.lake.latest_manifest(run_id)["files"]}

    def layouts(b):
        return dict(next(iter(b._state.cold._page_readers.values())).rows._layouts) if b._state.cold._page_readers else {}

    with _cold_buffer(tmp_path / "fresh", lake, run_id=run_id, restore="cold") as buf:
        held = layouts(buf)  # no barrier: open itself did it
        assert held and set(held) <= files
        chunks = [c for lay in held.values() for g in lay.chunks for c in g.values()]
        assert chunks and all(c._pages is not None for c in chunks)
        parsed = []
        real = pagelayout.Chunk.pages

        def pages(self):
            if self._pages is None:
                parsed.append(self)
            return real(self)
        monkeypatch.setattr(pagelayout.Chunk, "pages", pages)
        _check_buffer_get(buf, ref)
        monkeypatch.undo()
        assert not [c for c in parsed if c in chunks], "the first take parsed an offset index the open had parsed"
    with _cold_buffer(tmp_path / "buf", lake) as buf:
        assert buf._state.tasks.barrier(timeout=60)
        held = layouts(buf)
        assert held and not all(c._pages is not None for lay in held.values() for g in lay.chunks for c in g.values())
