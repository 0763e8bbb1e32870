"""Would plain (uncompressed) token-id pages make a cold take cheaper? Reads and scans, side by side.

The cold take reads one zstd page (32 KiB before compression) per asked row and column, ~2.6x the disk
bytes of a Lance take of the same rows. An uncompressed PLAIN list page has its row values at an offset
its levels give, so a take could read each row's values alone: a page's head (header + levels) first,
then the row. This probe rewrites a built ``cold_scale.py`` lake with ``response_ids`` uncompressed
(everything else as the writer writes it) and, with the page cache dropped before each trial, times
the two read patterns of the same random rows (each row's digest bytes included, as a take reads them):
now (digest + whole page) against two rounds (digest + 4 KiB head, then the row's values), plus a Lance
take of as many random rows; then DuckDB scans of both copies from the page cache. It counts the disk's
bytes (``/proc/self/io``). Figures and the end-to-end check: BENCHMARKS.md, "#23", tenth session.

    PYTHONPATH=. python benchmarks/plain_list_reads.py --root /work/coldscale-data --mb 2048
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cold_bytes_vs_lance import read_bytes  # noqa: E402 - the disk's bytes of this process
from cold_scale import evict_cache  # noqa: E402 - a directory's pages out of the page cache

COLUMN = "response_ids"
HEAD = 4096


def rewrite(src: list[str], dst: str) -> list[str]:
    """Each file again, ``COLUMN`` uncompressed, row groups as they were."""
    import pyarrow.parquet as pq

    from lakebuffer.lake.writer import parquet_options

    out = []
    for p in src:
        f = pq.ParquetFile(p)
        opts = parquet_options(f.schema_arrow)
        leaf = f"{COLUMN}.list.element"
        opts["compression"] = {**opts["compression"], leaf: "none"}
        opts["compression_level"] = {k: v for k, v in opts["compression_level"].items() if k != leaf}
        q = os.path.join(dst, os.path.basename(p))
        with pq.ParquetWriter(q, f.schema_arrow, **opts) as w:
            for g in range(f.num_row_groups):
                w.write_table(f.read_row_group(g), row_group_size=f.metadata.row_group(g).num_rows)
        out.append(q)
    return out


def layout(p: str):
    from lakebuffer.lake.pagelayout import TAIL_BYTES, parse_layout

    size = os.path.getsize(p)
    with open(p, "rb") as f:
        f.seek(max(0, size - TAIL_BYTES))
        tail = f.read()

        def rd(a: int, b: int) -> bytes:
            f.seek(a)
            return f.read(b - a)

        lay = parse_layout(tail, size, rd)
    lay.decode_pages()
    return lay


def spans(lay, row: int) -> tuple[tuple[int, int], tuple[int, int], int]:
    """(the row's digest bytes, its page of ``COLUMN``, the row within that page)."""
    from lakebuffer.lake.rowhash import HASH_COLUMN
    from lakebuffer.lake.rowplan import direct_starts

    g = int(lay.row_starts.searchsorted(row, "right") - 1)
    r = row - int(lay.row_starts[g])
    first, off, size = lay.chunks[g][COLUMN].pages()
    p = int(first.searchsorted(r, "right") - 1)
    width = lay.leaves[HASH_COLUMN].width
    hfirst, _o, _s = lay.chunks[g][HASH_COLUMN].pages()
    hp = int(hfirst.searchsorted(r, "right") - 1)
    starts = direct_starts(lay, [g])
    assert starts is not None
    return (int(starts[g][hp] + (r - hfirst[hp]) * width), width), (int(off[p]), int(size[p])), r - int(first[p])


def _announce_and_read(reqs: list[tuple[int, int, int]]) -> list[bytes]:
    for fd, a, n in reqs:
        os.posix_fadvise(fd, a, n, os.POSIX_FADV_WILLNEED)
    return [os.pread(fd, n, a) for fd, a, n in reqs]


def whole_pages(files: list[str], lays: list, picks: list[tuple[int, int]]) -> int:
    fds = {i: os.open(files[i], os.O_RDONLY) for i in {i for i, _r in picks}}
    try:
        reqs = []
        for i, row in picks:
            dig, page, _local = spans(lays[i], row)
            reqs += [(fds[i], *dig), (fds[i], *page)]
        return sum(map(len, _announce_and_read(reqs)))
    finally:
        for fd in fds.values():
            os.close(fd)


def heads_then_rows(files: list[str], lays: list, picks: list[tuple[int, int]]) -> int:
    from fastparquet.cencoding import NumpyIO, ThriftObject

    from lakebuffer.lake.pagedecode import _levels

    fds = {i: os.open(files[i], os.O_RDONLY) for i in {i for i, _r in picks}}
    try:
        first, where = [], []
        for i, row in picks:
            dig, page, local = spans(lays[i], row)
            first += [(fds[i], *dig), (fds[i], page[0], min(HEAD, page[1]))]
            where.append((fds[i], page, local))
        heads = _announce_and_read(first)[1::2]
        second = []
        for (fd, page, local), h in zip(where, heads):
            buf = np.frombuffer(h, np.uint8)
            io = NumpyIO(buf)
            ph = ThriftObject.from_buffer(io, "PageHeader")
            hl = io.tell()
            count = ph.data_page_header.num_values
            rep, pos = _levels(buf[hl:], 0, count, 1)
            pos += 4 + int.from_bytes(buf[hl + pos:hl + pos + 4].tobytes(), "little")  # def levels: one run
            assert rep is not None
            rows = np.flatnonzero(rep == 0)
            a = int(rows[local])
            b = int(rows[local + 1]) if local + 1 < len(rows) else count
            second.append((fd, page[0] + hl + pos + 4 * a, 4 * (b - a)))
        return sum(map(len, heads)) + sum(map(len, _announce_and_read(second)))
    finally:
        for fd in fds.values():
            os.close(fd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, required=True)
    ap.add_argument("--mb", type=int, default=2048)
    ap.add_argument("--rows", type=int, default=191, help="rows a trial (the cold rows of a 256-row sample)")
    ap.add_argument("--trials", type=int, default=10)
    a = ap.parse_args()
    import duckdb
    import lance

    base = a.root / "local" / f"{a.mb}mb"
    src = sorted(glob.glob(str(base / "lake" / "**" / "*.parquet"), recursive=True))
    tmp = tempfile.mkdtemp(prefix="plain-lists-", dir=a.root)
    try:
        plain = rewrite(src, tmp)
        zl, pl = [layout(p) for p in src], [layout(p) for p in plain]
        ds = lance.dataset(str(base / "data.lance"))
        rng = random.Random(7)
        got: dict[str, list[tuple[float, float]]] = {"zstd pages, whole": [], "plain pages, head then row": [], "Lance take": []}
        for t in range(a.trials):
            picks = []
            for _ in range(a.rows):
                i = rng.randrange(len(src))
                picks.append((i, rng.randrange(int(zl[i].row_starts[-1]))))
            lrows = sorted(rng.sample(range(ds.count_rows()), a.rows))
            ops = [("zstd pages, whole", lambda picks=picks: whole_pages(src, zl, picks)),
                   ("plain pages, head then row", lambda picks=picks: heads_then_rows(plain, pl, picks)),
                   ("Lance take", lambda lrows=lrows: ds.take(lrows, columns=[COLUMN]))]
            if t % 2:
                ops.reverse()
            for name, fn in ops:
                for folder in (base / "lake", tmp, base / "data.lance"):
                    evict_cache(str(folder))
                b0, t0 = read_bytes(), time.perf_counter()
                fn()
                got[name].append(((time.perf_counter() - t0) * 1e3, (read_bytes() - b0) / 1e6))
        con = duckdb.connect()
        scans = {}
        for label, files in (("zstd", src), ("plain", plain)):
            for p in files:  # into the page cache: the scans compare CPU
                with open(p, "rb") as f:
                    while f.read(1 << 24):
                        pass
            q = f"SELECT sum(len({COLUMN})), sum(list_sum({COLUMN})) FROM read_parquet({files})"
            ts = []
            for _ in range(3):
                t0 = time.perf_counter()
                con.execute(q).fetchall()
                ts.append(time.perf_counter() - t0)
            scans[label] = round(min(ts), 3)
        out = {"rows": a.rows, "trials": a.trials, "lake_bytes": {"zstd": sum(map(os.path.getsize, src)),
                                                                   "plain": sum(map(os.path.getsize, plain))},
               "p50_ms": {k: round(statistics.median(x for x, _ in v), 1) for k, v in got.items()},
               "disk_mb_p50": {k: round(statistics.median(y for _, y in v), 2) for k, v in got.items()},
               f"duckdb_scan_{COLUMN}_s": scans, "load": os.getloadavg()}
        print(json.dumps(out, indent=1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
