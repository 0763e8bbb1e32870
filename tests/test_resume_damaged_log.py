"""Issue 24 item 2: a fresh-directory resume from a lake whose Delta log is damaged or unreadable never
opens as an empty run (it refuses with ``LakeError`` and stays a fresh directory), and once the lake reads
again the resume completes and generated keys continue past the lake's."""

from __future__ import annotations

from pathlib import Path

import pytest

import lakebuffer as lb
from tests.rollouts import make_rollouts


def _source(tmp_path: Path) -> tuple[str, list[str]]:
    lake = f"file://{tmp_path / 'lake'}"
    with lb.ReplayBuffer.open(tmp_path / "src", lake=lake, snapshot_interval_s=0, memory_limit_mb=2, run_id="dlog") as b:
        keys = b.push(make_rollouts(80, tokens=8, seed=1)).to_pylist()
        b.snapshot(wait=True)
        keys += b.push(make_rollouts(80, tokens=8, seed=2)).to_pylist()
        b.snapshot(wait=True)
    return lake, keys


def _garble_commit(lake_dir: Path) -> tuple[Path, bytes]:
    target = sorted((lake_dir / "_delta_log").glob("*.json"))[-1]
    saved = target.read_bytes()
    target.write_bytes(b"{not json" + saved[9:])
    return target, saved


def _checkpointed(lake_dir: Path) -> Path:
    from deltalake import DeltaTable

    DeltaTable(str(lake_dir)).create_checkpoint()
    return lake_dir / "_delta_log"


def _garble_last_checkpoint(lake_dir: Path) -> tuple[Path, bytes]:
    target = _checkpointed(lake_dir) / "_last_checkpoint"
    saved = target.read_bytes()
    target.write_bytes(b'{"version": 1, "size": ')
    return target, saved


def _garble_checkpoint_file(lake_dir: Path) -> tuple[Path, bytes]:
    target = next(_checkpointed(lake_dir).glob("*.checkpoint.parquet"))
    saved = target.read_bytes()
    target.write_bytes(saved[: len(saved) // 2])
    return target, saved


@pytest.mark.parametrize("damage", [_garble_commit, _garble_last_checkpoint, _garble_checkpoint_file],
                         ids=["commit-json", "last-checkpoint", "checkpoint-file"])
def test_resume_from_a_damaged_log_refuses_then_resumes_without_key_reuse(tmp_path, damage):
    lake, keys = _source(tmp_path)
    target, saved = damage(tmp_path / "lake")
    dst = tmp_path / "dst"
    opened = None
    try:  # deltalake may read past a damaged checkpoint (it lists the commits): then every row is there
        opened = lb.ReplayBuffer.open(dst, lake=lake, snapshot_interval_s=0, run_id="dlog", memory_limit_mb=2)
    except lb.LakeError as e:
        assert "dlog" in str(e) and "again" in str(e)  # names the run and the fix: open again once the lake reads
        with pytest.raises(lb.LakeError):  # still damaged: refused again, never opened empty
            lb.ReplayBuffer.open(dst, lake=lake, snapshot_interval_s=0, run_id="dlog", memory_limit_mb=2)
    if opened is not None:
        assert len(opened) == len(keys)  # never an empty (or partial) run
        opened.close()
    if damage is _garble_commit:
        assert opened is None  # a commit it cannot parse: deltalake cannot read the table, so refused
    target.write_bytes(saved)
    with lb.ReplayBuffer.open(dst, lake=lake, snapshot_interval_s=0, run_id="dlog", memory_limit_mb=2) as b:
        assert len(b) == len(keys)
        assert sorted(b.sql("SELECT key FROM rollouts").column(0).to_pylist()) == sorted(keys)
        new = b.push(make_rollouts(8, tokens=8, seed=3)).to_pylist()
        assert not set(new) & set(keys)  # the key sequence continues past the lake's keys
        b.snapshot(wait=True)
    with lb.ReplayBuffer.open_lake(lake) as view:
        got = view.sql("SELECT key FROM rollouts").column(0).to_pylist()
    assert len(got) == len(set(got)) == len(keys) + 8
