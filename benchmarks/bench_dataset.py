"""Training-dataset throughput from the lake next to a raw pyarrow.dataset scan of the same files.

    python benchmarks/bench_dataset.py [--mb 400] [--repeats 3] [--out benchmarks/results-dataset.json]

Writes ``--mb`` MiB of generated GRPO rollouts (lakebuffer.bench.data: 256..4096 response tokens,
64..1024 prompt tokens) into a lake with ``Lake.commit_snapshot`` (the buffer's own snapshot
path), then runs ``lakebuffer.bench.dataset.bench_dataset`` on it: the raw scan, ``iter_batches``
unshuffled, shuffled (RolloutDataset's default) and shuffled + ``pad_collate``, interleaved, in
the same run. Target: the dataset at >= 70% of the raw scan's rows/s.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from lakebuffer.bench.data import stream
from lakebuffer.bench.dataset import bench_dataset
from lakebuffer.lake import Lake


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=400, help="MiB of Arrow rollout data in the lake")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--lake", default=None, help="use this existing lake URL instead of generating one")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    tmp = None
    if args.lake:
        lake = Lake(args.lake, read_only=True)
    else:
        tmp = Path(tempfile.mkdtemp(prefix="lakebuffer-bench-dataset-"))
        lake = Lake((tmp / "lake").as_uri())
        lake.commit_snapshot("bench", stream(int(args.mb * 2**20), batch_rows=1024))
    try:
        res = bench_dataset(lake, batch_size=args.batch_size, repeats=args.repeats)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    res["lake_mb"] = args.mb
    for name in ("raw", "dataset", "dataset_shuffled", "dataset_collated"):
        r = res[name]
        extra = f"  {r['ratio_vs_raw']:.2f}x raw (cpu {r['cpu_ratio_vs_raw']:.2f}x)" if "ratio_vs_raw" in r else ""
        print(f"{name:17s} {r['rows_per_s']:10.0f} rows/s {r['tokens_per_s'] / 1e6:8.1f} M tokens/s{extra}")
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    return res


if __name__ == "__main__":
    main()
