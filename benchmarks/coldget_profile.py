"""Issue 23 (branch coldget2): where a buffer-level cold ``get`` of random keys spends its time.

Builds (once; reused when ``--dir`` already holds it) a buffer of ``--mb`` generated rollouts under
``disk_limit_gb`` at a quarter of the data, so most rows are cold, on a local lake (and, with ``--s3``,
a second one on moto S3 on loopback: moto's data lives in the server process, so the S3 buffer is
built fresh per run). Then ``--calls`` gets of ``--keys`` random cold keys' ``response_ids``, timed
(wall and CPU of the process), optionally under cProfile (``--profile``: top functions by cumulative
time), and side by side a Lance ``take`` of the same rows from a Lance dataset of the same cold rows
on the same storage (``--lance``).

    PYTHONPATH=. python benchmarks/coldget_profile.py --dir /tmp/coldget2-512 --mb 512 --calls 20 --lance
    PYTHONPATH=. python benchmarks/coldget_profile.py --dir /tmp/coldget2-512 --mb 512 --calls 10 --profile
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import random
import re
import statistics
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

import lakebuffer as lb
from lakebuffer.bench.data import stream

COLS = ["response_ids"]
_REQUEST = re.compile(r'"(?:\x1b\[[0-9;]*m)*(GET|HEAD|PUT|POST|DELETE) ')  # werkzeug colours some lines


def build(path: Path, lake: str, mb: int, storage_options: dict | None) -> None:
    total = mb << 20
    with lb.ReplayBuffer.open(path, lake=lake, storage_options=storage_options, memory_limit_mb=max(4, mb // 16),
                              snapshot_interval_s=0, disk_limit_gb=total / 4 / 2**30, run_id="r") as buf:
        for i, t in enumerate(stream(total, batch_rows=128, run_id=buf.run_id)):
            buf.push(t.drop_columns(["key"]) if "key" in t.column_names else t)
            if i % 8 == 7:
                buf.snapshot(wait=True)
        buf.snapshot(wait=True)
        buf.flush()


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def lance_of(buf: lb.ReplayBuffer, uri: str, storage_options: dict | None) -> tuple[object, dict[str, int]]:
    """A Lance dataset of the buffer's cold rows (key + response_ids) at ``uri``; key -> row number."""
    import lance

    t = buf.sql("SELECT key, response_ids FROM cold_rows")
    opts = lance_options(storage_options)
    if not uri.startswith("s3://") and os.path.exists(uri):
        ds = lance.dataset(uri)
    else:
        # files of the lake files' size: moto copies a whole object to answer a ranged GET, so one
        # 200 MB Lance file made each of its takes' requests ~40 ms there (not so on a real store)
        per_file = max(1024, t.num_rows // max(1, buf.stats()["cold"]["files"]))
        ds = lance.write_dataset(t, uri, mode="overwrite", storage_options=opts, max_rows_per_file=per_file,
                                 max_rows_per_group=per_file)
    keys = ds.to_table(columns=["key"]).column("key").to_pylist()
    return ds, {k: i for i, k in enumerate(keys)}


def lance_options(storage_options: dict | None) -> dict | None:
    if not storage_options:
        return None
    so = storage_options
    ck = so.get("client_kwargs", {})
    endpoint = so.get("endpoint_url") or ck.get("endpoint_url")
    return {"access_key_id": so.get("key", "x"), "secret_access_key": so.get("secret", "x"),
            "aws_endpoint": endpoint, "aws_region": ck.get("region_name", "us-east-1"), "allow_http": "true"}


def _requests(log: Path | None) -> dict[str, int]:
    """Requests moto logged so far, by method (werkzeug logs one line per request)."""
    if log is None:
        return {}
    out: dict[str, int] = {}
    for m in _REQUEST.findall(log.read_text(errors="replace")):
        out[m] = out.get(m, 0) + 1
    return out


def _count(log: Path | None, fn, n: int) -> dict[str, float]:
    """Requests per call of ``fn`` over ``n`` calls."""
    before = _requests(log)
    for _ in range(n):
        fn()
    time.sleep(0.3)  # the server logs a request after answering it
    after = _requests(log)
    return {m: round((after.get(m, 0) - before.get(m, 0)) / n, 1) for m in after}


def measure(path: Path, lake: str, calls: int, n_keys: int, storage_options: dict | None, lance_uri: str | None,
            profile: bool, mb: int, log: Path | None = None) -> dict:
    t0 = time.perf_counter()
    buf = lb.ReplayBuffer.open(path, lake=lake, storage_options=storage_options, memory_limit_mb=max(4, mb // 16),
                               snapshot_interval_s=0, disk_limit_gb=(mb << 20) / 4 / 2**30, run_id="r")
    open_s = time.perf_counter() - t0
    try:
        cold = buf.sql("SELECT key FROM cold_rows").column("key").to_pylist()
        st = buf.stats()
        ds = None
        if lance_uri:
            ds, where = lance_of(buf, lance_uri, storage_options)
        rng = random.Random(1)
        t0 = time.perf_counter()
        buf.get(rng.sample(cold, n_keys), COLS)
        first = time.perf_counter() - t0
        prof = cProfile.Profile() if profile else None
        times: dict[str, list[float]] = {"cold": [], "cold_cpu": [], "lance": []}
        for r in range(calls):
            keys = rng.sample(cold, n_keys)
            order = ["cold", "lance"] if r % 2 else ["lance", "cold"]
            for which in order:
                if which == "lance":
                    if ds is None:
                        continue
                    idx = sorted(where[k] for k in keys)
                    t0 = time.perf_counter()
                    got = ds.take(idx, columns=COLS)
                    times["lance"].append(time.perf_counter() - t0)
                    assert got.num_rows == n_keys
                    continue
                c0, t0 = time.process_time(), time.perf_counter()
                if prof is not None:
                    prof.enable()
                got = buf.get(keys, COLS)
                if prof is not None:
                    prof.disable()
                times["cold"].append(time.perf_counter() - t0)
                times["cold_cpu"].append(time.process_time() - c0)
                assert got.num_rows == n_keys
        out = {"lake": lake.split("://")[0] if "://" in lake else "local", "open_s": round(open_s, 2),
               "rows": {k: v["rows"] for k, v in st["tiers"].items()}, "lake_files": st["cold"]["files"],
               "first_cold_ms": round(first * 1e3, 1), "load": os.getloadavg()[0]}
        for k, xs in times.items():
            if xs:
                out[f"{k}_p50_ms"] = round(statistics.median(xs) * 1e3, 2)
                out[f"{k}_p99_ms"] = round(_pct(xs, 0.99) * 1e3, 2)
        if times["lance"]:
            out["cold_over_lance_p50"] = round(out["cold_p50_ms"] / out["lance_p50_ms"], 2)
        if log is not None:
            out["requests_per_cold_get"] = _count(log, lambda: buf.get(rng.sample(cold, n_keys), COLS), 5)
            if ds is not None:
                out["requests_per_lance_take"] = _count(
                    log, lambda: ds.take(sorted(where[k] for k in rng.sample(cold, n_keys)), columns=COLS), 5)
        if prof is not None:
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(45)
            out["profile"] = s.getvalue()
        return out
    finally:
        buf.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/coldget2-512"))
    ap.add_argument("--mb", type=int, default=512)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--keys", type=int, default=256)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--lance", action="store_true")
    ap.add_argument("--s3", action="store_true")
    ap.add_argument("--no-local", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    results = []
    if not a.no_local:
        path, lake = a.dir / "buf", str(a.dir / "lake")
        if not (a.dir / "built").exists():
            t0 = time.perf_counter()
            build(path, lake, a.mb, None)
            (a.dir / "built").write_text(str(time.perf_counter() - t0))
        r = measure(path, lake, a.calls, a.keys, None, str(a.dir / "lance") if a.lance else None, a.profile, a.mb)
        prof = r.pop("profile", None)
        print(json.dumps(r), flush=True)
        if prof:
            print(prof)
        results.append(r)
    if a.s3:
        import tempfile

        from lakebuffer.bench.s3 import MotoServer

        with tempfile.TemporaryDirectory(prefix="coldget2-s3-") as tmp, \
                MotoServer(log_path=f"{tmp}/moto.log") as s3:
            build(Path(tmp) / "buf", s3.url("lake"), a.mb, s3.storage_options)
            r = measure(Path(tmp) / "buf", s3.url("lake"), a.calls, a.keys, s3.storage_options,
                        s3.url("lance") if a.lance else None, a.profile, a.mb, log=Path(tmp) / "moto.log")
            prof = r.pop("profile", None)
            print(json.dumps(r), flush=True)
            if prof:
                print(prof)
            results.append(r)
    if a.out:
        a.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    _ = (np, pa)
    main()
