"""Issue 24 item 1: another program truncating, rewriting or deleting warm fragments while a buffer
reads them gives correct rows or ``CorruptionError``, never a crash signal (guarantee 7).

The reader is a child process (``tests/warm_race_child.py``: ``get`` and a payload ``sql`` in a loop,
checking every row it gets against the rows pushed); this process damages fragment files under it,
then puts each back, over and over. Before issue 24 the warm tier memory-mapped its fragments and
the child died of SIGBUS (a truncated mapped file) or SIGSEGV.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

import lakebuffer as lb
from tests.rollouts import make_rollouts
from tests.sizes import fast_and_full

N, TOKENS = 1600, 256


def _build(path: Path) -> list[Path]:
    t = make_rollouts(N, tokens=TOKENS, seed=0).append_column("key", pa.array([f"k{i}" for i in range(N)]))
    with lb.ReplayBuffer.open(path, memory_limit_mb=4, snapshot_interval_s=0) as buf:
        for i in range(0, N, 100):
            buf.push(t.slice(i, 100))
        buf.evict_all()
    frags = sorted((path / "warm").glob("*.arrow"))
    assert len(frags) >= 4, frags
    return frags


def _put_back(p: Path, data: bytes) -> None:
    with open(p, "r+b" if p.exists() else "wb") as f:
        f.write(data)
        f.truncate(len(data))


def _damage(frags: list[Path], stop: threading.Event, seed: int, done: list[int]) -> None:
    """Truncate, overwrite in place, or delete a random fragment; a moment later, put it back."""
    rng = np.random.default_rng(seed)
    originals = {p: p.read_bytes() for p in frags}
    while not stop.is_set():
        p = frags[int(rng.integers(len(frags)))]
        data = originals[p]
        kind = ("truncate", "rewrite", "delete", "zero")[int(rng.integers(4))]
        if kind == "truncate":
            os.truncate(p, int(rng.integers(0, len(data))))
        elif kind == "rewrite":
            with open(p, "r+b") as f:
                f.seek(int(rng.integers(0, len(data) - 4096)))
                f.write(rng.bytes(4096))
        elif kind == "delete":
            p.unlink()
        else:
            os.truncate(p, 0)
            _put_back(p, bytes(len(data)))
        time.sleep(float(rng.uniform(0, 0.02)))
        if kind == "delete":
            tmp = p.with_suffix(".put")
            tmp.write_bytes(data)
            os.replace(tmp, p)
        else:
            _put_back(p, data)
        done[0] += 1
        time.sleep(float(rng.uniform(0, 0.01)))


def _race(tmp_path: Path, seconds: float) -> tuple[subprocess.CompletedProcess, int]:
    frags = _build(tmp_path / "buf")
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    child = subprocess.Popen([sys.executable, "-m", "tests.warm_race_child", str(tmp_path / "buf"), str(N),
                              str(TOKENS), str(seconds)], cwd=root, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    stop, done = threading.Event(), [0]
    t = threading.Thread(target=_damage, args=(frags, stop, 0, done))
    t.start()
    try:
        out, err = child.communicate(timeout=seconds + 60)
    finally:
        stop.set()
        t.join()
    return subprocess.CompletedProcess(child.args, child.returncode, out, err), done[0]


def _check(res: subprocess.CompletedProcess, damaged: int) -> None:
    assert res.returncode >= 0, f"reader died of signal {-res.returncode}:\n{res.stderr[-3000:]}"
    assert res.returncode == 0, f"reader failed ({res.returncode}):\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    assert "done" in res.stdout and damaged > 20, (res.stdout, damaged)


@fast_and_full("seconds", 4.0, 60.0)
def test_damaging_fragments_under_reads_gives_rows_or_corruption_error(tmp_path, seconds):
    res, damaged = _race(tmp_path, seconds)
    _check(res, damaged)
