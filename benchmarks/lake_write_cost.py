"""Issue 23: what the new lake file layout costs the writer (a snapshot's CPU) and scans, A/B in one process.

The same ``--mb`` of generated rollouts, in ~32 MiB row groups, written ``--rounds`` times each way:
``old`` (before #23), ``pagesNk`` (the writer's data pages), ``pagesNk+index`` (+ page index), ``new``
(+ the ``_lb_hash`` digest column, what ``lake/writer.py`` writes now); and the digests alone. Then
DuckDB scans of the ``old`` and ``new`` files (a pyarrow dataset with the rows' schema, as the lake
views register it), alternating which goes first, ``--scans`` times each. All figures are CPU time of
the process (``time.process_time``), not wall time: on the shared machine the wall time mostly measured
the other jobs.

    PYTHONPATH=. .venv/bin/python benchmarks/lake_write_cost.py --mb 256 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import pyarrow as pa
import pyarrow.parquet as pq

from lakebuffer.bench.data import stream
from lakebuffer.lake import rowhash
from lakebuffer.lake.writer import parquet_options

MiB = 2**20


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scans", type=int, default=9)
    ap.add_argument("--page-kb", type=int, default=None, help="data page size of the new layout (default: the writer's)")
    a = ap.parse_args()
    if a.page_kb:
        import lakebuffer.lake.writer as lake_writer

        lake_writer.DATA_PAGE_BYTES = a.page_kb * 1024
    t = pa.concat_tables([t.drop_columns(["run_id"]) for t in stream(a.mb * MiB)]).combine_chunks()
    schema = t.schema
    groups = [t.slice(i, 2600) for i in range(0, t.num_rows, 2600)]
    d = tempfile.mkdtemp()
    hs = rowhash.schema_with_hash(schema)
    base = parquet_options(schema)
    old = {k: v for k, v in base.items() if k not in ("data_page_size", "write_page_index")}
    kb = base["data_page_size"] // 1024
    ways = {
        "old": (old, schema, lambda g: g),
        f"pages{kb}k": ({**old, "data_page_size": base["data_page_size"]}, schema, lambda g: g),
        f"pages{kb}k+index": (base, schema, lambda g: g),
        "new": (parquet_options(hs), hs, lambda g: g.append_column(hs.field(rowhash.HASH_COLUMN), rowhash.hash_column(g, schema.names))),
    }
    times: dict[str, list[float]] = {k: [] for k in [*ways, "digests only"]}
    sizes: dict[str, int] = {}
    for _ in range(a.rounds):
        for name, (opts, sch, prep) in ways.items():
            t0 = time.process_time()  # CPU seconds: the machine is shared, wall time mostly measures the others
            with pq.ParquetWriter(f"{d}/{name}.parquet", sch, **opts) as w:
                for g in groups:
                    w.write_table(prep(g), row_group_size=g.num_rows)
            times[name].append(time.process_time() - t0)
            sizes[name] = os.path.getsize(f"{d}/{name}.parquet")
        t0 = time.process_time()
        for g in groups:
            rowhash.hash_column(g, schema.names)
        times["digests only"].append(time.process_time() - t0)
    for name, xs in times.items():
        print(f"{name:16s} median {statistics.median(xs):6.2f} CPU s  all {[round(x, 2) for x in xs]}  bytes {sizes.get(name, '')}")
    import duckdb
    import pyarrow.dataset as pds

    con = duckdb.connect()
    for name in ("old", "new"):
        con.register(f"t_{name.replace('+', '_')}", pds.dataset(f"{d}/{name}.parquet", schema=schema))
    queries = {"flat": "SELECT sum(reward), count(*) FROM t_{} WHERE policy_version >= 0",
               "payload": "SELECT sum(len(response_ids)) FROM t_{}"}
    for q, sql in queries.items():
        xs: dict[str, list[float]] = {"old": [], "new": []}
        for i in range(a.scans):
            for name in (("old", "new") if i % 2 else ("new", "old")):
                t0 = time.process_time()  # CPU (DuckDB's threads included)
                con.sql(sql.format(name)).fetchall()
                xs[name].append((time.process_time() - t0) * 1000)
        print(f"scan {q:8s} CPU old {statistics.median(xs['old']):8.1f} ms  new {statistics.median(xs['new']):8.1f} ms  "
              f"new/old {statistics.median(xs['new']) / statistics.median(xs['old']):.2f}")
    print("load", os.getloadavg())


if __name__ == "__main__":
    main()
