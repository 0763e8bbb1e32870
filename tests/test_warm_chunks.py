"""Warm reads verified chunk by chunk (issue 23 item 2, DESIGN.md: "verification scales with the bytes read").

A segment's footer holds a CRC32C per 16 KiB chunk of its IPC bytes (``tiers/segfooter.py``). After a
reopen, a ``get`` of a few warm rows checks only the chunks it reads (and those of the IPC metadata it
parses), not the whole fragment; a flipped byte in a chunk it reads is a ``CorruptionError`` naming the
file, and a scan still checks every chunk. Older ``LBW1`` segments (one CRC) are checked whole.
"""

from __future__ import annotations

import os
import struct

import numpy as np
import pyarrow as pa
import pytest
from crc32c import crc32c

import lakebuffer as lb
from lakebuffer.errors import CorruptionError
from lakebuffer.tiers import segfooter, vmread
from lakebuffer.tiers.wal import WriteAheadLog
from tests.rollouts import make_rollouts

OPEN = {"memory_limit_mb": 16, "snapshot_interval_s": 0}


def _warm_buffer(path):
    """A buffer whose 256 rows (~4 MB, one fragment of ~60 chunks) are in the warm tier; its keys."""
    with lb.ReplayBuffer.open(path, **OPEN) as buf:
        keys = buf.push(make_rollouts(256, tokens=2048, seed=5)).to_pylist()
        buf.evict_all()
        want = buf.get(keys, ["key", "response_ids"])
    (frag,) = [p for p in (path / "warm").iterdir() if p.suffix == ".arrow"]
    return keys, want, frag


def test_the_footer_round_trips_and_refuses_damage(tmp_path):
    data = os.urandom(200_000)
    foot = segfooter.encode(data)
    f = segfooter.parse_buffer(data + foot)
    assert f.ipc_end == len(data) and f.chunk_bytes == segfooter.CHUNK_BYTES and f.chunks == -(-200_000 // f.chunk_bytes)
    assert f.check(data) is None
    bad = bytearray(data)
    bad[150_000] ^= 1
    assert f.check(bytes(bad)) == 150_000 // segfooter.CHUNK_BYTES
    damaged = bytearray(data + foot)
    damaged[len(data) + 2] ^= 1  # a chunk CRC in the table: the table's own CRC refuses it
    with pytest.raises(segfooter.FooterError):
        segfooter.parse_buffer(bytes(damaged))
    legacy = data + struct.pack("<I4s", crc32c(data), b"LBW1")
    f1 = segfooter.parse_buffer(legacy)
    assert f1.ipc_end == len(data) and f1.chunk_bytes == 0 and f1.check(data) is None and f1.check(bytes(bad)) == 0


def test_a_wal_segment_with_a_flipped_byte_in_any_chunk_is_refused(tmp_path):
    wal = WriteAheadLog(tmp_path / "wal")
    t = make_rollouts(64, tokens=1024, seed=1)
    wal.write(7, t)
    seg = wal.segment_path(7)
    assert wal.read(7).equals(t)
    size = segfooter.ipc_end(str(seg))
    for at in (100, size // 2, size - 10):  # metadata, body, the IPC footer
        data = bytearray(seg.read_bytes())
        data[at] ^= 0x40
        (tmp_path / "bad.arrow").write_bytes(bytes(data))
        with pytest.raises(CorruptionError, match="checksum"):
            wal.read_path(tmp_path / "bad.arrow")


def _reads(monkeypatch):
    """Bytes read by positioned reads from now on (the whole-file check and the chunk checks)."""
    count = {"bytes": 0}
    real_pread, real_preadv = os.pread, os.preadv

    def pread(fd, n, off):
        b = real_pread(fd, n, off)
        count["bytes"] += len(b)
        return b

    def preadv(fd, bufs, off, *a):
        k = real_preadv(fd, bufs, off, *a)
        count["bytes"] += max(k, 0)
        return k

    monkeypatch.setattr(os, "pread", pread)
    monkeypatch.setattr(os, "preadv", preadv)
    return count


def test_after_a_reopen_a_get_checks_the_chunks_it_reads_not_the_fragment(tmp_path, monkeypatch):
    keys, want, frag = _warm_buffer(tmp_path)
    size = frag.stat().st_size
    with lb.ReplayBuffer.open(tmp_path, **OPEN) as buf:
        count = _reads(monkeypatch)
        got = buf.get([keys[3], keys[200]], ["key", "response_ids"])
        assert got.equals(want.take(pa.array([3, 200])))
        assert count["bytes"] < size / 5, (count, size)  # two rows: a few chunks, not the ~4 MB file
        assert buf.sql("SELECT count(*) AS n FROM rollouts").column(0)[0].as_py() == 256  # a scan: checked whole
    assert count["bytes"] >= size - 64 * 1024


@pytest.mark.parametrize("where", ["row", "metadata"])
def test_a_flipped_byte_in_a_chunk_a_get_reads_is_a_corruption_error_naming_the_file(tmp_path, where):
    keys, want, frag = _warm_buffer(tmp_path)
    end = segfooter.ipc_end(str(frag))
    data = bytearray(frag.read_bytes())
    # the row's values lie around the middle of the body; the metadata at the start (schema, batch header)
    at = 200 if where == "metadata" else None
    if at is None:  # find row 100's response_ids bytes: its first token's bytes in the file
        token = np.asarray(want.column("response_ids")[100].values, np.int32)[:8].tobytes()
        at = bytes(data).find(token) + 2
        assert 0 < at < end
    data[at] ^= 0x01
    frag.write_bytes(bytes(data))
    with lb.ReplayBuffer.open(tmp_path, **OPEN) as buf:
        with pytest.raises(CorruptionError, match=str(frag.name)):
            buf.get([keys[100]], ["key", "response_ids"])
        with pytest.raises(CorruptionError):
            buf.sql("SELECT sum(len(response_ids)) FROM rollouts")


def test_a_row_in_an_undamaged_chunk_is_still_served(tmp_path):
    keys, want, frag = _warm_buffer(tmp_path)
    token = np.asarray(want.column("response_ids")[250].values, np.int32)[:8].tobytes()
    data = bytearray(frag.read_bytes())
    at = bytes(data).find(token) + 2
    data[at] ^= 0x01
    frag.write_bytes(bytes(data))
    with lb.ReplayBuffer.open(tmp_path, **OPEN) as buf:
        got = buf.get([keys[1]], ["key", "response_ids"])  # far from row 250's chunk: its bytes pass
        assert got.equals(want.take(pa.array([1])))
        with pytest.raises(CorruptionError):
            buf.get([keys[250]], ["key", "response_ids"])


def test_an_older_single_crc_fragment_is_checked_whole(tmp_path):
    keys, want, frag = _warm_buffer(tmp_path)
    end = segfooter.ipc_end(str(frag))
    data = bytearray(frag.read_bytes()[:end])
    data[end // 2] ^= 0x01  # damaged far from the rows asked below, under a valid LBW1 footer of the good bytes
    good = frag.read_bytes()[:end]
    frag.write_bytes(bytes(data) + struct.pack("<I4s", crc32c(good), b"LBW1"))
    with lb.ReplayBuffer.open(tmp_path, **OPEN) as buf:
        with pytest.raises(CorruptionError, match="checksum"):
            buf.get([keys[0]], ["key"])


def test_the_check_reads_each_chunk_once_and_refuses_ranges_outside_the_checked_bytes(tmp_path, monkeypatch):
    from lakebuffer.tiers.chunkcheck import ChunkCheck, ChunkDamaged
    from lakebuffer.tiers.ipcread import LayoutError

    monkeypatch.setattr(segfooter, "CHUNK_BYTES", 64 * 1024)  # the chunk numbers below are of 64 KiB chunks

    data = os.urandom(300_000)
    p = tmp_path / "f"
    p.write_bytes(data + segfooter.encode(data))
    fd = os.open(p, os.O_RDONLY)
    try:
        footer = segfooter.parse_fd(fd, os.fstat(fd).st_size)
        check = ChunkCheck(str(p), fd, footer, remember=True)
        check(np.array([10, 70_000, 299_990]), np.array([5, 100_000, 10]))  # chunks 0, 1-2, 4
        assert check.good.tolist() == [True, True, True, False, True]
        check(np.array([300_000, 5]), np.array([0, 0]))  # empty ranges, one at the very end
        with pytest.raises(LayoutError, match="outside"):
            check(np.array([299_995]), np.array([10]))  # into the footer
        bad = bytearray(data)
        bad[200_000] ^= 1  # chunk 3, not checked yet
        with open(p, "r+b") as f:
            f.seek(196_608)
            f.write(bytes(bad[196_608:262_144]))
        with pytest.raises(ChunkDamaged, match="chunk 3"):
            check(np.array([200_000]), np.array([4]))
    finally:
        os.close(fd)


def _cached(path) -> bool:
    """Whether the first byte of each 64 KiB of the file is in the page cache (``RWF_NOWAIT``)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        for at in range(0, os.fstat(fd).st_size, 64 * 1024):
            try:
                os.preadv(fd, [bytearray(1)], at, os.RWF_NOWAIT)
            except BlockingIOError:
                return False
        return True
    finally:
        os.close(fd)


def test_reads_from_disk_are_announced_at_once_and_return_the_same_rows(tmp_path, monkeypatch):
    """A warm get whose chunks are not checked yet announces their runs before reading them, and one whose
    ranges are not in the page cache announces every range (``POSIX_FADV_WILLNEED``: the disk serves them
    at once); a read from the page cache announces nothing. The rows are the same either way."""
    keys, want, frag = _warm_buffer(tmp_path)
    advised = []
    real = os.posix_fadvise

    def fadvise(fd, off, n, advice):
        if advice == os.POSIX_FADV_WILLNEED:
            advised.append((off, n))
        return real(fd, off, n, advice)

    monkeypatch.setattr(os, "posix_fadvise", fadvise)
    # rows copied by preadv, not from the file's map (pages a process has mapped stay in the page cache)
    monkeypatch.setattr(vmread, "_usable", False)
    rows = [5, 60, 130, 250]  # four rows in chunks apart
    with lb.ReplayBuffer.open(tmp_path, **OPEN) as buf:
        got = buf.get([keys[r] for r in rows], ["key", "response_ids"])
        assert got.equals(want.take(pa.array(rows)))
        assert len(advised) >= len(rows), advised  # the chunk runs to check, before they were read
        fd = os.open(frag, os.O_RDONLY)
        os.fdatasync(fd)  # (dirty pages are not dropped)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        on_disk = not _cached(frag)
        advised.clear()
        got = buf.get([keys[r] for r in rows], ["key", "response_ids"])  # chunks checked: only the rows' ranges
        assert got.equals(want.take(pa.array(rows)))
        assert (len(advised) >= len(rows)) == on_disk, (advised, on_disk)
        advised.clear()
        assert buf.get([keys[r] for r in rows], ["key", "response_ids"]).equals(got)
        assert advised == []  # from the page cache: no hint


def test_a_segment_written_with_another_chunk_size_reads_and_is_checked_by_its_own(tmp_path, monkeypatch):
    """The chunk size is each footer's own: a WAL segment written with 64 KiB chunks (before 2026-12-07)
    reads back exactly under today's size, and a flipped byte in any of its chunks is still refused."""
    monkeypatch.setattr(segfooter, "CHUNK_BYTES", 64 * 1024)
    wal = WriteAheadLog(tmp_path / "wal")
    t = make_rollouts(64, tokens=2048, seed=3)
    wal.write(1, t)
    seg = wal.segment_path(1)
    monkeypatch.undo()
    assert segfooter.CHUNK_BYTES != 64 * 1024
    assert segfooter.parse_buffer(seg.read_bytes()).chunk_bytes == 64 * 1024
    assert wal.read(1).equals(t)
    size = segfooter.ipc_end(str(seg))
    for at in (size // 3, size - 100):
        data = bytearray(seg.read_bytes())
        data[at] ^= 0x08
        (tmp_path / "bad.arrow").write_bytes(bytes(data))
        with pytest.raises(CorruptionError, match="checksum"):
            wal.read_path(tmp_path / "bad.arrow")
