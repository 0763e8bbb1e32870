"""Issue 23: which reader and Parquet layout make a random cold ``get`` cost about a page per column.

The same generated rollouts (``lakebuffer.bench.data``, ``--mb`` of Arrow data, the lake's file schema)
are written as 32 MiB files in three layouts, plus a Lance dataset as the floor:

* ``old``: the lake's files before #23 (32 MiB row groups, 1 MiB pages, no page index);
* ``new``: the lake's files since #23 (``lake/writer.py``: the same row groups, 64 KiB pages, page
  index, rows by key, the ``_lb_hash`` digest column);
* ``smallrg``: the old settings with ~1 MiB row groups (candidate b: row groups sized for random access).

Then, over ``--rounds`` rounds of ``--keys`` random rows each (every candidate reads the same rows in a
round, the order of candidates rotating), the time to return ``response_ids`` of those rows:

* ``old_pyarrow``: today's path without its sha256 (``read_row_group`` + take per row group);
* ``new_datafusion``: ``lake/pages.PageReader.take_many`` (DataFusion 55, ``key IN``, filter pushdown,
  page index, all files in one plan), digests checked (candidate a, the one chosen);
  ``new_datafusion_per_file``: the same, one query per file in turn;
* ``new_rowpages``: ``lake/rowpages.RowPages.take_many`` (what a cold ``get`` runs first since #23's
  row reader: each row's pages by (file, row) through the offset index, CRC-checked, decoded with
  fastparquet's decoders), digests checked in one pass as ``PageReader`` does;
* ``new_pyarrow``: the old path on the new files (pyarrow ignores the page index);
* ``smallrg_pyarrow``: the old path on ~1 MiB row groups (b);
* ``smallrg_coalesced``: one pyarrow dataset scan of the wanted row groups of each file with
  ``pre_buffer`` (coalesced ranged reads) on threads (c);
* ``lance_take``: ``LanceDataset.take`` of the same rows.

Also: the bytes of each layout, the time to hash the rows (``rowhash``), and scans (DuckDB over a pyarrow
dataset of each layout: an aggregate over a flat column, one over ``response_ids``), old vs new, so a
scan that got slower shows. Ratios in one run are what to compare (the machine is shared).

    PYTHONPATH=. .venv/bin/python benchmarks/cold_take.py --mb 512 --rounds 10 --out benchmarks/cold_take.json
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
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from lakebuffer.bench.data import stream
from lakebuffer.lake import rowhash
from lakebuffer.lake.fs import LakeFS
from lakebuffer.lake.pages import PageReader
from lakebuffer.lake.rowpages import RowPages
from lakebuffer.lake.writer import by_key, parquet_options

MiB = 2**20
COLS = ["response_ids"]


def _old_options(schema: pa.Schema) -> dict:
    opts = parquet_options(schema)
    opts.pop("data_page_size")
    opts.pop("write_page_index")
    return opts


def write(root: Path, layout: str, tables: list[pa.Table], schema: pa.Schema) -> list[dict]:
    """32 MiB files of ``layout``; entries (path, bytes, rows, key of each row)."""
    root.mkdir(parents=True, exist_ok=True)
    new = layout == "new"
    fschema = rowhash.schema_with_hash(schema) if new else schema
    opts = parquet_options(fschema) if new else _old_options(schema)
    group_rows = None
    entries: list[dict] = []
    writer = None
    pending: list[pa.Table] = []
    pending_bytes = 0

    def flush() -> None:
        nonlocal writer, pending, pending_bytes
        if not pending:
            return
        t = pa.concat_tables(pending).combine_chunks()
        pending, pending_bytes = [], 0
        if new:
            t = by_key(t)
            t = t.append_column(fschema.field(rowhash.HASH_COLUMN), rowhash.hash_column(t, schema.names))
        if writer is None:
            path = root / f"part-{len(entries):04d}.parquet"
            writer = pq.ParquetWriter(str(path), fschema, **opts)
            entries.append({"path": path.name, "keys": [], "rows": 0})
        rg = group_rows or t.num_rows
        writer.write_table(t, row_group_size=rg)
        entries[-1]["keys"].extend(t.column("key").to_pylist())
        entries[-1]["rows"] += t.num_rows
        if os.path.getsize(root / entries[-1]["path"]) >= 32 * MiB:
            writer.close()
            writer = None

    if layout == "smallrg":
        per_row = sum(t.nbytes for t in tables) / sum(t.num_rows for t in tables)
        group_rows = max(1, int(MiB / per_row))
    for t in tables:
        pending.append(t)
        pending_bytes += t.nbytes
        if pending_bytes >= 32 * MiB:
            flush()
    flush()
    if writer is not None:
        writer.close()
    for e in entries:
        e["bytes"] = os.path.getsize(root / e["path"])
    return entries


def pyarrow_take(root: Path, entries: list[dict], picks: list[tuple[int, int]]) -> pa.Table:
    """Today's cold path (without the sha256): the row groups that hold the rows, then a take."""
    out = []
    by_file: dict[int, list[int]] = {}
    for f, r in picks:
        by_file.setdefault(f, []).append(r)
    for f, rows in by_file.items():
        pf = pq.ParquetFile(str(root / entries[f]["path"]), page_checksum_verification=True)
        md = pf.metadata
        starts = np.cumsum([0] + [md.row_group(g).num_rows for g in range(md.num_row_groups)])
        rows_a = np.array(rows)
        group = np.searchsorted(starts, rows_a, side="right") - 1
        for g in np.unique(group).tolist():
            hit = rows_a[group == g]
            out.append(pf.read_row_group(g, columns=COLS, use_threads=False).take(pa.array(hit - starts[g])))
    return pa.concat_tables(out)


def coalesced_take(root: Path, entries: list[dict], picks: list[tuple[int, int]]) -> pa.Table:
    """Candidate c: per file, one scan of only the wanted row groups, ranged reads coalesced (pre_buffer)."""
    fmt = pds.ParquetFileFormat(default_fragment_scan_options=pds.ParquetFragmentScanOptions(pre_buffer=True))
    out = []
    by_file: dict[int, list[int]] = {}
    for f, r in picks:
        by_file.setdefault(f, []).append(r)
    for f, rows in by_file.items():
        frag = fmt.make_fragment(str(root / entries[f]["path"]), filesystem=pafs.LocalFileSystem())
        md = frag.metadata
        starts = np.cumsum([0] + [md.row_group(g).num_rows for g in range(md.num_row_groups)])
        rows_a = np.array(rows)
        group = np.searchsorted(starts, rows_a, side="right") - 1
        gs = np.unique(group).tolist()
        t = frag.subset(row_group_ids=gs).to_table(columns=COLS, use_threads=True)
        offs = np.cumsum([0] + [md.row_group(g).num_rows for g in gs])
        idx = [int(offs[gs.index(g)] + r - starts[g]) for g, r in zip(group.tolist(), rows_a.tolist())]
        out.append(t.take(pa.array(idx)))
    return pa.concat_tables(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=512)
    ap.add_argument("--keys", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--page-kb", type=int, default=None, help="data page size of the new layout (default: the writer's)")
    a = ap.parse_args()
    if a.page_kb:
        import lakebuffer.lake.writer as lake_writer

        lake_writer.DATA_PAGE_BYTES = a.page_kb * 1024
    import duckdb
    import lance

    tmp = Path(a.dir or tempfile.mkdtemp(prefix="cold_take-"))
    tables = [t.drop_columns(["run_id"]) for t in stream(a.mb * MiB)]
    schema = tables[0].schema
    logical = sum(t.nbytes for t in tables)
    res: dict = {"mb": a.mb, "rows": sum(t.num_rows for t in tables), "logical_bytes": logical, "keys": a.keys,
                 "rounds": a.rounds, "load_before": os.getloadavg()}

    t0 = time.perf_counter()
    for t in tables:
        rowhash.hash_column(t, schema.names)
    res["hash_mb_s"] = logical / MiB / (time.perf_counter() - t0)
    layouts = {}
    for layout in ("old", "new", "smallrg"):
        t0 = time.perf_counter()
        layouts[layout] = write(tmp / layout, layout, tables, schema)
        res[f"write_s_{layout}"] = time.perf_counter() - t0
        res[f"bytes_{layout}"] = sum(e["bytes"] for e in layouts[layout])
    t0 = time.perf_counter()
    ds_lance = lance.write_dataset(pa.Table.from_batches([b for t in tables for b in t.to_batches()]), str(tmp / "lance"))
    res["write_s_lance"] = time.perf_counter() - t0
    del tables

    # the same rows by (file, row) in every parquet layout: key -> position per layout
    old = layouts["old"]
    all_keys = [(f, r, k) for f, e in enumerate(old) for r, k in enumerate(e["keys"])]
    where = {lay: {k: (f, r) for f, e in enumerate(es) for r, k in enumerate(e["keys"])} for lay, es in layouts.items()}
    lance_row = {k: i for i, (_f, _r, k) in enumerate(all_keys)}
    store = LakeFS(str(tmp / "new"))
    reader = PageReader(store)
    new_entries = [{"path": e["path"], "bytes": e["bytes"]} for e in layouts["new"]]

    def run_df(keys: list[str]) -> int:
        by_file: dict[int, list[str]] = {}
        for k in keys:
            by_file.setdefault(where["new"][k][0], []).append(k)
        return sum(reader.take(new_entries[f], ks, COLS).num_rows for f, ks in by_file.items())

    def run_df_many(keys: list[str]) -> int:
        by_file: dict[int, list[str]] = {}
        for k in keys:
            by_file.setdefault(where["new"][k][0], []).append(k)
        got = reader.take_many([(new_entries[f], ks) for f, ks in by_file.items()], COLS)
        return sum(t.num_rows for t in got)

    rows_reader = RowPages(store, 64 * MiB)

    def run_rowpages(keys: list[str]) -> int:
        by_file: dict[int, tuple[list[str], list[int]]] = {}
        for k in keys:
            f, r = where["new"][k]
            by_file.setdefault(f, ([], []))[0].append(k)
            by_file[f][1].append(r)
        got = rows_reader.take_many([(new_entries[f], ks, np.array(rs)) for f, (ks, rs) in by_file.items()], COLS)
        assert not any(isinstance(t, Exception) for t in got), got
        table = pa.concat_tables(got)
        hashed = rows_reader.layout(new_entries[next(iter(by_file))]).hashed or []  # one schema: one digest layout
        assert not len(rowhash.mismatches(table, ["key", *COLS], hashed))
        return table.num_rows

    cands = {
        "new_rowpages": run_rowpages,
        "old_pyarrow": lambda ks: pyarrow_take(tmp / "old", old, [where["old"][k] for k in ks]).num_rows,
        "new_datafusion": run_df_many,
        "new_datafusion_per_file": run_df,
        "new_pyarrow": lambda ks: pyarrow_take(tmp / "new", layouts["new"], [where["new"][k] for k in ks]).num_rows,
        "smallrg_pyarrow": lambda ks: pyarrow_take(tmp / "smallrg", layouts["smallrg"], [where["smallrg"][k] for k in ks]).num_rows,
        "smallrg_coalesced": lambda ks: coalesced_take(tmp / "smallrg", layouts["smallrg"], [where["smallrg"][k] for k in ks]).num_rows,
        "lance_take": lambda ks: ds_lance.take([lance_row[k] for k in ks], columns=COLS).num_rows,
    }
    times: dict[str, list[float]] = {c: [] for c in cands}
    rng = random.Random(7)
    names = list(cands)
    for rnd in range(a.rounds + 1):  # round 0 warms footers and caches; not counted
        keys = [k for _f, _r, k in rng.sample(all_keys, a.keys)]
        order = names[rnd % len(names):] + names[:rnd % len(names)]
        for c in order:
            t0 = time.perf_counter()
            n = cands[c](keys)
            dt = time.perf_counter() - t0
            assert n == len(keys), (c, n)
            if rnd:
                times[c].append(dt * 1000)
    for c, xs in times.items():
        res[f"{c}_p50_ms"] = statistics.median(xs)
        res[f"{c}_max_ms"] = max(xs)

    # scans: DuckDB over a pyarrow dataset of each layout, old vs new alternating
    con = duckdb.connect()
    for lay in ("old", "new"):
        con.register(f"t_{lay}", pds.dataset([str(tmp / lay / e["path"]) for e in layouts[lay]], schema=schema))
    queries = {"flat": "SELECT sum(reward), count(*) FROM t_{} WHERE policy_version >= 0",
               "payload": "SELECT sum(len(response_ids)) FROM t_{}"}
    for q, sql in queries.items():
        xs: dict[str, list[float]] = {"old": [], "new": []}
        for i in range(5):
            for lay in (("old", "new") if i % 2 else ("new", "old")):
                t0 = time.perf_counter()
                con.sql(sql.format(lay)).fetchall()
                xs[lay].append((time.perf_counter() - t0) * 1000)
        for lay in xs:
            res[f"scan_{q}_{lay}_ms"] = statistics.median(xs[lay][1:])
    res["load_after"] = os.getloadavg()
    print(json.dumps(res, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
