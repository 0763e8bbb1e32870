"""What a cold ``take`` of 256 random keys costs in the page reader alone, per mimalloc purge delay (#23).

``lakebuffer`` sets ``MIMALLOC_PURGE_DELAY=0`` before DataFusion loads (freed pages go back at once: the
RAM budget pays for anonymous RSS). Run this once per setting, on a built lake (``cold_scale.py``)::

    for d in 0 1 10; do MIMALLOC_PURGE_DELAY=$d PYTHONPATH=. .venv/bin/python benchmarks/cold_take_alloc.py \\
        /work/coldscale-data/local/8192mb/lake cs8192; done

It prints the p50/min of ``PageReader.take_grouped`` over 14 calls (every call fresh keys, files
registered first), the same keys for every setting.
"""

from __future__ import annotations

import os
import random
import sys
import time

import pyarrow.parquet as pq

from lakebuffer.lake import Lake
from lakebuffer.lake.entries import entries_of
from lakebuffer.lake.pages import PageReader, cache_bytes_for


def main(url: str, run_id: str, calls: int = 14, n: int = 256) -> None:
    lake = Lake(url, read_only=True)
    ents = entries_of(lake.delta.table(), run_id)
    keys = [(i, k) for i, e in enumerate(ents)
            for k in pq.read_table(lake.store.abs(e["path"]), columns=["key"]).column(0).to_pylist()]
    reader = PageReader(lake.store, cache_bytes=cache_bytes_for(512 << 20))
    reader.prepare(ents)
    times = []
    for r in range(calls):
        by: dict[int, list[str]] = {}
        for i, k in random.Random(r).sample(keys, n):
            by.setdefault(i, []).append(k)
        t = time.perf_counter()
        _, errors = reader.take_grouped([(ents[i], ks) for i, ks in by.items()], ["response_ids"])
        times.append(time.perf_counter() - t)
        assert not errors, errors
    times.sort()
    print(f"MIMALLOC_PURGE_DELAY={os.environ.get('MIMALLOC_PURGE_DELAY')} files={len(ents)} "
          f"take_grouped p50 {1000 * times[len(times) // 2]:.1f} ms, min {1000 * times[0]:.1f} ms")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
