"""What the lake audit (issue 24.8, ``engine/lakeaudit``) costs a snapshot, in one run.

Two buffers on local lakes, each taking ``--snapshots`` small snapshots (one batch each), alternating:
one with the audit as shipped, one with ``LakeAudit.check`` replaced by a no-op. Reported: median
``snapshot(wait=True)`` seconds of each and their ratio. Then the price when the audit does compare
keys: a run of ``--rows`` committed rows, an external ``write_deltalake(mode="overwrite")`` that drops
1% of them, and the seconds of the one snapshot that notices and re-uploads them, next to a plain one.

    PYTHONPATH=. python benchmarks/lake_audit_probe.py --snapshots 40 --rows 200000
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

import lakebuffer as lb
from lakebuffer.engine import lakeaudit
from tests.rollouts import make_rollouts


def _timed_snapshot(buf: lb.ReplayBuffer) -> float:
    t0 = time.perf_counter()
    buf.snapshot(wait=True)
    return time.perf_counter() - t0


def steady(root: Path, snapshots: int) -> dict:
    real = lakeaudit.LakeAudit.check
    bufs = {name: lb.ReplayBuffer.open(root / name, lake=str(root / f"lake-{name}"), run_id=name,
                                       snapshot_interval_s=0, memory_limit_mb=256) for name in ("audit", "off")}
    times: dict[str, list[float]] = {name: [] for name in bufs}
    try:
        for i in range(snapshots):
            for name in (("audit", "off") if i % 2 == 0 else ("off", "audit")):
                lakeaudit.LakeAudit.check = real if name == "audit" else (lambda self, lake: None)
                bufs[name].push(make_rollouts(256, tokens=128, version=i, seed=i))
                times[name].append(_timed_snapshot(bufs[name]))
    finally:
        lakeaudit.LakeAudit.check = real
        for b in bufs.values():
            b.close()
    med = {k: statistics.median(v[2:]) for k, v in times.items()}
    return {"snapshot_s_audit": med["audit"], "snapshot_s_off": med["off"], "ratio": med["audit"] / med["off"]}


def triggered(root: Path, rows: int) -> dict:
    lake = str(root / "lake-big")
    with lb.ReplayBuffer.open(root / "big", lake=lake, run_id="big", snapshot_interval_s=0, memory_limit_mb=512) as buf:
        for i in range(0, rows, 4096):
            buf.push(make_rollouts(min(4096, rows - i), tokens=16, version=i // 4096, seed=i))
        buf.snapshot(wait=True)
        buf.push(make_rollouts(256, tokens=16, version=999, seed=1))
        plain = _timed_snapshot(buf)
        t = DeltaTable(lake).to_pyarrow_table()
        drop = t.column("key").slice(0, rows // 100)
        write_deltalake(lake, t.filter(pc.invert(pc.is_in(t.column("key"), value_set=drop))), mode="overwrite")
        buf.push(make_rollouts(256, tokens=16, version=1000, seed=2))
        noticed = _timed_snapshot(buf)
        st = buf.stats()["cold"]
    return {"rows": rows, "plain_snapshot_s": plain, "noticing_snapshot_s": noticed,
            "missing_rows": st["missing_rows"], "reuploaded_rows": st["reuploaded_rows"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--snapshots", type=int, default=40)
    ap.add_argument("--rows", type=int, default=200_000)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        out = {"steady": steady(Path(d), a.snapshots), "triggered": triggered(Path(d), a.rows)}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
