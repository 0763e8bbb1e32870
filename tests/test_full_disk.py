"""Issue 24: a full filesystem, for real (a small tmpfs this test mounts), on every path that writes:
push (WAL), write-back (warm fragments), snapshot (the lake's filesystem) and restore (a fresh
directory; since the O(metadata) resume it may open and serve from the lake instead). Each gives a clear ``StorageError`` (``DiskFullError``), loses nothing acknowledged, and
leaves the directory released: once space is back it reopens (the mount could not even be unmounted
while the buffer still held files in it).

Needs root and ``mount -t tmpfs``; where mounting is not permitted every test here is *skipped* and
says so (never passed silently).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import lakebuffer as lb
from tests.rollouts import make_rollouts


class Tmpfs:
    def __init__(self, where: Path, mb: int) -> None:
        self.where = where
        where.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mb}m", "tmpfs", str(where)], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"NOT TESTED: cannot mount a small tmpfs here (needs root and mount): {r.stderr.strip()}")

    def grow(self, mb: int) -> None:
        subprocess.run(["mount", "-o", f"remount,size={mb}m", str(self.where)], check=True)

    def unmount(self) -> None:
        """Unmounting fails while any file in it is open: the buffer let go of everything."""
        r = subprocess.run(["umount", str(self.where)], capture_output=True, text=True)
        assert r.returncode == 0, f"the filesystem is still in use: {r.stderr}"


@pytest.fixture
def small_fs(tmp_path):
    fs = Tmpfs(tmp_path / "mnt", 24)
    yield fs
    subprocess.run(["umount", "-l", str(fs.where)], capture_output=True)


def _push_until_full(buf, tokens: int, rows: int, tries: int = 400) -> tuple[list[str], Exception]:
    keys: list[str] = []
    for i in range(tries):
        try:
            keys += buf.push(make_rollouts(rows, tokens=tokens, seed=i)).to_pylist()
        except lb.LakeBufferError as e:
            return keys, e
    raise AssertionError("the filesystem never filled")


OPEN = {"snapshot_interval_s": 0, "disk_free_floor_gb": 0}  # no floor: meet the full disk itself


@pytest.mark.parametrize("path", ["push", "write_back"])
def test_a_full_local_disk_is_a_clear_storage_error_and_loses_nothing(small_fs, path):
    d = small_fs.where / "buf"
    buf = lb.ReplayBuffer.open(d, memory_limit_mb=4 if path == "push" else 8, **OPEN)
    try:
        # push: 1 MB batches go to the WAL and are promoted by a hard link; write-back: small batches are
        # coalesced into new fragment files by the background write-back
        keys, err = _push_until_full(buf, *((1024, 128) if path == "push" else (64, 64)))
        assert isinstance(err, lb.DiskFullError) and isinstance(err, lb.StorageError), repr(err)
        assert "full" in str(err) and str(small_fs.where) in str(err) and "free space" in str(err)
        assert len(keys) > 0
        assert buf.get(keys, columns=["key"]).column("key").to_pylist() == keys  # still served
    finally:
        try:
            buf.close()
        except lb.StorageError:
            pass  # close may meet the full disk too; it still releases the directory
    small_fs.grow(400)
    with lb.ReplayBuffer.open(d, memory_limit_mb=4, **OPEN) as buf:
        assert buf.get(keys, columns=["key"]).column("key").to_pylist() == keys  # nothing acknowledged lost
        buf.push(make_rollouts(8, tokens=8))
    small_fs.unmount()


def test_a_full_lake_filesystem_fails_the_snapshot_clearly_and_keeps_every_row(small_fs, tmp_path):
    lake = small_fs.where / "lake"
    buf = lb.ReplayBuffer.open(tmp_path / "buf", lake=str(lake), memory_limit_mb=64, snapshot_interval_s=0)
    try:
        keys = []
        for i in range(30):
            keys += buf.push(make_rollouts(128, tokens=1024, seed=i)).to_pylist()
        with pytest.raises(lb.DiskFullError, match="full") as e:
            buf.snapshot(wait=True)
        assert isinstance(e.value, lb.LakeError) and "nothing was committed" in str(e.value)
        assert buf.get(keys, columns=["key"]).num_rows == len(keys)
        small_fs.grow(400)
        buf.snapshot(wait=True)
        assert buf.stats()["cold"]["lag_rows"] == 0
    finally:
        buf.close()
    with lb.ReplayBuffer.open_lake(str(lake)) as view:
        assert view.count() == len(keys)
    small_fs.unmount()


def test_a_restore_into_a_full_disk_loses_nothing_and_releases_the_directory(small_fs, tmp_path):
    """A resume reads only the lake's metadata (rows stay cold, warmed in the background within the disk
    budget): on a 1 MB filesystem it either opens, serving every row from the lake while warming meets
    the full disk and leaves batches cold, or fails with a clear ``StorageError``; never half a run."""
    lake = tmp_path / "lake"
    with lb.ReplayBuffer.open(tmp_path / "src", lake=str(lake), memory_limit_mb=64, snapshot_interval_s=0,
                              run_id="r1") as src:
        keys = []
        for i in range(30):
            keys += src.push(make_rollouts(128, tokens=1024, seed=i)).to_pylist()
        src.snapshot(wait=True)
    d = small_fs.where / "buf"
    small_fs.grow(1)
    try:
        with lb.ReplayBuffer.open(d, lake=str(lake), run_id="r1", takeover=True, memory_limit_mb=4, **OPEN) as buf:
            assert buf.get(keys, columns=["key"]).column("key").to_pylist() == keys
    except lb.StorageError as e:
        assert "full" in str(e), e
    small_fs.grow(400)
    with lb.ReplayBuffer.open(d, lake=str(lake), run_id="r1", takeover=True, memory_limit_mb=4, **OPEN) as buf:
        assert buf.get(keys, columns=["key"]).column("key").to_pylist() == keys
    shutil.rmtree(d)
    small_fs.unmount()


def test_a_full_disk_while_a_segment_is_written_over_a_spare_is_a_clear_error_and_leaves_nothing(small_fs):
    """The WAL writes a segment over a removed one (a spare file) and the disk fills while it grows past
    the spare's size: ``DiskFullError``, no segment and no ``.tmp`` left, the other segments intact."""
    from lakebuffer.tiers.wal import SPARE_SUFFIX, WriteAheadLog

    wal = WriteAheadLog(small_fs.where / "wal", spares=True)
    bid, err = 0, None
    while err is None:
        bid += 1
        try:
            wal.write(bid, make_rollouts(128, tokens=1024, seed=bid))
        except lb.LakeBufferError as e:
            err = e
    assert isinstance(err, lb.DiskFullError), repr(err)
    written = wal.ids()
    assert bid not in written and len(written) > 2
    wal.remove(written[-1])  # kept as a spare: the disk stays full
    assert len(list(wal.path.glob(f"*{SPARE_SUFFIX}"))) == 1
    kept = {b: wal.read(b) for b in written[:-1]}
    with pytest.raises(lb.DiskFullError):
        wal.write(bid, make_rollouts(512, tokens=1024, seed=bid))  # over the spare, then past its end
    assert wal.ids() == written[:-1]
    assert not list(wal.path.glob("*.tmp")) and not list(wal.path.glob(f"*{SPARE_SUFFIX}"))
    for b, t in kept.items():
        assert wal.read(b).equals(t)
    small_fs.unmount()


def test_the_key_index_meeting_a_full_disk_is_a_disk_full_error(tmp_path):
    """RocksDB reports ENOSPC only as status text ("IO error: No space left on device"): where the full
    disk is met while the index appends its log (which of the WAL, a fragment or the index fills the disk
    first is timing), the error is the same ``DiskFullError`` as the WAL's, naming the index; other IO
    errors stay plain ``StorageError``."""
    from lakebuffer.index import KeyIndex, _rocksdb_error

    index = KeyIndex(tmp_path / "index")
    try:
        full = _rocksdb_error(index, Exception(
            f"IO error: No space left on device: While appending to file: {tmp_path}/index/000008.log: "
            "No space left on device"))
        assert isinstance(full, lb.DiskFullError) and isinstance(full, lb.StorageError)
        assert "full" in str(full) and str(tmp_path / "index") in str(full) and "free space" in str(full)
        other = _rocksdb_error(index, Exception("IO error: Permission denied"))
        assert isinstance(other, lb.StorageError) and not isinstance(other, lb.DiskFullError)
    finally:
        index.close()
