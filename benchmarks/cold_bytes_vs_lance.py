"""Bytes read from disk per call: our ``get`` of sampled rows against a Lance ``take`` of the same rows.

Why: ``cold_scale.py``'s ``sample + get`` / Lance ratio follows Lance's take of the sampled rows, which moves
between ~15 and ~45 ms from run to run on the same data. This probe drops the page cache of both stores,
then for each of ``--calls`` draws of ``sample(256, where=...)`` times our ``get`` of the keys and Lance's
``take`` of the same rows (alternating which goes first) and counts each one's ``read_bytes``
(``/proc/self/io``: what the disk served). ``--split`` times the cold and the warm rows apart.

    PYTHONPATH=. python benchmarks/cold_bytes_vs_lance.py --root /work/coldscale-data --mb 2048 [--split]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cold_scale as cs  # noqa: E402 - the bench's targets, predicate and page-cache eviction


def read_bytes() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes"):
                return int(line.split()[1])
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, required=True)
    ap.add_argument("--mb", type=int, default=2048)
    ap.add_argument("--calls", type=int, default=16)
    ap.add_argument("--split", action="store_true", help="cold and warm rows timed apart")
    args = ap.parse_args()
    import lance

    import lakebuffer as lb

    t = cs.Target(args.root, args.mb, None)
    buf = lb.ReplayBuffer.open(t.buf, **t.open_kwargs())
    try:
        ds = lance.dataset(t.lance)
        lkeys = np.asarray(ds.to_table(columns=["key"]).column("key").to_numpy(zero_copy_only=False), "U")
        order = np.argsort(lkeys, kind="stable")
        ordered = lkeys[order]
        cold = np.sort(np.asarray(buf.sql("SELECT key FROM cold_rows").column("key").to_numpy(zero_copy_only=False), "U"))
        where = cs.where_for(len(buf))
        for url in (t.lake, t.lance, str(t.buf)):
            cs.evict_cache(url)
        times: dict[str, list[float]] = {}
        mbs: dict[str, list[float]] = {}
        shares = []
        for r in range(args.calls):
            keys = np.asarray(buf.sample(256, where=where, return_keys=True, seed=1000 + r).to_pylist(), "U")
            at = np.searchsorted(cold, keys).clip(0, len(cold) - 1)
            is_cold = cold[at] == keys
            shares.append(float(is_cold.mean()))
            if args.split:
                ck, wk = keys[is_cold], keys[~is_cold]
                ops: list[tuple[str, Any]] = [
                    ("ours, cold rows", lambda ck=ck: buf.get(ck.tolist(), cs.COLS)),
                    ("Lance, the same rows", lambda ck=ck: ds.take(order[np.searchsorted(ordered, ck)], columns=cs.COLS)),
                    ("ours, warm and hot rows", lambda wk=wk: buf.get(wk.tolist(), cs.COLS))]
            else:
                ops = [("ours", lambda keys=keys: buf.get(keys.tolist(), cs.COLS)),
                       ("Lance", lambda keys=keys: ds.take(order[np.searchsorted(ordered, keys)], columns=cs.COLS))]
            if r % 2:
                ops.reverse()
            for name, fn in ops:
                b0, t0 = read_bytes(), time.perf_counter()
                fn()
                times.setdefault(name, []).append((time.perf_counter() - t0) * 1e3)
                mbs.setdefault(name, []).append((read_bytes() - b0) / 1e6)
        out = {"mb": args.mb, "calls": args.calls, "cold_share": round(float(np.mean(shares)), 3), "where": where,
               "p50_ms": {k: round(float(np.median(v)), 1) for k, v in times.items()},
               "disk_mb_per_call_p50": {k: round(float(np.median(v)), 2) for k, v in mbs.items()}}
        print(json.dumps(out, indent=1))
    finally:
        buf.close()


if __name__ == "__main__":
    main()
