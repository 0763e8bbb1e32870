"""Pushes batches forever into a buffer dir and prints each acknowledged key batch as one JSON line.

Used by the crash tests, which kill this process with SIGKILL at random moments. Modes (4th argument):

* ``push`` (default): push and sample; with a lake, periodic snapshots.
* ``maintain``: also ``snapshot(wait=True)`` and ``compact`` (which gcs files replaced > 1 h ago).
* ``gc``: snapshots and compactions back to back, each followed by the lake's ``gc(older_than_s=0)``,
  so replaced files and expired manifests are really deleted while the kill may land.
* ``restore``: ``ready`` is printed *before* ``open``, which restores (or resumes restoring) run
  ``RESTORE_RUN`` from the lake, printing ``{"restored": done, "total": total}`` as it installs; then
  it pushes.
"""

from __future__ import annotations

import json
import sys

import lakebuffer as lb
from tests.rollouts import make_rollouts

RESTORE_RUN = "crash-src"


def _print(msg: dict) -> None:
    print(json.dumps(msg), flush=True)


def main() -> None:
    path, seed = sys.argv[1], int(sys.argv[2])
    lake = sys.argv[3] if len(sys.argv) > 3 else None
    mode = sys.argv[4] if len(sys.argv) > 4 else "push"
    storage_options = json.loads(sys.argv[5]) if len(sys.argv) > 5 else None
    interval = 0.3 if lake and mode in ("push", "maintain") else 0
    if mode == "restore":
        _print({"ready": True})
        buf = lb.ReplayBuffer.open(path, memory_limit_mb=1, snapshot_interval_s=0, lake=lake, run_id=RESTORE_RUN,
                                   storage_options=storage_options,
                                   progress=lambda done, total: _print({"restored": done, "total": total}))
    else:
        buf = lb.ReplayBuffer.open(path, memory_limit_mb=1, snapshot_interval_s=interval, lake=lake,
                                   storage_options=storage_options)
        _print({"ready": True})
    cold = None
    if mode == "gc":
        from lakebuffer.lake import Lake

        cold = Lake(lake, storage_options)
    i = 0
    while True:
        t = make_rollouts(32, tokens=64, version=i % 5, seed=seed * 100_000 + i)
        keys = buf.push(t).to_pylist()
        _print({"keys": keys})
        i += 1
        if i % 7 == 0:
            buf.sample(8, seed=i)
        if mode == "maintain":
            if i % 3 == 0:
                buf.snapshot(wait=True)
            if i % 5 == 0:
                buf.compact(target_file_bytes=1 << 20)  # rewrites small files, then gc
        elif mode == "gc":
            buf.snapshot(wait=True)
            if i % 2 == 0:
                buf.compact(target_file_bytes=1 << 20)
            _print({"gc": cold.gc(older_than_s=0)})  # no grace: every replaced file and older manifest goes now


if __name__ == "__main__":
    main()
