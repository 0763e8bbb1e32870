"""How many object-store requests a cold ``get`` makes, split into payload pages and digest reads.

    PYTHONPATH=. python benchmarks/cold_request_split.py --root /work/cs-fresh --mb 2048 8192

Counts the reader's own plans, merged as the reader merges them (``rowpages.merged_ranges``) with the
object-store gap (1 MiB), on the local ``cold_scale.py`` builds, so no S3 server is needed: the totals are
what moto's request log counts for the same lakes (``cold_scale.py --s3``), within the spread of random keys. Payload pages and each row's digest bytes (``RAW`` spans) are also
merged apart, to say what keeping the digests elsewhere would save. Medians over ``--calls`` gets of 256
random cold keys.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np
from cold_scale import COLS, Target

import lakebuffer as lb
from lakebuffer.lake import rowpages
from lakebuffer.lake.rowplan import RAW, TakePlan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, required=True)
    ap.add_argument("--mb", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--calls", type=int, default=10)
    a = ap.parse_args()
    counts = {"all": 0, "payload": 0, "digests": 0}
    merged = rowpages.RowPages._merged

    def counting(self: rowpages.RowPages, plan: TakePlan) -> list[list[int]]:
        raw = [s for s, n in plan.wanted.items() if plan.codecs.get(n) == RAW]
        other = [s for s, n in plan.wanted.items() if plan.codecs.get(n) != RAW]
        for name, spans in (("all", plan.wanted), ("payload", other), ("digests", raw)):
            counts[name] += len(rowpages.merged_ranges(spans, rowpages.OBJECT_MERGE_GAP))
        return merged(self, plan)

    rowpages.RowPages._merged = counting
    for mb in a.mb:
        t = Target(a.root, mb, None)
        buf = lb.ReplayBuffer.open(t.buf, **t.open_kwargs())
        try:
            cold = buf.sql("SELECT key FROM cold_rows ORDER BY key").column("key").to_pylist()
            rng = np.random.default_rng(0)
            seen: dict[str, list[int]] = {k: [] for k in counts}
            for _ in range(a.calls):
                keys = [cold[i] for i in rng.choice(len(cold), 256, replace=False)]
                counts.update(dict.fromkeys(counts, 0))
                buf.get(keys, COLS)
                for k, v in counts.items():
                    seen[k].append(v)
            print(f"{mb} MB: requests a get of 256 cold keys, p50: "
                  + ", ".join(f"{k} {statistics.median(v):.0f}" for k, v in seen.items()), flush=True)
        finally:
            buf.close()


if __name__ == "__main__":
    main()
