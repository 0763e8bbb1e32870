"""Warm ``get`` by positioned reads (today's warm tier) against the memory-mapped reader it replaced (#24).

One process, one buffer, the same fragments: every variant answers the same 256 random keys per call,
in a rotating order, so a shared machine slows them alike. CPU time (``process_time``) is the figure
to compare on a loaded machine; wall time is reported too.

- ``take``: the warm tier's ``take`` of the rows' ``--columns`` (``pread``) against ``MappedWarm.take``,
  the reader of commit 0b8542e (before #24) kept here as the reference: a ``stat`` of each fragment's
  path per call, the fragment mapped once and verified once, zero-copy slices joined by one concat.
- ``get`` / ``sample``: the buffer's own ``get(keys, columns)`` and ``sample(256, columns=...)``, once as
  is and once with its warm tier's ``take`` swapped for ``MappedWarm.take`` (everything else the same).
- ``floor``: the copy itself, on the same rows' ``response_ids`` values: a bare loop of one ``preadv``
  per row against one mapped slice per row + one concat, and the ``fstat`` per fragment a read pays.

    PYTHONPATH=. .venv/bin/python benchmarks/warm_get_pread.py --mb 150 --calls 200 --rounds 6
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa

from lakebuffer import ReplayBuffer
from lakebuffer.bench.data import stream
from lakebuffer.bench.ipc_take import locate
from lakebuffer.tiers import Location
from lakebuffer.tiers.base import gather
from lakebuffer.tiers.wal import _FOOTER


class MappedWarm:
    """The warm tier's read path before #24 (memory maps), for reference: not safe against truncation."""

    def __init__(self, warm) -> None:
        self.dir = warm._dir
        self.maps: dict[int, tuple] = {}

    def mapped(self, f: int) -> tuple:
        st = os.stat(f"{self.dir}/{f:016d}.arrow")  # the old per-call check: the path's (size, mtime)
        sig = (st.st_size, st.st_mtime_ns)
        m = self.maps.get(f)
        if m is not None and m[0] == sig:
            return m
        buf = pa.memory_map(f"{self.dir}/{f:016d}.arrow").read_buffer()
        table = pa.ipc.open_file(pa.BufferReader(buf.slice(0, buf.size - _FOOTER.size))).read_all()
        batches = table.to_batches()
        starts = np.zeros(len(batches) + 1, np.int64)
        np.cumsum([b.num_rows for b in batches], out=starts[1:])
        m = self.maps[f] = (sig, table, batches, starts)  # (the CRC32C check on first map is not timed here)
        return m

    def take(self, where: Location, columns: list[str]) -> pa.Table:
        uniq, inv = np.unique(where.part, return_inverse=True)
        maps = [self.mapped(f) for f in uniq.tolist()]
        rows = where.row.astype(np.int64)
        n_rows = np.array([m[3][-1] for m in maps], np.int64)
        if (rows < 0).any() or (rows >= n_rows[inv]).any():
            raise IndexError("row past its fragment")
        single = all(len(m[2]) == 1 for m in maps)
        return gather([m[2][0] for m in maps] if single else [m[1] for m in maps], inv, rows, columns)


def _floor(warm, wheres: list[Location], rounds: int) -> dict:
    """The copy alone: per row one ``preadv`` of its ``response_ids`` values vs one mapped slice (+ concat)."""
    ci = warm.schema.get_field_index("response_ids")
    frags = sorted({f for w in wheres for f in w.part.tolist()})
    opens = {f: warm.opened(f) for f in frags}
    maps = {f: MappedWarm(warm).mapped(f)[2][0].column(ci) for f in frags}
    plans = []
    for w in wheres:
        fds, pos, n = [], [], []
        for f, r in zip(w.part.tolist(), w.row.tolist()):
            node = opens[f].layout.batches[0][ci]
            offs = node.cached[1].view(np.int32)
            fds.append(opens[f].fd)
            pos.append(node.children[0].buffers[1][0] + int(offs[r]) * 4)
            n.append(int(offs[r + 1] - offs[r]) * 4)
        plans.append((w, fds, pos, n))

    def preadv_loop() -> None:
        for _, fds, pos, n in plans:
            out = np.empty(sum(n), np.uint8)
            view, at = memoryview(out), 0
            for fd, p, k in zip(fds, pos, n):
                os.preadv(fd, [view[at : at + k]], p)
                at += k

    def mapped_slices() -> None:
        for w, *_ in plans:
            pa.concat_arrays([maps[f].slice(r, 1) for f, r in zip(w.part.tolist(), w.row.tolist())])

    def fstat_per_fragment() -> None:
        for w, *_ in plans:
            for f in np.unique(w.part).tolist():
                os.fstat(opens[f].fd)

    def stat_per_fragment() -> None:
        for w, *_ in plans:
            for f in np.unique(w.part).tolist():
                os.stat(f"{warm._dir}/{f:016d}.arrow")

    fns = {"preadv_per_row": preadv_loop, "mapped_slice_per_row_concat": mapped_slices,
           "fstat_per_fragment": fstat_per_fragment, "path_stat_per_fragment": stat_per_fragment}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(rounds):
        names = list(fns)[r % len(fns):] + list(fns)[: r % len(fns)]
        for name in names:
            c0 = time.process_time()
            fns[name]()
            cpu[name].append((time.process_time() - c0) / len(plans) * 1e3)
    return {k: {"cpu_ms_per_call_median": statistics.median(v), "rounds": [round(x, 4) for x in v]} for k, v in cpu.items()}


def _rounds(variants: dict[str, Callable[[int], None]], calls: int, rounds: int) -> dict:
    """Each round runs every variant over the same ``calls`` key sets, in a rotating order."""
    cpu: dict[str, list[float]] = {k: [] for k in variants}
    wall: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(rounds):
        names = list(variants)[r % len(variants):] + list(variants)[: r % len(variants)]
        for name in names:
            c0, t0 = time.process_time(), time.perf_counter()
            for i in range(calls):
                variants[name](i)
            cpu[name].append((time.process_time() - c0) / calls * 1e3)
            wall[name].append((time.perf_counter() - t0) / calls * 1e3)
    return {k: {"cpu_ms_median": statistics.median(cpu[k]), "wall_ms_median": statistics.median(wall[k]),
                "cpu_ms_rounds": [round(x, 4) for x in cpu[k]]} for k in variants}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=150, help="payload pushed (bench --quick: 150)")
    ap.add_argument("--budget-mb", type=int, default=8)
    ap.add_argument("--calls", type=int, default=200, help="calls per variant per round")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--keys", type=int, default=256)
    ap.add_argument("--columns", default="response_ids", help="comma-separated; 'all' for every column")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    root = Path(a.dir or tempfile.mkdtemp(prefix="warm-get-pread-"))
    res: dict = {"args": vars(a), "load_at_start": os.getloadavg()}
    buf = ReplayBuffer.open(root / "buf", memory_limit_mb=a.budget_mb, snapshot_interval_s=None, run_id="bench")
    try:
        keys = []
        for t in stream(a.mb << 20):
            keys.append(buf.push(t.drop_columns(["run_id", "key"])))
        buf.flush()
        buf.evict_all()
        keys = pa.concat_arrays(keys).to_pylist()
        warm = buf._state.warm
        cols = list(buf.schema.names) if a.columns == "all" else a.columns.split(",")
        res["data"] = {"rows": len(keys), "fragments": len(warm.fragment_ids()), "columns": cols}
        rng = np.random.default_rng(0)
        asked = [[keys[i] for i in rng.choice(len(keys), a.keys, replace=False)] for _ in range(a.calls)]
        wheres = [locate(buf, ks) for ks in asked]
        mapped = MappedWarm(warm)
        real_take = warm.take
        for w in wheres[:10]:  # both readers give the same rows (and warm every map / open file)
            if not real_take(w, cols).equals(mapped.take(w, cols)):
                raise RuntimeError("the mapped reader and the warm tier disagree")
        for w in wheres:
            mapped.take(w, cols)
            real_take(w, cols)

        def with_mapped(fn: Callable[[int], None]) -> Callable[[int], None]:
            def run(i: int) -> None:
                warm.take = mapped.take
                try:
                    fn(i)
                finally:
                    del warm.take  # back to the class's method
            return run

        def get(i: int) -> None:
            buf.get(asked[i], cols)

        def sample(i: int) -> None:
            buf.sample(a.keys, columns=cols, seed=i)

        variants = {
            "take_pread": lambda i: real_take(wheres[i], cols),
            "take_mmap": lambda i: mapped.take(wheres[i], cols),
            "get_pread": get,
            "get_mmap": with_mapped(get),
            "sample_pread": sample,
            "sample_mmap": with_mapped(sample),
        }
        for i in range(3):  # the first sample registers the catalog's views
            sample(i)
        res["calls"] = _rounds(variants, a.calls, a.rounds)
        c = res["calls"]
        res["ratio_cpu"] = {k: c[f"{k}_pread"]["cpu_ms_median"] / c[f"{k}_mmap"]["cpu_ms_median"] for k in ("take", "get", "sample")}
        res["ratio_wall"] = {k: c[f"{k}_pread"]["wall_ms_median"] / c[f"{k}_mmap"]["wall_ms_median"] for k in ("take", "get", "sample")}
        if "response_ids" in cols:
            res["floor"] = _floor(warm, wheres, a.rounds)
        res["load_at_end"] = os.getloadavg()
    finally:
        buf.close()
    print(json.dumps(res, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
