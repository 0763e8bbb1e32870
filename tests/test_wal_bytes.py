"""The WAL's byte count, which the disk budget reads twice a push, follows its segments exactly.

``WriteAheadLog.nbytes`` lists the directory once, then keeps the count as segments are written,
removed or moved aside; a listing that a write or a removal crossed is not kept.
"""

from __future__ import annotations

import threading

from lakebuffer.engine.recovery import quarantine_segment
from lakebuffer.tiers.wal import WriteAheadLog
from tests.rollouts import make_rollouts


def _on_disk(wal: WriteAheadLog) -> int:
    return sum(p.stat().st_size for p in wal.path.glob("*.arrow"))


def test_the_count_follows_writes_removals_and_quarantine(tmp_path):
    wal = WriteAheadLog(tmp_path / "buf" / "wal")
    wal.write(1, make_rollouts(8, seed=1))
    assert wal.nbytes() == _on_disk(wal) > 0  # listed
    for bid in (2, 3, 4):
        wal.write(bid, make_rollouts(16 * bid, seed=bid))
        assert wal.nbytes() == _on_disk(wal)
    wal.remove(2)
    assert wal.nbytes() == _on_disk(wal)
    quarantine_segment(wal, 3, tmp_path / "buf", "a test")
    assert not wal.segment_path(3).exists() and wal.nbytes() == _on_disk(wal)
    reopened = WriteAheadLog(tmp_path / "buf" / "wal")  # another process: lists anew
    assert reopened.nbytes() == _on_disk(wal) == wal.nbytes()


def test_a_listing_crossed_by_a_write_is_not_kept(tmp_path, monkeypatch):
    wal = WriteAheadLog(tmp_path / "wal")
    wal.write(1, make_rollouts(8, seed=1))
    real_ids = wal.ids
    crossed = threading.Event()

    def ids():
        got = real_ids()  # listed: segment 2 is not there yet
        if not crossed.is_set():
            crossed.set()
            wal.write(2, make_rollouts(32, seed=2))  # written while the listing is in hand
        return got

    monkeypatch.setattr(wal, "ids", ids)
    first = wal.nbytes()
    assert first < _on_disk(wal)  # that listing missed segment 2 ...
    assert wal.nbytes() == _on_disk(wal)  # ... so it was not kept: the next call lists again
