"""Decides whether the WAL writes new segments over removed ones (``tiers/wal.py`` spare files).

    PYTHONPATH=. .venv/bin/python benchmarks/wal_spares.py [--blocks 8] [--per-block 25]

One process, one buffer per variant (its WAL keeping spares, or not: a new file per segment), the
variants alternated in blocks; per push, the median of ``ReplayBuffer.push`` of a TransferQueue-shaped
batch (16 samples x L tokens: int64 ids + float32 log-probs), for two ways segments leave the WAL:

* ``clear``: each batch is deleted after it is timed (TransferQueue's ``kv_clear`` after a step);
* ``stream``: batches accumulate and write-back moves them to warm fragments (a rollout stream).

Also, outside the buffer, one ``os.write`` of the same bytes into a new file and over an old file's
blocks: the filesystem's own difference on this machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

import lakebuffer as lb


def batch(L: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    offsets = pa.array(np.arange(0, 17 * L, L, dtype=np.int32))
    return pa.table({
        "key": pa.array([f"b{seed}-{i}" for i in range(16)], pa.string()),
        "prompt_id": pa.array([f"p{seed}"] * 16, pa.string()),
        "policy_version": pa.array(np.full(16, seed, np.int64)),
        "prompt_ids": pa.ListArray.from_arrays(pa.array(np.arange(0, 17 * 64, 64, dtype=np.int32)),
                                               pa.array(rng.integers(0, 150_000, 16 * 64), pa.int32())),
        "response_ids": pa.ListArray.from_arrays(offsets, pa.array(rng.integers(0, 150_000, 16 * L), pa.int32())),
        "response_logprobs": pa.ListArray.from_arrays(offsets, pa.array(-rng.random(16 * L, dtype=np.float32))),
        "reward": pa.array(rng.random(16, dtype=np.float32)),
    })


def filesystem(root: Path, nbytes: int, rounds: int) -> dict[str, float]:
    """One write of ``nbytes`` into a new file vs over an old file's blocks (each file then removed)."""
    data = os.urandom(nbytes)
    out: dict[str, list[float]] = {"new file": [], "over old blocks": []}
    old = root / "old"
    old.write_bytes(data)
    for r in range(rounds):
        for name in out:
            p = root / f"seg{r}"
            if name == "over old blocks":
                os.rename(old, p)
                fd = os.open(p, os.O_WRONLY)
            else:
                fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            t0 = time.perf_counter()
            os.write(fd, data)
            out[name].append(time.perf_counter() - t0)
            os.close(fd)
            if name == "over old blocks":
                os.rename(p, old)
            else:
                p.unlink()
    return {k: statistics.median(v) * 1e3 for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--per-block", type=int, default=25)
    ap.add_argument("--lengths", default="4096,16384")
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(dir=os.environ.get("BENCH_DIR", "/work" if os.path.isdir("/work") else None)))
    try:
        run(root, a)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(root: Path, a: argparse.Namespace) -> None:
    variants = {"spares": True, "new files": False}
    print(f"load {os.getloadavg()[0]:.2f}; {a.blocks} alternated blocks of {a.per_block} pushes per variant")
    for L in [int(x) for x in a.lengths.split(",")]:
        nbytes = batch(L, 0).nbytes
        fs = filesystem(root, nbytes, 40)
        print(f"16 x {L} ({nbytes / 2**20:.1f} MB): os.write into a new file {fs['new file']:.2f} ms, "
              f"over an old file's blocks {fs['over old blocks']:.2f} ms")
        for mode in ("clear", "stream"):
            times: dict[str, list[float]] = {v: [] for v in variants}
            bufs = {v: lb.ReplayBuffer.open(root / f"{mode}-{L}-{v.replace(' ', '_')}", memory_limit_mb=64,
                                            snapshot_interval_s=0) for v in variants}
            for v, keeps in variants.items():
                bufs[v].wal.keeps_spares = keeps
            seed = 0
            try:
                for _ in range(a.blocks):
                    for v in variants:
                        for _ in range(a.per_block):
                            seed += 1
                            t = batch(L, seed)
                            t0 = time.perf_counter()
                            bufs[v].push(t)
                            times[v].append(time.perf_counter() - t0)
                            if mode == "clear":
                                bufs[v].delete(keys=t.column("key").to_pylist())
            finally:
                for b in bufs.values():
                    b.close()
            med = {v: statistics.median(xs[a.per_block:]) * 1e3 for v, xs in times.items()}
            print(f"  {mode:6s} push median: spares {med['spares']:.2f} ms, new files {med['new files']:.2f} ms "
                  f"({med['spares'] / med['new files']:.2f}x)")


if __name__ == "__main__":
    main()
