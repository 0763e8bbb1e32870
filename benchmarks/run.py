"""Run the lakebuffer benchmark suite: ``python benchmarks/run.py [--quick] [--out results.json]``.

The same as ``lakebuffer bench``; see BENCHMARKS.md for the scenarios and the last full run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a checkout without installing

from lakebuffer.bench import SCENARIOS, run, summary  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="smoke run, under 60 s on 2 cores")
    ap.add_argument("--out", default=None, help="results JSON (default benchmarks/results.json, or results-quick.json)")
    ap.add_argument("--plot", default=None, help="sample-latency PNG (default: beside --out)")
    ap.add_argument("--scenario", action="append", choices=list(SCENARIOS), help="run only these (repeatable)")
    args = ap.parse_args(argv)
    out = args.out or str(HERE / ("results-quick.json" if args.quick else "results.json"))
    t0 = time.perf_counter()

    def progress(msg: str, done: int, total: int) -> None:
        print(f"[{time.perf_counter() - t0:7.1f}s {done}/{total}] {msg}", file=sys.stderr, flush=True)

    res = run(quick=args.quick, out=out, scenarios=args.scenario, progress=progress, plot=args.plot)
    print(summary(res))
    print(f"\nresults: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
