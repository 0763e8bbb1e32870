"""Issue 23: how a cold get checks and decompresses its pages (``lake/rowpages.page_bodies``).

A 256-key get of a big lake reads ~256 compressed data pages (one per row). Each must pass its CRC and
be decompressed. Measured on the same pages in one process (the lake's layout, ``--mb`` of generated
rollouts, ``--keys`` random rows' ``response_ids`` pages, captured from ``RowPages.take_many``), the
variants alternated per round:

* ``per_page_2thr``: what the get did before: per page (header, zlib CRC, Arrow zstd) on
  two threads, each page's Python under the GIL between its native calls;
* ``headers_zlib``/``headers_isal``: headers and CRCs in the calling thread (zlib's or ISA-L's CRC-32),
  then only Arrow's zstd per page on two threads;
* ``zstandard_multi``: headers and ISA-L CRCs, then python-zstandard's ``multi_decompress_to_buffer``
  (one native call);
* ``cramjam_into``: headers and ISA-L CRCs, then cramjam's zstd ``decompress_into`` one output array,
  on two threads.

    PYTHONPATH=. .venv/bin/python benchmarks/page_bodies.py --mb 256 --rounds 40
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import struct
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks.cold_take import COLS, MiB, write
from lakebuffer.bench.data import stream
from lakebuffer.lake import pagedecode, rowpages
from lakebuffer.lake.fs import LakeFS


def capture_pages(mb: int, keys: int, seed: int) -> list[memoryview]:
    """The raw compressed data pages a ``keys``-row take of ``response_ids`` reads."""
    tmp = Path(tempfile.mkdtemp(prefix="page_bodies-"))
    tables = [t.drop_columns(["run_id"]) for t in stream(mb * MiB)]
    entries = write(tmp / "new", "new", tables, tables[0].schema)
    del tables
    where = [(f, r) for f, e in enumerate(entries) for r in range(e["rows"])]
    picked = random.Random(seed).sample(where, keys)
    by_file: dict[int, list[int]] = {}
    for f, r in picked:
        by_file.setdefault(f, []).append(r)
    got: list = []
    real = rowpages.page_bodies

    def keep(jobs: list, plans: list) -> dict:
        got.extend(raw for i, n, raw in jobs if plans[i].codecs[n] != rowpages.RAW)
        return real(jobs, plans)

    rowpages.page_bodies = keep
    try:
        reader = rowpages.RowPages(LakeFS(str(tmp / "new")), 64 * MiB)
        reader.take_many([({"path": entries[f]["path"], "bytes": 0}, [""] * len(rs), np.array(sorted(rs)))
                          for f, rs in by_file.items()], COLS)
    finally:
        rowpages.page_bodies = real
        shutil.rmtree(tmp, ignore_errors=True)  # the pages are copied out (``got``): the files can go
    return got


def _two_threads(fn: Callable[[list[int]], None], n: int) -> None:
    parts = [list(range(0, n, 2)), list(range(1, n, 2))]
    t = threading.Thread(target=fn, args=(parts[1],))
    t.start()
    fn(parts[0])
    t.join()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--keys", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    import cramjam
    import zstandard
    from fastparquet.cencoding import NumpyIO, ThriftObject
    from isal import isal_zlib

    pages = capture_pages(a.mb, a.keys, 3)
    codec = pagedecode._codec("zstd")

    def headers(crc: Callable) -> list[tuple[np.ndarray, int]]:
        out = []
        for raw in pages:
            buf = np.frombuffer(raw, np.uint8)
            io = NumpyIO(buf)
            ph = ThriftObject.from_buffer(io, "PageHeader")
            body = buf[io.tell():io.tell() + ph.compressed_page_size]
            if (crc(body) & 0xFFFFFFFF) != (ph.crc & 0xFFFFFFFF):
                raise AssertionError("CRC")
            out.append((body, ph.uncompressed_page_size))
        return out

    def page_body_zlib(raw: memoryview) -> tuple:
        """What a page cost before: header, zlib's CRC and Arrow's zstd, all in the thread that has it."""
        buf = np.frombuffer(raw, np.uint8)
        io = NumpyIO(buf)
        ph = ThriftObject.from_buffer(io, "PageHeader")
        body = buf[io.tell():io.tell() + ph.compressed_page_size]
        if (zlib.crc32(body) & 0xFFFFFFFF) != (ph.crc & 0xFFFFFFFF):
            raise AssertionError("CRC")
        return ph, np.frombuffer(codec.decompress(body, decompressed_size=ph.uncompressed_page_size), np.uint8)

    def per_page_2thr() -> list:
        out: list = [None] * len(pages)

        def run(ix: list[int]) -> None:
            for k in ix:
                out[k] = page_body_zlib(pages[k])
        _two_threads(run, len(pages))
        return out

    def arrow_2thr(crc: Callable) -> Callable[[], list]:
        def go() -> list:
            hs = headers(crc)
            out: list = [None] * len(hs)

            def run(ix: list[int]) -> None:
                for k in ix:
                    out[k] = codec.decompress(hs[k][0], decompressed_size=hs[k][1])
            _two_threads(run, len(hs))
            return out
        return go

    def zstandard_multi() -> list:
        hs = headers(isal_zlib.crc32)
        sizes = struct.pack(f"={len(hs)}Q", *[u for _b, u in hs])
        got = zstandard.ZstdDecompressor().multi_decompress_to_buffer([b for b, _u in hs], decompressed_sizes=sizes)
        return [got[k] for k in range(len(hs))]

    def cramjam_into() -> list:
        hs = headers(isal_zlib.crc32)
        ends = np.cumsum([u for _b, u in hs]).tolist()
        out = np.empty(ends[-1], np.uint8)
        starts = [0, *ends[:-1]]

        def run(ix: list[int]) -> None:
            for k in ix:
                cramjam.zstd.decompress_into(hs[k][0], out[starts[k]:ends[k]])
        _two_threads(run, len(hs))
        return [out[s:e] for s, e in zip(starts, ends)]

    variants = {"per_page_2thr": per_page_2thr, "headers_zlib": arrow_2thr(zlib.crc32),
                "headers_isal": arrow_2thr(isal_zlib.crc32), "zstandard_multi": zstandard_multi,
                "cramjam_into": cramjam_into}
    want = [bytes(b) for _h, b in per_page_2thr()]
    for name, fn in variants.items():  # every variant returns the same bytes
        assert [bytes(memoryview(b)) for b in (x[1] if name == "per_page_2thr" else x for x in fn())] == want, name
    times: dict[str, list[float]] = {k: [] for k in variants}
    names = list(variants)
    for r in range(a.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            variants[name]()
            times[name].append((time.perf_counter() - t0) * 1e3)
    res = {"pages": len(pages), "compressed_bytes": sum(len(p) for p in pages), "rounds": a.rounds,
           "cpus": os.cpu_count(), "load": os.getloadavg(),
           "p50_ms": {k: round(statistics.median(v), 2) for k, v in times.items()}}
    base = res["p50_ms"]["per_page_2thr"]
    res["over_per_page"] = {k: round(v / base, 2) for k, v in res["p50_ms"].items()}
    print(json.dumps(res, indent=1))
    if a.out:
        a.out.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
