"""Issue 17, step 1: which warm-tier format serves ``get`` fastest, measured side by side in one run.

Builds one real buffer (today's Lance 2.0 warm tier) at 16x its budget, then writes the very same
warm fragments again as (b) Lance 2.1 fragments, (c) Arrow IPC files, one per fragment, in the WAL's
segment format (CRC32C footer) and (d) Arrow IPC files of 8 fragments each. Every variant answers
``get`` of 256 uniformly drawn keys' ``response_ids`` the way the buffer would: RocksDB index
lookup -> (fragment, row), a per-call verification check (stat of each file touched, as warm.py's
verify-once does), then the format's random ``take``. ``ref_ipc_take`` is the issue's yardstick: a
memory-mapped Arrow IPC ``take`` of the same rows with no lookup and no check.

The variants run interleaved (round r calls every variant once with the same keys, in a rotating
order) so a machine shared with other jobs slows them alike; p50/p99 are over all calls and the
per-round p50s' median is reported too. Write CPU per GB of each format is measured while writing.

    .venv/bin/python benchmarks/warm_get.py --gb 2 --budget-mb 128 --calls 240 --out benchmarks/warm_get_ipc.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa

from lakebuffer import ReplayBuffer
from lakebuffer.bench.data import stream
from lakebuffer.bench.ipc_take import IpcFiles
from lakebuffer.bench.ipc_take import locate as locate_warm
from lakebuffer.bench.scenarios import ingest_cpu
from lakebuffer.tiers import Location
from lakebuffer.tiers.wal import WriteAheadLog

COLS = ["response_ids"]
N_KEYS = 256
CACHE = 16 << 20  # the warm tier's Lance metadata cache today


def cpu() -> float:
    t = os.times()
    return t.user + t.system


def lance_take(ds: lance.LanceDataset, where: Location, cols: list[str]) -> pa.Table:
    addresses = (where.part << np.int64(32)) | where.row
    return ds._take_rows(pa.array(addresses, pa.uint64()), columns=cols)


def stat_files(paths: list[Path]) -> None:
    for p in paths:
        os.stat(p)


def ingest_trials(root: Path, mb: int, budget_mb: int, trials: int) -> dict:
    """Process CPU per GB pushed vs a raw Arrow IPC write of the same batches, interleaved trials
    (``lakebuffer bench --scenario ingest_cpu`` runs the same trials)."""
    tables = [t.drop_columns(["run_id", "key"]) for t in stream(mb << 20)]
    res = ingest_cpu.trials(tables, root, budget_mb, trials, say=print)
    res["median"]["ratio"] = res["median"]["cpu_ratio"]
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--budget-mb", type=int, default=128)
    ap.add_argument("--calls", type=int, default=240)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--ingest-mb", type=int, default=512)
    ap.add_argument("--ingest-trials", type=int, default=5)
    ap.add_argument("--merged", action="store_true", help="also (d): IPC files of 8 fragments each")
    a = ap.parse_args()
    root = Path(a.dir or tempfile.mkdtemp(prefix="warm-get-"))
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    res: dict = {"gb": a.gb, "budget_mb": a.budget_mb, "calls_per_variant": a.calls, "load_at_start": os.getloadavg()}

    # --- (a) the real buffer, today's warm tier -------------------------------------------------
    buf = ReplayBuffer.open(root / "buf", memory_limit_mb=a.budget_mb, snapshot_interval_s=None, run_id="bench")
    c0, t0, nbytes, keys = cpu(), time.perf_counter(), 0, []
    for t in stream(int(a.gb * 2**30)):
        keys.append(buf.push(t.drop_columns(["run_id", "key"])))
        nbytes += t.nbytes
    buf.flush()
    buf.evict_all()
    res["buffer_ingest"] = {"gb": nbytes / 2**30, "wall_s": time.perf_counter() - t0, "cpu_s_per_gb": (cpu() - c0) / (nbytes / 2**30)}
    keys = pa.concat_arrays(keys).to_numpy(zero_copy_only=False)
    s = buf._state
    frags = s.warm.fragment_ids()
    res["fragments"] = len(frags)
    print(f"built buffer: {nbytes / 2**30:.2f} GB, {len(frags)} warm fragments, {res['buffer_ingest']}", flush=True)

    # --- (b) Lance 2.1, (c) IPC per fragment, (d) IPC 8 fragments per file ----------------------
    d21, dipc, dmerged = root / "l21.lance", root / "ipc", root / "ipc8"
    ipc_wal, merged_wal = WriteAheadLog(dipc), WriteAheadLog(dmerged)
    map21: dict[int, int] = {}
    map20: dict[int, int] = {}
    merged_paths: dict[int, Path] = {}
    merged_first: dict[int, int] = {}
    write_cpu = {"lance20": 0.0, "lance21": 0.0, "ipc": 0.0}
    ds21 = ds20 = None
    group: list[tuple[int, pa.Table]] = []

    def flush_group() -> None:
        gid = group[0][0]
        first = 0
        for f, t in group:
            merged_paths[f], merged_first[f] = merged_wal.segment_path(gid), first
            first += t.num_rows
        merged_wal.write(gid, pa.concat_tables([t for _, t in group]).combine_chunks())
        group.clear()

    d20 = root / "l20.lance"
    for f in frags:
        t = s.warm.read(f)
        c = cpu()
        ds21 = lance.write_dataset(t, str(d21), mode="append" if ds21 else "create", max_rows_per_file=t.num_rows,
                                   data_storage_version="2.1")
        write_cpu["lance21"] += cpu() - c
        map21[f] = max(x.fragment_id for x in ds21.get_fragments())
        c = cpu()
        ds20 = lance.write_dataset(t, str(d20), mode="append" if ds20 else "create", max_rows_per_file=t.num_rows,
                                   data_storage_version="2.0")
        write_cpu["lance20"] += cpu() - c
        map20[f] = max(x.fragment_id for x in ds20.get_fragments())
        c = cpu()
        ipc_wal.write(f, t)  # exactly what the WAL writes on push (IPC + CRC32C footer)
        write_cpu["ipc"] += cpu() - c
        if a.merged:
            group.append((f, t))
            if len(group) == 8:
                flush_group()
    if group:
        flush_group()
    res["write_cpu_s_per_gb"] = {k: v / (nbytes / 2**30) for k, v in write_cpu.items()}
    print("write cpu s/GB", res["write_cpu_s_per_gb"], flush=True)

    ds21 = lance.dataset(str(d21), session=lance.Session(metadata_cache_size_bytes=CACHE, index_cache_size_bytes=1 << 20))
    ds20 = lance.dataset(str(d20), session=lance.Session(metadata_cache_size_bytes=CACHE, index_cache_size_bytes=1 << 20))
    ipc = IpcFiles({f: ipc_wal.segment_path(f) for f in frags})
    merged = IpcFiles(merged_paths, merged_first)
    # every variant has maps of its own: a page a map already touched costs no fault, so variants that
    # shared maps would flatter whichever runs second. ``ref`` maps the buffer's own fragment files.
    own = IpcFiles({f: s.warm.file_of(f) for f in frags})
    plain = IpcFiles({f: ipc_wal.segment_path(f) for f in frags})
    lance_files = {f: [d20 / "data" / d.path for d in ds20.get_fragment(map20[f]).data_files()] for f in frags}
    l21_files = {f: [d21 / "data" / d.path for d in ds21.get_fragment(map21[f]).data_files()] for f in frags}
    m21 = np.zeros(max(frags) + 1, np.int64)
    m20 = np.zeros(max(frags) + 1, np.int64)
    for f in frags:
        m21[f], m20[f] = map21[f], map20[f]

    def locate(ks: list[str]) -> Location:
        """reads.get's index step: RocksDB multi-get, then batch -> (fragment, offset)."""
        return locate_warm(buf, ks)

    def v_today(ks: list[str]) -> pa.Table:
        return buf.get(ks, COLS)

    def v_lance20(ks: list[str]) -> pa.Table:
        w = locate(ks)
        stat_files([p for f in np.unique(w.part).tolist() for p in lance_files[f]])
        return lance_take(ds20, Location(m20[w.part], w.row), COLS)

    def v_lance21(ks: list[str]) -> pa.Table:
        w = locate(ks)
        stat_files([p for f in np.unique(w.part).tolist() for p in l21_files[f]])
        return lance_take(ds21, Location(m21[w.part], w.row), COLS)

    def v_ipc(ks: list[str]) -> pa.Table:
        w = locate(ks)
        ipc.verify(np.unique(w.part))
        return ipc.take(w, COLS)

    def v_ipc8(ks: list[str]) -> pa.Table:
        w = locate(ks)
        merged.verify(np.unique(w.part))
        return merged.take(w, COLS)

    precomputed: dict[int, Location] = {}

    def v_ref(ks: list[str]) -> pa.Table:  # mmap IPC take of the same rows of the same files, nothing else
        return own.take(precomputed[id(ks)], COLS)

    def v_ref_pyarrow(ks: list[str]) -> pa.Table:  # the same, one pyarrow take per file
        return plain.take_pyarrow(precomputed[id(ks)], COLS)

    def v_lookup(ks: list[str]) -> None:
        locate(ks)

    variants: dict[str, Callable] = {"buffer_get": v_today, "a_lance20": v_lance20, "b_lance21": v_lance21,
                                     "c_ipc_per_fragment": v_ipc, **({"d_ipc_8_fragments_per_file": v_ipc8} if a.merged else {}),
                                     "ref_ipc_take": v_ref, "ref_ipc_pyarrow_take_per_file": v_ref_pyarrow, "index_lookup_only": v_lookup}
    rng = np.random.default_rng(17)
    # correctness + warm-up (opens files, fills caches): every variant returns the same rows
    ks = keys[rng.choice(len(keys), N_KEYS, replace=False)].tolist()
    precomputed[id(ks)] = locate(ks)
    want = v_today(ks)
    for name, fn in variants.items():
        got = fn(ks)
        if got is not None and not got.column(0).equals(want.column(0)):
            raise SystemExit(f"{name} returned different rows")
    times: dict[str, list[float]] = {n: [] for n in variants}
    per_round: dict[str, list[float]] = {n: [] for n in variants}
    names = list(variants)
    per = a.calls // a.rounds
    for r in range(a.rounds):
        rt: dict[str, list[float]] = {n: [] for n in variants}
        for i in range(per):
            ks = keys[rng.choice(len(keys), N_KEYS, replace=False)].tolist()
            precomputed.clear()
            precomputed[id(ks)] = locate(ks)
            k = (r * per + i) % len(names)
            for name in names[k:] + names[:k]:
                t0 = time.perf_counter()
                variants[name](ks)
                rt[name].append(time.perf_counter() - t0)
        for n in names:
            times[n] += rt[n]
            per_round[n].append(statistics.median(rt[n]))
        print(f"round {r}: " + ", ".join(f"{n}={statistics.median(rt[n]) * 1e3:.1f}" for n in names), flush=True)
    out = {}
    for n in names:
        x = np.array(times[n]) * 1e3
        out[n] = {"p50_ms": float(np.percentile(x, 50)), "p99_ms": float(np.percentile(x, 99)),
                  "median_of_round_p50s_ms": statistics.median(per_round[n]) * 1e3, "calls": len(x)}
    ref = out["ref_ipc_take"]["p50_ms"]
    for n in names:
        out[n]["p50_vs_ref_ipc_take"] = out[n]["p50_ms"] / ref
    res["get"] = out
    buf.close()
    if a.ingest_trials:
        res["ingest"] = ingest_trials(root, a.ingest_mb, a.budget_mb, a.ingest_trials)
    res["load_at_end"] = os.getloadavg()
    print(json.dumps(res, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    if not a.dir:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
