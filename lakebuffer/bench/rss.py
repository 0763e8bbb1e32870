"""Child process of the peak_rss scenario: ingest one system alone and report its own peak RSS.

A fresh process is the only clean way to attribute memory: the parent holds the shared payload
and every other system. The child regenerates the very same rollouts from the same seed.
Usage: ``python -m lakebuffer.bench.rss '{"system": ..., "bytes": ..., "budget_mb": ..., "dir": ...}'``
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil


class _Sampler(threading.Thread):
    """Polls RSS every 5 ms (ru_maxrss covers the peak too; this also gives the anonymous part)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.proc = psutil.Process()
        self.peak = 0
        self.peak_anon = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            m = self.proc.memory_info()
            self.peak = max(self.peak, m.rss)
            self.peak_anon = max(self.peak_anon, m.rss - m.shared)
            time.sleep(0.005)


def _vm_hwm() -> int:
    """Peak RSS of this address space (``ru_maxrss`` would carry the parent's peak across exec)."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _store(system: str, root: Path, budget_mb: int, rows: int) -> Any:
    from . import baselines as bl

    if system == "lakebuffer":
        from .systems import LakeBufferStore

        return LakeBufferStore(root, budget_mb)
    if system == "rocksdb_pickle":
        return bl.RocksPickleStore(root, budget_mb << 20)
    if system == "torchrl":
        bl.torch_available()
        return bl.TorchRLStore(root, rows)
    if system == "deque":
        return bl.DequeStore(root, None)  # unbounded: find where it passes the budget
    raise KeyError(system)


def main(argv: list[str]) -> int:
    from . import data

    args = json.loads(argv[0])
    total, budget = int(args["bytes"]), int(args["budget_mb"]) << 20
    batch_rows = int(args.get("batch_rows", 512))
    data._pools(0)  # the generator's pool is the harness's memory, not the system's: count it in the baseline
    rows_est = int(total / data.avg_row_bytes() * 1.3) + batch_rows
    store = _store(args["system"], Path(args["dir"]), int(args["budget_mb"]), rows_est)
    proc = psutil.Process()
    base = proc.memory_info().rss
    sampler = _Sampler()
    sampler.start()
    pushed = rows = 0
    out_of_budget = None
    t0 = time.perf_counter()
    for t in data.stream(total, batch_rows=batch_rows, seed=0):
        store.push(store.prepare(t))
        pushed += t.nbytes
        rows += t.num_rows
        del t
        if out_of_budget is None and proc.memory_info().rss - base > budget:
            out_of_budget = {"rows": rows, "logical_bytes": pushed}
    store.finish()
    elapsed = time.perf_counter() - t0
    sampler.stop.set()
    sampler.join()
    peak = max(sampler.peak, _vm_hwm())
    end = proc.memory_info().rss
    store.close()
    print(
        json.dumps(
            {
                "peak_rss_bytes": peak,
                "peak_anon_bytes": sampler.peak_anon,
                "baseline_rss_bytes": base,
                "growth_bytes": peak - base,
                "end_rss_bytes": end,
                "logical_bytes": pushed,
                "rows": rows,
                "rss_over_data": peak / pushed,
                "out_of_budget_at": out_of_budget,
                "seconds": elapsed,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
