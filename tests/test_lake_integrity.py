"""Integrity on the lake side (issue 15, guarantees 2 and 5).

Every read of committed lake files (``open_lake`` get/sample/scan/sql, the buffer's ``cold``
view, restore) is checked against the manifest's checksums.
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
    with lb.ReplayBuffer.open_lake(lake) as view:  # intact: every path reads
        assert view.get(keys[:4], ["key"]).column("key").to_pylist() == keys[:4]
    flip(victim)
    reads = {
        "get": lambda v: v.get(keys[:4], ["key", "response_ids"]),
        "sample": lambda v: v.sample(8, columns=["response_ids"]),
        "scan": lambda v: list(v.scan(columns=["key", "response_ids"])),
        "sql": lambda v: v.sql("SELECT key, response_ids FROM rollouts"),
    }
    for name, read in reads.items():
        with lb.ReplayBuffer.open_lake(lake) as view, pytest.raises(CorruptionError, match=victim.name) as e:
            read(view)
        assert "checksum" in str(e.value), name
    # the buffer's own cold/lake views read the same files
    with lb.ReplayBuffer.open(tmp_path / "b", lake=lake, run_id="other", **OPEN) as buf:
        with pytest.raises(CorruptionError, match=victim.name):
            buf.sql("SELECT key, response_ids FROM lake")


def test_restore_from_a_flipped_lake_file_is_refused(tmp_path):
    lake, _, victim = _lake_with_one_file(tmp_path)
    flip(victim)
    with pytest.raises(CorruptionError, match=victim.name):
        lb.ReplayBuffer.open(tmp_path / "fresh", lake=lake, run_id="r", **OPEN)

