"""Physical limits of this machine, measured in the same run as the systems they bound.

Ratios to these say how much of the hardware a system uses, which stays meaningful when the
absolute numbers move from one machine (or one noisy neighbour) to the next.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from .timing import gbps, median

_CHUNK = 8 << 20


def memcpy(nbytes: int, trials: int = 5) -> dict[str, Any]:
    """``np.copyto`` between two pre-faulted buffers: the ceiling for any in-RAM copy."""
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.zeros(nbytes, dtype=np.uint8)  # zeros() is lazily mapped: touch every page first
    dst[:] = 1
    runs = []
    for _ in range(trials):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        runs.append(gbps(nbytes, time.perf_counter() - t0))
    return {"gbps": median(runs), "runs_gbps": runs, "bytes": nbytes}


def _drop_cache(path: Path) -> None:
    """Evict a file's pages so the read below comes from the device, not the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def disk(directory: str | Path, nbytes: int, trials: int = 3) -> dict[str, Any]:
    """Sequential write of ``nbytes`` in 8 MiB chunks then ``fsync``; then a cold sequential read.

    Write+fsync is what "durable on local disk" costs; every spilling system's ingest is quoted
    against it.
    """
    chunk = np.random.default_rng(1).integers(0, 255, size=_CHUNK, dtype=np.uint8).tobytes()
    writes, reads = [], []
    with tempfile.TemporaryDirectory(dir=directory, prefix="disk-limit-") as tmp:
        path = Path(tmp) / "blob"
        buf = bytearray(_CHUNK)
        for _ in range(trials):
            t0 = time.perf_counter()
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                left = nbytes
                while left > 0:
                    left -= os.write(fd, chunk if left >= _CHUNK else chunk[:left])
                os.fsync(fd)
            finally:
                os.close(fd)
            writes.append(gbps(nbytes, time.perf_counter() - t0))
            _drop_cache(path)
            t0 = time.perf_counter()
            with open(path, "rb", buffering=0) as f:
                while f.readinto(buf):
                    pass
            reads.append(gbps(nbytes, time.perf_counter() - t0))
            path.unlink()
    return {
        "write_gbps": median(writes),
        "read_gbps": median(reads),
        "runs_write_gbps": writes,
        "runs_read_gbps": reads,
        "bytes": nbytes,
        "note": "write = os.write 8 MiB chunks + fsync; read after posix_fadvise(DONTNEED)",
    }


def s3(server: Any, nbytes: int, trials: int = 3, *, prefix: str = "limit") -> dict[str, Any]:
    """One object of ``nbytes`` put and got through s3fs against the loopback server.

    On moto the server itself is the bottleneck; the point is the same-run reference, never the
    absolute number.
    """
    fs = server.filesystem()
    blob = np.random.default_rng(2).integers(0, 255, size=nbytes, dtype=np.uint8).tobytes()
    puts, gets = [], []
    for i in range(trials):
        path = f"{server.bucket}/{prefix}/blob-{i}"
        t0 = time.perf_counter()
        fs.pipe_file(path, blob)
        puts.append(gbps(nbytes, time.perf_counter() - t0))
        t0 = time.perf_counter()
        got = fs.cat_file(path)
        gets.append(gbps(nbytes, time.perf_counter() - t0))
        assert len(got) == nbytes
        fs.rm_file(path)
    return {
        "put_gbps": median(puts),
        "get_gbps": median(gets),
        "runs_put_gbps": puts,
        "runs_get_gbps": gets,
        "bytes": nbytes,
        "note": "s3fs pipe_file/cat_file of one object on moto (server mode) at 127.0.0.1",
    }
