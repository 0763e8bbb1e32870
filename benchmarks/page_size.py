"""Issue 23: the data page size of lake files, chosen again now that a get reads digests row by row.

Since ``_lb_hash`` is read at a computed offset (``lake/rowpages.py``), a 256-key get of a big lake
reads one page per row of each asked column and nothing else, so the page size sets what a get
decompresses (a ``response_ids`` row is ~14 KB; a 64 KiB page holds ~5). Smaller pages cost scans
(more pages) and bytes. Measured side by side in one process on the same generated rows
(``lakebuffer.bench.data``, ``--mb``): the lake's layout at each ``--page-kb``, the pre-#23 layout
(``old``: 1 MiB pages, no page index) as the scans' baseline, and a Lance take as the floor.

* ``take``: ``RowPages.take_many`` of ``--keys`` random rows' ``response_ids`` with the digests checked
  (what a cold get runs), every layout on the same rows in a round, the order rotating; wall and CPU
  (``time.process_time``) p50; optionally (``--evict-cache``) every file's pages dropped before each take.
* ``scan``: DuckDB over a pyarrow dataset of each layout, a flat aggregate and one over
  ``response_ids``, alternating layouts, CPU and wall median.
* ``bytes`` of each layout.

    PYTHONPATH=. .venv/bin/python benchmarks/page_size.py --mb 512 --page-kb 64 32 16 --rounds 12
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pds

import lakebuffer.lake.writer as lake_writer
from benchmarks.cold_scale import evict_cache
from benchmarks.cold_take import COLS, MiB, write
from lakebuffer.bench.data import stream
from lakebuffer.lake import rowhash
from lakebuffer.lake.fs import LakeFS
from lakebuffer.lake.rowpages import RowPages


def _median(xs: list[float]) -> float:
    return round(statistics.median(xs), 2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=512)
    ap.add_argument("--page-kb", type=int, nargs="+", default=[64, 32, 16])
    ap.add_argument("--keys", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--scans", type=int, default=7)
    ap.add_argument("--evict-cache", action="store_true")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    import duckdb
    import lance

    tmp = Path(a.dir or tempfile.mkdtemp(prefix="page_size-"))
    tables = [t.drop_columns(["run_id"]) for t in stream(a.mb * MiB)]
    schema = tables[0].schema
    res: dict = {"mb": a.mb, "rows": sum(t.num_rows for t in tables), "keys": a.keys, "rounds": a.rounds,
                 "evict_cache": a.evict_cache, "load_before": os.getloadavg(), "cpus": os.cpu_count()}
    layouts: dict[str, list[dict]] = {"old": write(tmp / "old", "old", tables, schema)}
    default = lake_writer.DATA_PAGE_BYTES
    for kb in a.page_kb:
        lake_writer.DATA_PAGE_BYTES = kb * 1024
        layouts[f"{kb}k"] = write(tmp / f"{kb}k", "new", tables, schema)
    lake_writer.DATA_PAGE_BYTES = default
    ds_lance = lance.write_dataset(pa.Table.from_batches([b for t in tables for b in t.to_batches()]), str(tmp / "lance"))
    del tables
    res["bytes"] = {lay: sum(e["bytes"] for e in es) for lay, es in layouts.items()}

    all_keys = [k for e in layouts["old"] for k in e["keys"]]
    lance_row = {k: i for i, k in enumerate(all_keys)}
    takes = {}
    for lay in layouts:
        if lay == "old":
            continue
        where = {k: (f, r) for f, e in enumerate(layouts[lay]) for r, k in enumerate(e["keys"])}
        entries = [{"path": e["path"], "bytes": e["bytes"]} for e in layouts[lay]]
        reader = RowPages(LakeFS(str(tmp / lay)), 64 * MiB)

        def take(keys: list[str], where=where, entries=entries, reader=reader) -> int:
            by_file: dict[int, tuple[list[str], list[int]]] = {}
            for k in keys:
                f, r = where[k]
                by_file.setdefault(f, ([], []))[0].append(k)
                by_file[f][1].append(r)
            got = reader.take_many([(entries[f], ks, np.array(rs)) for f, (ks, rs) in by_file.items()], COLS)
            assert not any(isinstance(t, Exception) for t in got), got
            table = pa.concat_tables(got)
            assert not len(rowhash.mismatches(table, ["key", *COLS], reader.layout(entries[0]).hashed or []))
            return table.num_rows

        takes[lay] = take
    takes["lance"] = lambda keys: ds_lance.take([lance_row[k] for k in keys], columns=COLS).num_rows
    wall: dict[str, list[float]] = {c: [] for c in takes}
    cpu: dict[str, list[float]] = {c: [] for c in takes}
    rng = random.Random(7)
    names = list(takes)
    for rnd in range(a.rounds + 1):  # round 0 reads the footers; not counted
        keys = rng.sample(all_keys, a.keys)
        for c in names[rnd % len(names):] + names[:rnd % len(names)]:
            if a.evict_cache:
                evict_cache(str(tmp / c) if c != "lance" else str(tmp / "lance"))
            t0, c0 = time.perf_counter(), time.process_time()
            assert takes[c](keys) == len(keys)
            if rnd:
                wall[c].append((time.perf_counter() - t0) * 1e3)
                cpu[c].append((time.process_time() - c0) * 1e3)
    res["take_wall_p50_ms"] = {c: _median(xs) for c, xs in wall.items()}
    res["take_cpu_p50_ms"] = {c: _median(xs) for c, xs in cpu.items()}

    con = duckdb.connect()
    for lay, es in layouts.items():
        con.register(f"t_{lay}", pds.dataset([str(tmp / lay / e["path"]) for e in es], schema=schema))
    queries = {"flat": "SELECT sum(reward), count(*) FROM t_{} WHERE policy_version >= 0",
               "payload": "SELECT sum(len(response_ids)) FROM t_{}"}
    for q, sql in queries.items():
        sw: dict[str, list[float]] = {lay: [] for lay in layouts}
        sc: dict[str, list[float]] = {lay: [] for lay in layouts}
        lays = list(layouts)
        for i in range(a.scans + 1):
            for lay in lays[i % len(lays):] + lays[:i % len(lays)]:
                t0, c0 = time.perf_counter(), time.process_time()
                con.sql(sql.format(lay)).fetchall()
                if i:
                    sw[lay].append((time.perf_counter() - t0) * 1e3)
                    sc[lay].append((time.process_time() - c0) * 1e3)
        res[f"scan_{q}_wall_ms"] = {lay: _median(xs) for lay, xs in sw.items()}
        res[f"scan_{q}_cpu_ms"] = {lay: _median(xs) for lay, xs in sc.items()}
        res[f"scan_{q}_cpu_over_old"] = {lay: round(statistics.median(xs) / statistics.median(sc["old"]), 3) for lay, xs in sc.items()}
    res["bytes_over_old"] = {lay: round(b / res["bytes"]["old"], 4) for lay, b in res["bytes"].items()}
    res["take_over_lance"] = {c: round(v / res["take_wall_p50_ms"]["lance"], 2) for c, v in res["take_wall_p50_ms"].items()}
    res["load_after"] = os.getloadavg()
    print(json.dumps(res, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
