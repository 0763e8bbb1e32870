"""The first ``sample`` after a large ingest against the steady ones (issue 26, item 6).

    python benchmarks/first_sample.py --mb 1024 --budget-mb 128 --calls 30 --trials 3 [--profile] [--no-flush]

A trainer's loop: a new buffer gets one small push and one ``sample`` (the ``where`` shape is known,
unless ``--new-shape``), then ``--mb`` of generated GRPO rollouts in 512-row pushes under
``--budget-mb``, then ``flush()`` as the bench's ingest does (unless ``--no-flush``; then a 0.2 s
pause, a trainer's step), then ``sample(256, where="reward > 0.5", return_keys=True)`` ``--calls``
times with different seeds: the first call against the p50/p99 of the others. Trials alternate
the catalog's warm-up on and off (off: ``WARM_QUIET_S = None`` and no warm-up in ``flush``: the
code before issue 26) and fresh buffers; the summary gives medians of each. ``--profile`` prints a
cProfile of each first call.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

import lakebuffer as lb
from lakebuffer import catalog
from lakebuffer.bench import data

WARM_QUIET_S = getattr(catalog, "WARM_QUIET_S", None)  # None: code from before issue 26 (PYTHONPATH=/work/main)

SHAPES = {"payload": data.PAYLOAD, "metadata": data.METADATA}


def trial(mb: int, budget_mb: int, calls: int, flush: bool, profile: bool, push_rows: int, shape: str,
          warm: bool, new_shape: bool) -> dict:
    root = Path(tempfile.mkdtemp(prefix="lb-first-sample-"))
    catalog.WARM_QUIET_S = WARM_QUIET_S if warm else None
    try:
        with lb.ReplayBuffer.open(root / "buf", memory_limit_mb=budget_mb, snapshot_interval_s=0) as buf:
            if not warm:
                buf._catalog.warm_now = lambda: None  # the code before issue 26: flush() did not warm either
            if not new_shape:
                buf.push(next(iter(data.stream(1 << 20, batch_rows=push_rows, seed=2, shape=SHAPES[shape]))).drop_columns(["key", "run_id"]))
                buf.sample(8, where="reward > 0.25", seed=0, return_keys=True)
            t0 = time.perf_counter()
            for t in data.stream(mb << 20, batch_rows=push_rows, seed=1, shape=SHAPES[shape]):
                buf.push(t.drop_columns(["key", "run_id"]))
            ingest_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            if flush:
                buf.flush()
            else:
                time.sleep(0.2)
            flush_s = time.perf_counter() - t0
            times = []
            prof = cProfile.Profile() if profile else None
            for i in range(calls):
                if prof is not None and i == 0:
                    prof.enable()
                t0 = time.perf_counter()
                buf.sample(256, where="reward > 0.5", seed=1000 + i, return_keys=True)
                times.append(time.perf_counter() - t0)
                if prof is not None and i == 0:
                    prof.disable()
            if prof is not None:
                pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
            steady = np.array(times[1:]) * 1e3
            return {"warm": warm, "rows": len(buf), "ingest_s": round(ingest_s, 2), "flush_s": round(flush_s, 3),
                    "first_ms": round(times[0] * 1e3, 2), "steady_p50_ms": round(float(np.median(steady)), 2),
                    "steady_p99_ms": round(float(np.percentile(steady, 99)), 2),
                    "first_over_p50": round(times[0] * 1e3 / float(np.median(steady)), 2)}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=512)
    ap.add_argument("--budget-mb", type=int, default=64)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--push-rows", type=int, default=512)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="payload",
                    help="payload: 256..4096 response tokens; metadata: 1..4 tokens (many rows per MB)")
    ap.add_argument("--no-flush", action="store_true")
    ap.add_argument("--new-shape", action="store_true", help="no sample before the ingest: the first call also learns the where shape")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--only", choices=("warm", "off"), help="run only trials with the warm-up on / off")
    a = ap.parse_args()
    results = []
    modes = [True, False] if a.only is None else [a.only == "warm"]
    for i in range(len(modes) * a.trials):
        r = trial(a.mb, a.budget_mb, a.calls, not a.no_flush, a.profile, a.push_rows, a.shape, modes[i % len(modes)], a.new_shape)
        results.append(r)
        print(json.dumps(r), flush=True)
    summary = {}
    for warm in modes:
        rs = [r for r in results if r["warm"] is warm]
        summary["warm_up" if warm else "before"] = {k: float(np.median([r[k] for r in rs]))
                                                    for k in ("first_ms", "steady_p50_ms", "steady_p99_ms", "first_over_p50")}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
