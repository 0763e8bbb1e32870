"""Issue 24 item 7: damage to a warm fragment is ``CorruptionError`` on every read path, whatever the
damage, and ``fsck --repair`` keeps the damaged file in ``quarantine/`` (rebuilding from the lake).

Before: ``fsck --repair`` rebuilt the batch from the lake and deleted the bad file, and ``sql``/``scan``
left a deleted fragment's rows out without an error.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest

import lakebuffer as lb
from lakebuffer.fsck import check as fsck
from tests.rollouts import make_rollouts

OPEN = {"memory_limit_mb": 4, "snapshot_interval_s": 0}
N = 400


def _flip(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[len(data) // 3] ^= 0x01  # inside the payload, far from the IPC footer
    p.write_bytes(bytes(data))


def _truncate(p: Path) -> None:
    os.truncate(p, p.stat().st_size // 2)


def _tail(p: Path) -> None:
    os.truncate(p, p.stat().st_size - 1)


def _delete(p: Path) -> None:
    p.unlink()


DAMAGE = {"flipped_byte": _flip, "truncated_half": _truncate, "truncated_by_one": _tail, "deleted": _delete}
READS = {
    "get": lambda buf, keys: buf.get(keys, columns=["response_ids"]),
    "get_small_column": lambda buf, keys: buf.get(keys, columns=["reward"]),
    "sample": lambda buf, keys: buf.sample(len(keys), columns=["response_ids"], seed=0),
    "sql": lambda buf, keys: buf.sql("SELECT sum(len(response_ids)) FROM rollouts"),
    "sql_meta_join": lambda buf, keys: buf.sql("SELECT count(*) FROM rollouts WHERE reward >= 0"),
    "scan": lambda buf, keys: sum(b.num_rows for b in buf.scan(columns=["key", "response_ids"])),
}


def _build(path: Path, lake: Path | None = None) -> list[str]:
    t = make_rollouts(N, tokens=256, seed=3).append_column("key", pa.array([f"k{i}" for i in range(N)]))
    with lb.ReplayBuffer.open(path, lake=str(lake) if lake else None, **OPEN) as buf:
        for i in range(0, N, 100):
            buf.push(t.slice(i, 100))
        if lake is not None:
            buf.snapshot(wait=True)
        buf.evict_all()
    return t.column("key").to_pylist()


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    path = tmp_path_factory.mktemp("damage") / "buf"
    return path, _build(path)


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("read", sorted(READS))
def test_every_read_of_a_damaged_fragment_is_corruption_error(tmp_path, built, damage, read):
    src, keys = built
    path = tmp_path / "buf"
    import shutil

    shutil.copytree(src, path)
    frag = sorted((path / "warm").glob("*.arrow"))[1]
    DAMAGE[damage](frag)
    with lb.ReplayBuffer.open(path, **OPEN) as buf:  # a new process's view: nothing verified yet
        with pytest.raises(lb.CorruptionError, match="fsck"):
            READS[read](buf, keys)


@pytest.mark.parametrize("damage", sorted(set(DAMAGE) - {"deleted"}))
def test_fsck_repair_quarantines_a_damaged_fragment_and_rebuilds_it_from_the_lake(tmp_path, damage):
    path, lake = tmp_path / "buf", tmp_path / "lake"
    keys = _build(path, lake)
    frag = sorted((path / "warm").glob("*.arrow"))[1]
    DAMAGE[damage](frag)
    damaged = frag.read_bytes()
    rep = fsck(path, repair=True, lake=str(lake))
    assert any("rebuilt batch" in r for r in rep["repaired"]), rep
    kept = [Path(path / "quarantine" / e["path"]) if not Path(e["path"]).is_absolute() else Path(e["path"])
            for e in rep["quarantine"]]
    assert [p.read_bytes() for p in kept if p.parent.name == "warm"] == [damaged], rep["quarantine"]
    assert fsck(path)["ok"]
    with lb.ReplayBuffer.open(path, lake=str(lake), **OPEN) as buf:
        got = buf.get(keys, columns=["key", "response_ids"])
        want = make_rollouts(N, tokens=256, seed=3).column("response_ids")
        assert got.column("key").to_pylist() == keys and got.column("response_ids").equals(want)
