"""Integrity on the lake side (issue 15, guarantees 2 and 5).

Every read of committed lake files (``open_lake`` get/sample/scan/sql, the buffer's ``cold``
view, restore) is checked against the manifest's checksums; one writer per (lake, run_id).
"""

from __future__ import annotations

import glob
from pathlib import Path

import pytest

import lakebuffer as lb
from lakebuffer.errors import CorruptionError
from tests.rollouts import make_rollouts

OPEN = {"memory_limit_mb": 64, "snapshot_interval_s": 0}


def flip(path: Path, at: float = 0.5) -> None:
    """Flip one bit of a file in place (same size: only a checksum can tell)."""
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0x01
    path.write_bytes(bytes(data))


def _lake_with_one_file(tmp_path: Path) -> tuple[str, list[str], Path]:
    lake = str(tmp_path / "lake")
    with lb.ReplayBuffer.open(tmp_path / "a", lake=lake, run_id="r", **OPEN) as buf:
        keys = buf.push(make_rollouts(256, tokens=64, seed=1)).to_pylist()
        buf.snapshot(wait=True)
    (victim,) = glob.glob(f"{lake}/**/*.parquet", recursive=True)
    return lake, keys, Path(victim)


# guarantee 2, lake side: no read returns corrupted data -------------------------------------
def test_flipped_lake_parquet_fails_every_lake_read_path(tmp_path):
    lake, keys, victim = _lake_with_one_file(tmp_path)
    with lb.ReplayBuffer.open_lake(lake) as view:  # intact: reads, and the file is verified once
        assert view.get(keys[:4], ["key"]).column("key").to_pylist() == keys[:4]
        assert view.sql("SELECT count(*) FROM rollouts").column(0)[0].as_py() == 256
    flip(victim)  # changed behind the lake: (size, mtime) moved, the process checks it again
    with pytest.raises(CorruptionError, match=victim.name) as e:
        lb.ReplayBuffer.open_lake(lake)  # every read path of the view reads this dataset
    assert "checksum" in str(e.value) and "Restore the file" in str(e.value)
    with pytest.raises(CorruptionError, match=victim.name):
        lb.ReplayBuffer.open_lake(lake, run_id="r").dataset().to_table()
    # a buffer of another run over the damaged lake still opens (open reads no lake data file) and serves
    # its own rows; a query of its lake view reads the file and refuses, naming it
    with lb.ReplayBuffer.open(tmp_path / "b", lake=lake, run_id="other", **OPEN) as buf:
        mine = buf.push(make_rollouts(8, seed=5)).to_pylist()
        assert buf.get(mine, ["key"]).num_rows == 8
        with pytest.raises(CorruptionError, match=victim.name):
            buf.sql("SELECT count(*) FROM lake")


def test_restore_from_a_flipped_lake_file_is_refused(tmp_path):
    lake, keys, victim = _lake_with_one_file(tmp_path)
    flip(victim)
    with pytest.raises(CorruptionError, match=victim.name):
        lb.ReplayBuffer.open(tmp_path / "fresh", lake=lake, run_id="r", restore="eager", **OPEN)
    # a lazy resume reads the metadata columns only (their pages checked); a cold get reads only the pages
    # of the rows it returns and checks their digests, so a read of every row and column meets the flipped
    # byte and refuses, naming the file
    try:
        buf = lb.ReplayBuffer.open(tmp_path / "lazy", lake=lake, run_id="r", restore="cold", **OPEN)
    except CorruptionError as e:  # the flipped byte was in a metadata page
        assert victim.name in str(e)
        return
    with buf, pytest.raises(CorruptionError, match=victim.name):
        buf.get(keys)


# guarantee 5: one writer per (lake, run_id) --------------------------------------------------
def test_second_writer_of_a_run_is_refused_not_silently_dropped(tmp_path):
    lake = str(tmp_path / "lake")
    with lb.ReplayBuffer.open(tmp_path / "a", lake=lake, run_id="r", **OPEN) as a:
        a.push(make_rollouts(110, seed=1))
        with pytest.raises(lb.LockedError, match=r"run 'r'.*takeover=True") as e:
            lb.ReplayBuffer.open(tmp_path / "b", lake=lake, run_id="r", **OPEN)
        assert str((tmp_path / "a").resolve()) in str(e.value)  # names the other writer
        a.snapshot(wait=True)
    with lb.ReplayBuffer.open_lake(lake) as view:
        assert len(view) == 110
    # once the first writer closed, another directory may write the run (and restores it first)
    with lb.ReplayBuffer.open(tmp_path / "b", lake=lake, run_id="r", **OPEN) as b:
        assert len(b) == 110
        keys = b.push(make_rollouts(50, seed=2)).to_pylist()
        assert b.snapshot(wait=True) is not None
    with lb.ReplayBuffer.open_lake(lake) as view:
        assert len(view) == 160
        assert view.sql("SELECT count(DISTINCT key) FROM rollouts").column(0)[0].as_py() == 160
        assert view.get(keys, ["key"]).num_rows == 50


def test_crashed_writer_is_taken_over_explicitly_and_then_fenced(tmp_path):
    lake = str(tmp_path / "lake")
    a = lb.ReplayBuffer.open(tmp_path / "a", lake=lake, run_id="r", **OPEN)
    a.push(make_rollouts(64, seed=1))
    a.snapshot(wait=True)
    a.push(make_rollouts(16, seed=3))  # not snapshotted: "a" is presumed dead from here on
    with pytest.raises(lb.LockedError):
        lb.ReplayBuffer.open(tmp_path / "fresh", lake=lake, run_id="r", **OPEN)
    with lb.ReplayBuffer.open(tmp_path / "fresh", lake=lake, run_id="r", takeover=True, **OPEN) as b:
        assert len(b) == 64  # restored from the lake
        b.push(make_rollouts(8, seed=4))
        b.snapshot(wait=True)
        # the old writer comes back: its commit is refused, loudly, and nothing of it lands
        with pytest.raises(lb.LockedError, match="takeover=True"):
            a.snapshot(wait=True)
    a.close()
    with lb.ReplayBuffer.open_lake(lake) as view:
        assert len(view) == 72
    # reopening the writer's own directory needs no takeover
    with lb.ReplayBuffer.open(tmp_path / "fresh", lake=lake, run_id="r", **OPEN) as b:
        assert len(b) == 72


def _stale_first(lake, stale, times: int = 1) -> None:
    """The lake's next ``times`` calls of ``delta.table()`` return ``stale`` (a writer that read the table
    before another writer's commit), later ones the real table."""
    real = lake.delta.table
    first = iter([stale] * times)
    lake.delta.table = lambda version=None: (next(first, None) if version is None else None) or real(version)


def test_two_commits_racing_for_one_snapshot_id_cannot_both_land(tmp_path):
    """The run's snapshot id is a Delta app transaction committed with the data: a writer that read the
    run's state before another writer's commit loses the race in delta-rs' conflict checker (no window
    between "check the writer" and "commit")."""
    from lakebuffer.lake import Lake

    url = str(tmp_path / "lake")
    a, b = Lake(url), Lake(url)
    a.commit_snapshot("r", [make_rollouts(10, seed=1).append_column("key", _keys("x", 10)).append_column("run_id", _run("r", 10))])
    stale = b.delta.table()  # b reads the run's state: its next snapshot id is 2
    a.commit_snapshot("r", [make_rollouts(10, seed=2).append_column("key", _keys("y", 10)).append_column("run_id", _run("r", 10))])
    _stale_first(b, stale)
    with pytest.raises(lb.LockedError, match="another writer"):
        b.commit_snapshot("r", [make_rollouts(10, seed=3).append_column("key", _keys("z", 10)).append_column("run_id", _run("r", 10))])
    c = Lake(url)
    assert c.snapshots("r") == [1, 2]
    assert c.dataset("r").count_rows() == 20
    assert sorted(p.split("/")[-1][:13] for p in c.files("r")) == sorted(p.split("/")[-1][:13] for p in a.files("r"))


def _keys(prefix: str, n: int):
    import pyarrow as pa

    return pa.array([f"{prefix}-{i}" for i in range(n)], pa.string())


def _run(run: str, n: int):
    import pyarrow as pa

    return pa.array([run] * n, pa.string())


def test_a_commit_racing_another_runs_schema_change_lands_once(tmp_path):
    """delta-rs refuses an append that raced a metadata change (another run widening the table, or
    creating it): the append touches nothing of that commit, so it is committed again on top of it,
    once (seen as a flaky snapshot of a sharded buffer whose shards commit to one lake)."""
    import pyarrow as pa

    from lakebuffer.lake import Lake

    url = str(tmp_path / "lake")
    a, b = Lake(url), Lake(url)
    a.commit_snapshot("a", [make_rollouts(10, seed=1).append_column("key", _keys("x", 10)).append_column("run_id", _run("a", 10))])
    stale = b.delta.table()
    wide = make_rollouts(10, seed=2).append_column("key", _keys("w", 10)).append_column("run_id", _run("a", 10))
    a.commit_snapshot("a", [wide.append_column("judge_score", pa.array([0.5] * 10))])  # a metaData commit
    _stale_first(b, stale)
    b.commit_snapshot("b", [make_rollouts(10, seed=3).append_column("key", _keys("z", 10)).append_column("run_id", _run("b", 10))])
    c = Lake(url)
    assert c.snapshots("b") == [1] and c.dataset("b").count_rows() == 10
    assert c.dataset("a").count_rows() == 20 and "judge_score" in c.delta.table().schema().to_arrow().names


def test_a_compaction_racing_a_delete_of_its_files_is_refused_not_retried(tmp_path):
    """A commit that removes files is committed again only while every file it removes is still live:
    a compaction that read the run before a delete rewrote one of its files would bring deleted rows
    back (and duplicate the rest), so it fails and commits nothing."""
    from lakebuffer.lake import Lake

    url = str(tmp_path / "lake")
    a, b = Lake(url), Lake(url)
    for s in range(3):
        a.commit_snapshot("r", [make_rollouts(10, seed=s).append_column("key", _keys(f"k{s}", 10)).append_column("run_id", _run("r", 10))])
    stale = b.delta.table()
    a.commit_snapshot("r", [], deleted_keys=["k0-3"])  # removes the file holding k0-3, adds it back without
    _stale_first(b, stale, times=2)  # compact() plans, then each run's compaction reads the table
    with pytest.raises(lb.LakeError, match="concurrent commit"):
        b.compact("r", target_file_bytes=2**30)
    c = Lake(url)
    keys = c.dataset("r").to_table(columns=["key"]).column("key").to_pylist()
    assert len(keys) == len(set(keys)) == 29 and "k0-3" not in keys
