"""Pushes into a buffer with a small disk budget (so fragments keep moving to the cold tier) and prints
each acknowledged key batch as one JSON line; the cold-tier crash tests kill it with SIGKILL.

Modes (4th argument): ``random`` (push, snapshot, get, until killed from outside) and ``in-move``: the
process kills itself with SIGKILL inside its first tier move, after the index recorded the fragment's
rows as cold and before the fragment's file is removed. ``promote-before`` / ``promote-after``: reopen
with room on disk and ``promote_cold_reads=True``, read cold rows, and die inside the first promotion,
just before / just after the index write that makes the batch warm again (its fragment is written).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import lakebuffer as lb
from tests.rollouts import make_rollouts


def main() -> None:
    path, lake, seed, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    if mode.startswith("promote"):
        return promote_and_die(path, lake, mode)
    buf = lb.ReplayBuffer.open(path, lake=lake, memory_limit_mb=2, snapshot_interval_s=0.3, disk_limit_gb=4 / 1024)
    if mode == "in-move":
        warm = buf._state.warm

        def die(fragment_ids: list[int]) -> None:
            os.kill(os.getpid(), signal.SIGKILL)

        warm.drop_fragments = die  # the move's last step: the index already says cold
    i = 0
    keys: list[str] = []
    while True:
        t = make_rollouts(64, tokens=256, version=i % 5, seed=seed * 100_000 + i)
        new = buf.push(t).to_pylist()
        print(json.dumps({"keys": new}), flush=True)
        keys += new
        i += 1
        if i % 4 == 0:
            buf.snapshot(wait=True)
        if i % 3 == 0:
            buf.get(keys[-200:], ["key", "response_ids"])


def promote_and_die(path: str, lake: str, mode: str) -> None:
    buf = lb.ReplayBuffer.open(path, lake=lake, memory_limit_mb=2, snapshot_interval_s=0, disk_limit_gb=64 / 1024,
                               promote_cold_reads=True)
    index = buf._state.index
    set_warm = index.set_warm

    def die(info) -> None:
        if mode == "promote-after":
            set_warm(info)
        print(json.dumps({"killed_in": mode, "batch": info.batch_id}), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    index.set_warm = die
    keys = buf.sql("SELECT key FROM cold_rows ORDER BY key").column("key").to_pylist()
    buf.get(keys[:64], ["key", "response_ids"])
    time.sleep(120)


if __name__ == "__main__":
    main()
