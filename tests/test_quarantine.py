"""``fsck`` (API and CLI) lists the quarantine folder: what recovery or a repair moved aside, its
size, why, and how to dispose of it (issue 15: what is kept must not be invisible)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import lakebuffer as lb
from lakebuffer.fsck import check as fsck
from tests.rollouts import make_rollouts

ROOT = Path(__file__).resolve().parent.parent
OPEN = {"memory_limit_mb": 64, "snapshot_interval_s": 0}


def _cli(*args: str) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "lakebuffer.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=240, env={**os.environ, "COLUMNS": "200"})


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_fsck_lists_quarantined_files_with_size_reason_and_how_to_dispose(tmp_path):
    with lb.ReplayBuffer.open(tmp_path, **OPEN) as buf:
        keys = buf.push(make_rollouts(32, tokens=16, seed=1)).to_pylist()
        buf.push(make_rollouts(32, tokens=16, seed=2))
    segs = sorted((tmp_path / "wal").glob("*.arrow"))
    stray = tmp_path / "wal" / f"{10**6:016d}.arrow"
    shutil.copy(segs[0], stray)  # a push that crashed before its acknowledgement
    clean = fsck(tmp_path)
    assert clean["quarantine"] == [] and "quarantine_help" not in clean
    with lb.ReplayBuffer.open(tmp_path, **OPEN) as buf:  # recovery moves the stray segment aside
        assert set(keys) <= set(buf.sql("SELECT key FROM rollouts").column(0).to_pylist())
    _flip(segs[1])  # and a segment that fails its check: fsck --repair moves it aside too
    fsck(tmp_path, repair=True)

    report = fsck(tmp_path)
    assert report["ok"]  # what is in quarantine is kept, not a problem of the buffer
    entries = {Path(e["path"]).name: e for e in report["quarantine"]}
    assert set(entries) == {stray.name, segs[1].name}
    for e in entries.values():
        assert Path(e["path"]).is_file() and e["bytes"] == Path(e["path"]).stat().st_size > 0 and e["at"]
    assert "no index entry refers to it" in entries[stray.name]["why"]
    assert "checksum" in entries[segs[1].name]["why"]
    help_text = report["quarantine_help"]
    assert "never read" in help_text and str(tmp_path / "quarantine") in help_text and "pyarrow" in help_text

    r = _cli("fsck", str(tmp_path))  # the CLI prints the same: files, sizes, why, how to dispose
    assert r.returncode == 0, r.stderr
    assert "quarantine: 2 file(s)" in r.stdout
    assert stray.name in r.stdout and "no index entry refers to it" in r.stdout and "checksum" in r.stdout
    assert f"({entries[stray.name]['bytes']} bytes" in r.stdout
    assert "to dispose:" in r.stdout and "Delete" in r.stdout
    as_json = json.loads(_cli("fsck", str(tmp_path), "--json").stdout)
    assert len(as_json["quarantine"]) == 2 and as_json["quarantine_help"] == help_text


def test_fsck_lists_a_damaged_index_it_moved_aside_and_files_moved_by_hand(tmp_path):
    with lb.ReplayBuffer.open(tmp_path, **OPEN) as buf:
        buf.push(make_rollouts(32, tokens=16, seed=3))
    (tmp_path / "index" / "CURRENT").write_bytes(b"garbage\n")
    rep = fsck(tmp_path, repair=True)  # rebuilds the index; the damaged one goes to quarantine
    (entry,) = rep["quarantine"]
    assert Path(entry["path"]).is_dir() and Path(entry["path"]).parent == tmp_path / "quarantine" / "index"
    assert entry["bytes"] > 0 and "RocksDB could not read it" in entry["why"]
    by_hand = tmp_path / "quarantine" / "misc" / "note.bin"
    by_hand.parent.mkdir()
    by_hand.write_bytes(b"x" * 10)
    listed = {Path(e["path"]).name: e for e in fsck(tmp_path)["quarantine"]}
    assert listed["note.bin"]["bytes"] == 10 and listed["note.bin"]["why"] is None  # listed, reason unknown
