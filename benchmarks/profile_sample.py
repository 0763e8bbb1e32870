"""Sample latency at 10M metadata rollouts outside the bench, and where a call's time goes (issue 17).

    python benchmarks/profile_sample.py --rows 10000000 --push-rows 16384            # fresh buffer
    python benchmarks/profile_sample.py --rows 10000000 --push-rows 16384 --grow     # grown as the bench grows it
    python benchmarks/profile_sample.py --rows 10000000 --others numpy,rocksdb_pickle,torchrl

Prints p50/p99 of ``sample(256, where="reward > 0.5 AND policy_version >= v")`` (and the fresh
window) and a cProfile of 10 calls at the largest size.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import shutil
import tempfile
from pathlib import Path

from lakebuffer.bench import baselines as bl
from lakebuffer.bench import data
from lakebuffer.bench.scenarios.sample import _feed, fresh_threshold, version_threshold
from lakebuffer.bench.systems import LakeBufferStore
from lakebuffer.bench.timing import latency_loop, quiet_gc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--push-rows", type=int, default=16_384)
    ap.add_argument("--budget-mb", type=int, default=256)
    ap.add_argument("--grow", action="store_true", help="sample 200x at 100k and 1M rows first, as the bench does")
    ap.add_argument("--others", default="", help="baselines built alongside in the same process")
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="lb-profile-sample-"))
    try:
        stores = {"lakebuffer": LakeBufferStore(root / "lb", a.budget_mb)}
        others = [o for o in a.others.split(",") if o]
        if "numpy" in others:
            stores["numpy"] = bl.NumpyIndex()
        if "rocksdb_pickle" in others:
            stores["rocksdb_pickle"] = bl.ScoreIndex()
        if "torchrl" in others:
            stores["torchrl"] = bl.TorchRLStore(root / "trl", a.rows, shape=data.METADATA)
        sizes = [s for s in (100_000, 1_000_000) if s < a.rows] + [a.rows] if a.grow else [a.rows]
        built = 0
        for size in sizes:
            while built < size:
                n = min(262_144, size - built)
                t = data.rollouts(built, n, seed=1, shape=data.METADATA, run_id="meta")
                for s in stores.values():
                    _feed(s, t, a.push_rows)
                built += n
            for s in stores.values():
                s.finish()
            for name, s in stores.items():
                if name == "rocksdb_pickle" and size != a.rows:
                    continue
                for label, v in (("broad", version_threshold(size)), ("fresh", fresh_threshold(size))):
                    with quiet_gc():
                        f = latency_loop(lambda i, s=s, v=v: s.sample_keys(256, 0.5, v, seed=i), min_trials=5,
                                         max_trials=200, max_seconds=6)
                    print(f"{name} {size:,} {label}: p50 {f['p50_ms']:.2f} ms, p99 {f['p99_ms']:.2f} ms", flush=True)
            stores["lakebuffer"].finish()
        lb_store = stores["lakebuffer"]
        v = version_threshold(a.rows)
        pr = cProfile.Profile()
        pr.enable()
        for i in range(10):
            lb_store.sample_keys(256, 0.5, v, seed=1000 + i)
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(10)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
