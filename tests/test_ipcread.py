"""Positioned reads of warm fragments (``tiers.ipcread``) return exactly the asked rows, on every path.

``take`` plans its reads with numpy (runs of consecutive rows, offsets from the layout's memory, nearby
ranges of one file joined into one ``preadv``); each of those paths is forced here in turn and must give
what a pyarrow ``take`` of the same rows gives, for every type the reader handles, nulls included.
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest

from lakebuffer.errors import CorruptionError
from lakebuffer.tiers import Location, ipcread, vmread
from lakebuffer.tiers.warm import WarmTier

SCHEMA = pa.schema([
    ("i64", pa.int64()),
    ("flag", pa.bool_()),
    ("s", pa.string()),
    ("ls", pa.large_string()),
    ("ids", pa.list_(pa.int32())),
    ("lp", pa.large_list(pa.float32())),
    ("fixed", pa.list_(pa.int16(), 3)),
    ("st", pa.struct([("a", pa.int32()), ("b", pa.string())])),
    ("nested", pa.list_(pa.list_(pa.int8()))),
    ("ts", pa.timestamp("us", tz="UTC")),
])


def _table(n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    null = rng.random(n) < 0.2
    lens = rng.integers(0, 40, n)

    def maybe(values: list) -> list:
        return [None if z else v for v, z in zip(values, null)]

    ints = rng.integers(-1000, 1000, n).tolist()
    return pa.table({
        "i64": pa.array(maybe(ints), pa.int64()),
        "flag": pa.array(maybe((rng.random(n) < 0.5).tolist()), pa.bool_()),
        "s": pa.array(maybe([f"s{seed}-{i}-" + "x" * int(k) for i, k in enumerate(lens)]), pa.string()),
        "ls": pa.array([f"L{i}" * int(k % 5) for i, k in enumerate(lens)], pa.large_string()),
        "ids": pa.array(maybe([list(range(int(k))) for k in lens]), pa.list_(pa.int32())),
        "lp": pa.array([[float(i)] * int(k % 7) for i, k in enumerate(lens)], pa.large_list(pa.float32())),
        "fixed": pa.array(maybe([[i, -i, 7] for i in range(n)]), pa.list_(pa.int16(), 3)),
        "st": pa.array(maybe([{"a": i, "b": "b" * (i % 4)} for i in range(n)]), SCHEMA.field("st").type),
        "nested": pa.array([[[1] * (i % 3), []] if i % 4 else None for i in range(n)], SCHEMA.field("nested").type),
        "ts": pa.array(maybe(ints), pa.int64()).cast(pa.timestamp("us", tz="UTC")),
    }, schema=SCHEMA)


@pytest.fixture
def tier(tmp_path):
    """Three fragments: one record batch, several batches (a fragment written from a chunked table), another."""
    t = WarmTier(tmp_path / "warm", SCHEMA)
    tables = [_table(300, 1), pa.concat_tables([_table(n, 10 + n) for n in (50, 1, 120, 77)]), _table(64, 3)]
    parts = []
    for table in tables:
        staged = t.stage(table)
        t.publish(staged)
        parts.append(staged.part)
    return t, parts, tables


def _asked(rng: np.random.Generator, tables: list[pa.Table]) -> tuple[np.ndarray, np.ndarray]:
    """Random rows, consecutive runs (inside and across record batches), repeats, every fragment."""
    which, rows = [], []
    for _ in range(40):
        f = int(rng.integers(len(tables)))
        n = tables[f].num_rows
        r = int(rng.integers(n))
        k = int(rng.choice([1, 1, 1, 2, 5, 60]))
        which += [f] * min(k, n - r)
        rows += list(range(r, min(r + k, n)))
    which += [0, 0, 1, 1]
    rows += [3, 3, 49, 50]  # the same row twice; the last row of one batch, then the first of the next
    return np.array(which), np.array(rows)


def _expect(tables: list[pa.Table], which: np.ndarray, rows: np.ndarray, columns: list[str]) -> pa.Table:
    starts = np.cumsum([0] + [t.num_rows for t in tables[:-1]])
    whole = pa.concat_tables(tables).combine_chunks()
    return whole.select(columns).take(pa.array(starts[which] + rows))


MODES = {  # (vmread._usable False: the kernel refused process_vm_readv, so every range is a preadv)
    "default": {},
    "preadv": {"vmread": False},
    "preadv_no_coalescing": {"vmread": False, "GAP_BYTES": 0},
    "preadv_coalesce_everything": {"vmread": False, "GAP_BYTES": 1 << 20},
    "offsets_by_span": {"CACHE_OFFSETS_BYTES": 0},
    "offsets_by_run": {"CACHE_OFFSETS_BYTES": 0, "SPAN_BYTES": 0},
    "offsets_sliced_per_run": {"JOIN_BYTES": 0, "JOIN_RATIO": 0},
    "offsets_partly_held": {"CACHE_OFFSETS_BYTES": 3000},
    "preadv_offsets_by_span": {"vmread": False, "CACHE_OFFSETS_BYTES": 0},
}


@pytest.mark.parametrize("mode", list(MODES))
def test_take_returns_the_asked_rows_on_every_read_path(tmp_path, monkeypatch, mode):
    for name, value in MODES[mode].items():
        if name == "vmread":
            monkeypatch.setattr(vmread, "_usable", value)
        else:
            monkeypatch.setattr(ipcread, name, value)
    t = WarmTier(tmp_path / "warm", SCHEMA)  # staged under the mode: offsets are held when a file is opened
    tables = [_table(300, 1), pa.concat_tables([_table(n, 10 + n) for n in (50, 1, 120, 77)]), _table(64, 3)]
    parts = [t.stage(table).part for table in tables]
    rng = np.random.default_rng(7)
    for _ in range(5):
        which, rows = _asked(rng, tables)
        got = t.take(Location(np.array(parts)[which], rows), SCHEMA.names)
        got.validate(full=True)
        assert got.equals(_expect(tables, which, rows, SCHEMA.names))
    one = t.take(Location(np.array([parts[1]]), np.array([50])), ["s", "nested"])  # one row, two columns
    assert one.equals(_expect(tables, np.array([1]), np.array([50]), ["s", "nested"]))


def test_small_values_of_one_file_are_read_by_one_system_call(tier, monkeypatch):
    """Without ``process_vm_readv``: a fixed-width column's asked rows that lie close together in a file
    cost one ``preadv``."""
    t, parts, tables = tier
    monkeypatch.setattr(vmread, "_usable", False)
    calls = []
    real = ipcread.os.preadv

    def counting(fd, bufs, off, *flags):
        if not flags:  # (page-cache probes, RWF_NOWAIT, are not reads of the rows)
            calls.append(len(bufs))
        return real(fd, bufs, off, *flags)

    monkeypatch.setattr(ipcread.os, "preadv", counting)
    rows = np.array([250, 3, 120, 17, 299, 100])  # six bitmap bytes, six values, all distinct
    got = t.take(Location(np.full(len(rows), parts[0]), rows), ["i64", "ts"])
    assert got.equals(_expect(tables, np.zeros(len(rows), int), rows, ["i64", "ts"]))
    # per column: the validity bitmap and the values, one read each (6 ranges + 5 gaps), not one per row
    assert calls == [11, 11, 11, 11]


def test_mapped_copies_take_one_system_call_per_buffer(tier, monkeypatch):
    """With ``process_vm_readv``: one copy per buffer read (validity, values), whatever the rows."""
    if not vmread.available():
        pytest.skip("process_vm_readv is refused here")
    t, parts, tables = tier
    calls = []
    real = vmread.copy
    monkeypatch.setattr(vmread, "copy", lambda out, addr, n: calls.append(len(n)) or real(out, addr, n))
    rows = np.array([250, 3, 120, 17, 299, 10, 5, 6, 7])
    which = np.array([0, 0, 0, 1, 0, 2, 1, 1, 1])
    got = t.take(Location(np.array(parts)[which], rows), ["i64", "ids"])
    assert got.equals(_expect(tables, which, rows, ["i64", "ids"]))
    assert len(calls) == 4  # i64: validity, values; ids: validity, values (offsets come from the layout)


@pytest.mark.parametrize("mapped", [True, False])
def test_a_row_past_its_fragment_or_a_short_file_is_corruption(tier, monkeypatch, mapped):
    monkeypatch.setattr(vmread, "_usable", mapped and vmread.available())
    t, parts, tables = tier
    with pytest.raises(CorruptionError, match="fewer rows"):
        t.take(Location(np.array([parts[2]]), np.array([64])), ["ids"])
    path = t.file_of(parts[0])
    size = path.stat().st_size
    with open(path, "r+b") as fh:  # another program cuts the file: an error, never a signal
        fh.truncate(size // 2)
    with pytest.raises(CorruptionError):
        t.take(Location(np.array([parts[0]] * 3), np.array([290, 1, 150])), ["ids", "s"])


def _vm_flags(addr: int) -> list[str]:
    """The VmFlags of the mapping that starts at ``addr`` (``/proc/self/smaps``)."""
    with open("/proc/self/smaps") as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        if line.split("-", 1)[0] == f"{addr:x}" or line.split("-", 1)[0] == f"{addr:08x}":
            for rest in lines[i + 1:]:
                if rest.startswith("VmFlags:"):
                    return rest.split()[1:]
    raise AssertionError(f"no mapping at {addr:#x}")


def test_a_take_map_reads_its_own_pages_not_a_read_around_window(tmp_path):
    """A warm take's map is advised random: a page fault reads the asked pages, not ``read_ahead_kb``
    around them (8 MiB on some disks: 59 rows of an uncached warm tier read 422 MB before this)."""
    if not vmread.available():
        pytest.skip("no process_vm_readv here: takes use preadv, which reads exactly the asked bytes")
    p = tmp_path / "f"
    p.write_bytes(b"x" * (1 << 20))
    fd = os.open(p, os.O_RDONLY)
    try:
        m = vmread.Mapping(fd, 1 << 20)
        assert m.addr
        assert "rr" in _vm_flags(m.addr)  # "random read advise provided"
        out = np.empty(10, np.uint8)
        assert vmread.copy(out, np.array([m.addr + 5000], np.uint64), np.array([10], np.uint64))
        assert bytes(out) == b"x" * 10
    finally:
        os.close(fd)
