"""Dataset benchmark: iteration throughput next to a raw ``pyarrow.dataset`` scan of the same files.

Run by ``benchmarks/bench_dataset.py`` (which writes the lake first); lives apart from the dataset
layer so the library does not carry its benchmark.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from ..dataset import ArrowDatasetSource, as_source, iter_batches, pad_collate, sql_to_expression
from ..dataset.sources import resolve_columns


def _tokens(b: pa.RecordBatch) -> int:
    n = 0
    for c in ("prompt_ids", "response_ids"):
        if c in b.schema.names:
            off = b.column(c).offsets
            n += off[len(off) - 1].as_py() - off[0].as_py() if len(off) else 0
    return n


def bench_dataset(path_or_lake: Any, *, columns: Sequence[str] | None = ("prompt_ids", "response_ids", "reward"),
                  batch_size: int = 256, repeats: int = 3, where: str | None = None,
                  collate: bool = True) -> dict[str, Any]:
    """Dataset iteration throughput next to a raw ``pyarrow.dataset`` scan of the same files, same run.

    Cases (run interleaved, one warm-up round first, medians of ``repeats``): ``raw`` =
    ``Dataset.scanner(columns=...).to_batches()`` with pyarrow's defaults; ``dataset`` =
    :func:`iter_batches` unshuffled; ``dataset_shuffled`` = shuffled (the ``RolloutDataset``
    default); ``dataset_collated`` = shuffled plus :func:`pad_collate` to NumPy (work the raw scan
    does not do). Each reports rows/s, tokens/s (prompt + response tokens), wall and CPU seconds;
    ``ratio_vs_raw`` is rows/s over raw's, ``cpu_ratio_vs_raw`` raw's CPU time over this one's
    (steadier than wall time on a shared machine).
    """
    src = as_source(path_or_lake)
    if not isinstance(src, ArrowDatasetSource):
        raise TypeError("bench_dataset reads a lake or a Parquet dataset")
    cols = resolve_columns(src, columns)
    expr = sql_to_expression(where, src.schema) if where else None
    if where and expr is None:
        raise ValueError("bench_dataset needs a where that translates to a pyarrow expression (for the raw scan)")

    def raw():
        scan = src.dataset.scanner(columns=cols, filter=expr) if expr is not None else src.dataset.scanner(columns=cols)
        yield from scan.to_batches()

    def mine(shuffle: bool):
        return iter_batches(src, where, cols, batch_size, shuffle=shuffle, seed=1)

    def collated():
        for b in mine(True):
            pad_collate(b, return_tensors="np")
            yield b

    cases = {"raw": raw, "dataset": lambda: mine(False), "dataset_shuffled": lambda: mine(True)}
    if collate:
        cases["dataset_collated"] = collated
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
    counts: dict[str, tuple[int, int]] = {}
    for rep in range(repeats + 1):
        for name, fn in cases.items():
            t0, c0 = time.perf_counter(), time.process_time()
            rows = tokens = 0
            for b in fn():
                rows += b.num_rows
                tokens += _tokens(b)
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            if rep:  # the first round warms the page cache
                times[name].append((dt, dc))
            counts[name] = (rows, tokens)
    out: dict[str, Any] = {"files": len(src.files()), "columns": cols, "batch_size": batch_size, "repeats": repeats,
                           "bytes_on_disk": sum(_file_size(src, f) for f in src.fragments)}
    for name in cases:
        wall = float(np.median([t[0] for t in times[name]]))
        cpu = float(np.median([t[1] for t in times[name]]))
        rows, tokens = counts[name]
        out[name] = {"rows": rows, "tokens": tokens, "seconds": wall, "cpu_seconds": cpu,
                     "rows_per_s": rows / wall, "tokens_per_s": tokens / wall}
    base = out["raw"]
    for name in cases:
        if name != "raw":
            out[name]["ratio_vs_raw"] = out[name]["rows_per_s"] / base["rows_per_s"]
            out[name]["cpu_ratio_vs_raw"] = base["cpu_seconds"] / out[name]["cpu_seconds"]
    return out


def _file_size(src: ArrowDatasetSource, frag: Any) -> int:
    path = getattr(frag, "path", None)
    fs = src.filesystem
    if path is None or fs is None:
        return 0
    try:
        return int(fs.get_file_info(path).size or 0)
    except (OSError, pa.ArrowException):
        return 0
