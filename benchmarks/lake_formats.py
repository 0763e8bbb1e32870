"""Old lake format vs new, in one run, through lakebuffer's public API only (issue 14).

Usage::

    python benchmarks/lake_formats.py --repo-a main --repo-b v3-delta            # git refs: temporary worktrees
    python benchmarks/lake_formats.py --repo-a /work/main --repo-b /work/wt/delta  # checkouts as they are
    python benchmarks/lake_formats.py --repo-a . --repo-b . --size-mb 50 --trials 1  # smoke run
    options: --size-mb 200 --trials 3 --targets local,s3 --python PY --out DIR (results JSON + markdown)

Each trial is a fresh subprocess running this file with ``PYTHONPATH`` = that checkout (it checks that
``lakebuffer`` really came from there), and trials interleave A, B, A, B ... so drift on a shared
machine hits both alike; the report gives medians. Per trial and target (a local directory, and a
moto S3 server on 127.0.0.1 that this script starts):

* push ``--size-mb`` of generated rollouts (``lakebuffer.bench.data``), then ``snapshot(wait=True)``:
  seconds, GB/s of Arrow bytes, bytes the lake gained;
* close, then ``ReplayBuffer.open`` of a new directory on that lake with the same run id (a restore):
  seconds, GB/s;
* ``delete`` <= 8 keys of the last pushed group (the usual replay-buffer delete: one bad group), then
  ``snapshot``: seconds and lake bytes written;
* ``delete`` 1% of the keys (every 100th row, so every file is hit), then ``snapshot``: seconds and the
  bytes of lake objects that are new or changed (copy-on-write rewrites show up here, tombstones too);
* peak ``RssAnon`` of each phase, sampled from ``/proc/self/status`` every 20 ms by a thread
  (``peak`` is absolute, ``delta`` is above the phase's start);
* ``raw``: the machine's limit, copying Parquet files of the same data to / from the same target
  with ``pyarrow.fs.copy_files`` (no lakebuffer).

S3 credentials go both as fsspec ``storage_options`` and as ``AWS_*`` environment variables, so a
checkout that hands them to delta-rs / object_store finds them either way.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
REGION = "us-east-1"
KEY = SECRET = "bench"


# ---- child side: one trial ------------------------------------------------------------------

class RssPeak(threading.Thread):
    """Peak RssAnon (bytes) of this process while a phase runs, sampled every 20 ms."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="rss-sampler")
        self.start_bytes = self.peak = rss_anon()
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(0.02):
            self.peak = max(self.peak, rss_anon())

    def __enter__(self) -> RssPeak:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self.join()
        self.peak = max(self.peak, rss_anon())

    def mb(self) -> dict[str, float]:
        return {"peak_mb": round(self.peak / 2**20, 1), "delta_mb": round((self.peak - self.start_bytes) / 2**20, 1)}


def rss_anon() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def listing(fs: Any, root: str) -> dict[str, tuple[int, int]]:
    """path -> (size, mtime_ns) of every object under the lake root (format-agnostic)."""
    import pyarrow.fs as pafs

    try:
        infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    except OSError:
        return {}
    return {i.path: (i.size or 0, i.mtime_ns or 0) for i in infos if i.type == pafs.FileType.File}


def new_bytes(before: dict, after: dict) -> int:
    return sum(size for p, (size, mt) in after.items() if before.get(p) != (size, mt))


def arrow_fs(target: dict) -> tuple[Any, str]:
    import pyarrow.fs as pafs

    if target["kind"] == "s3":
        fs = pafs.S3FileSystem(access_key=KEY, secret_key=SECRET, region=REGION,
                               endpoint_override=target["endpoint"].split("://")[1], scheme="http")
        return fs, target["url"][len("s3://"):]
    return pafs.LocalFileSystem(), target["url"]


def open_kwargs(open_fn: Any, **want: Any) -> dict[str, Any]:
    """Only the keyword arguments this checkout's ``ReplayBuffer.open`` accepts (old and new differ)."""
    params = inspect.signature(open_fn).parameters
    return {k: v for k, v in want.items() if k in params}


def trial(spec: dict) -> dict:
    """One measurement in this process: spec has kind ('lake' or 'raw'), target, size_mb, scratch."""
    import gc

    import pyarrow as pa
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    from lakebuffer.bench import data

    target, scratch = spec["target"], Path(spec["scratch"])
    # the buffer assigns key and run_id itself (a generated key form of its own run is refused)
    tables = [t.drop_columns(["key", "run_id"]) for t in data.generate(int(spec["size_mb"] * 2**20), seed=spec.get("seed", 0))]
    logical = sum(t.nbytes for t in tables)
    rows = sum(t.num_rows for t in tables)
    fs, root = arrow_fs(target)
    out: dict[str, Any] = {"logical_bytes": logical, "rows": rows}

    if spec["kind"] == "raw":  # the machine's limit: the same data as Parquet files, copied up and down
        src = scratch / "raw-src"
        src.mkdir(parents=True)
        per = max(1, len(tables) // 8)
        for i in range(0, len(tables), per):
            pq.write_table(pa.concat_tables(tables[i:i + per]), src / f"part-{i:05d}.parquet")
        del tables
        on_disk = sum(p.stat().st_size for p in src.iterdir())
        dst = f"{root}/raw"
        fs.create_dir(dst, recursive=True)
        t0 = time.perf_counter()
        pafs.copy_files(str(src), dst, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs, use_threads=True)
        up = time.perf_counter() - t0
        back = scratch / "raw-back"
        back.mkdir()
        t0 = time.perf_counter()
        pafs.copy_files(dst, str(back), source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem(), use_threads=True)
        down = time.perf_counter() - t0
        return out | {"file_bytes": on_disk, "upload_s": up, "upload_gbps": on_disk / up / 1e9,
                      "download_s": down, "download_gbps": on_disk / down / 1e9}

    import lakebuffer as lb

    out["lakebuffer"] = str(Path(lb.__file__).resolve().parent)
    opts = open_kwargs(lb.ReplayBuffer.open, lake=target["url"], storage_options=target.get("storage_options"),
                       run_id="fmt", snapshot_interval_s=10**9, lake_timeout_s=None, snapshot_max_bytes=None,
                       snapshot_max_rows=None)
    buf = lb.ReplayBuffer.open(scratch / "buf", **opts)
    keys: list[str] = []
    for t in tables:
        keys.extend(buf.push(t).to_pylist())
    buf.flush()
    del tables
    gc.collect()

    before = listing(fs, root)
    with RssPeak() as rss:
        t0 = time.perf_counter()
        snap = buf.snapshot(wait=True)
        out["snapshot_s"] = time.perf_counter() - t0
    after = listing(fs, root)
    out["snapshot_rss"] = rss.mb()
    out["snapshot_gbps"] = logical / out["snapshot_s"] / 1e9
    out["snapshot_lake_bytes"] = new_bytes(before, after)
    out["snapshot_files"] = getattr(snap, "added_files", None)
    buf.close()

    with RssPeak() as rss:
        t0 = time.perf_counter()
        restored = lb.ReplayBuffer.open(scratch / "restored", **opts)
        out["restore_s"] = time.perf_counter() - t0
    out["restore_rss"] = rss.mb()
    out["restore_gbps"] = logical / out["restore_s"] / 1e9
    out["restore_rows"] = len(restored)
    if out["restore_rows"] != rows:
        raise SystemExit(f"restore returned {out['restore_rows']} rows, pushed {rows}")

    doomed = keys[::100]  # 1%, spread over every file of the snapshot
    before = listing(fs, root)
    with RssPeak() as rss:
        t0 = time.perf_counter()
        deleted = restored.delete(doomed)
        out["delete_call_s"] = time.perf_counter() - t0
        restored.snapshot(wait=True)
        out["delete_s"] = time.perf_counter() - t0
    out["delete_rss"] = rss.mb()
    out["delete_rows"] = deleted
    out["delete_lake_bytes"] = new_bytes(before, listing(fs, root))

    few = [k for k in keys[-8:] if k not in set(doomed)]  # one bad group of the last step
    before = listing(fs, root)
    with RssPeak() as rss:
        t0 = time.perf_counter()
        restored.delete(few)
        restored.snapshot(wait=True)
        out["delete_few_s"] = time.perf_counter() - t0
    out["delete_few_rss"] = rss.mb()
    out["delete_few_lake_bytes"] = new_bytes(before, listing(fs, root))
    restored.close()
    return out


def child_main(spec_json: str) -> None:
    spec = json.loads(spec_json)
    expect = spec.get("checkout")
    res = trial(spec)
    if expect and "lakebuffer" in res and not res["lakebuffer"].startswith(str(Path(expect).resolve())):
        raise SystemExit(f"lakebuffer came from {res['lakebuffer']}, not the checkout {expect}")
    print("RESULT " + json.dumps(res), flush=True)


# ---- parent side -----------------------------------------------------------------------------

class Moto:
    """``python -m moto.server`` on a free loopback port; one bucket per trial, dropped after it."""

    def __init__(self, python: str) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET)
        self.proc = subprocess.Popen([python, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.1)

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET, region_name=REGION)

    def bucket(self) -> str:
        name = f"fmt-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def drop(self, name: str) -> None:
        s3 = self.client()
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=name):
            objs = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if objs:
                s3.delete_objects(Bucket=name, Delete={"Objects": objs, "Quiet": True})
        for up in s3.list_multipart_uploads(Bucket=name).get("Uploads", []):
            s3.abort_multipart_upload(Bucket=name, Key=up["Key"], UploadId=up["UploadId"])
        s3.delete_bucket(Bucket=name)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def s3_env(endpoint: str) -> dict[str, str]:
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION, "AWS_ALLOW_HTTP": "true", "AWS_EC2_METADATA_DISABLED": "true"}


def resolve_checkout(spec: str, tmp: Path, made: list[Path]) -> Path:
    """A path is used as it is; anything else is a git ref checked out into a temporary worktree."""
    p = Path(spec)
    if p.is_dir():
        return p.resolve()
    wt = tmp / f"wt-{len(made)}"
    subprocess.run(["git", "-C", str(HERE.parents[1]), "worktree", "add", "--detach", str(wt), spec], check=True,
                   stdout=subprocess.DEVNULL)
    made.append(wt)
    return wt


def run_trial(python: str, checkout: Path | None, spec: dict, env_extra: dict[str, str], timeout_s: float) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")} | env_extra
    if checkout is not None:
        env["PYTHONPATH"] = str(checkout)
        spec = spec | {"checkout": str(checkout)}
    p = subprocess.run([python, str(HERE), "--child", json.dumps(spec)], capture_output=True, text=True, env=env,
                       cwd=str(checkout or HERE.parents[1]), timeout=timeout_s)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):]) | {"rc": p.returncode}
    return {"error": f"rc {p.returncode}: {p.stderr[-2000:]}", "rc": p.returncode}


METRICS = [  # (label, key path, unit, better)
    ("snapshot s", ("snapshot_s",), "s", "lower"),
    ("snapshot GB/s (Arrow bytes)", ("snapshot_gbps",), "GB/s", "higher"),
    ("snapshot lake bytes", ("snapshot_lake_bytes",), "MB", "lower"),
    ("snapshot peak RssAnon", ("snapshot_rss", "peak_mb"), "MB", "lower"),
    ("snapshot RssAnon rise", ("snapshot_rss", "delta_mb"), "MB", "lower"),
    ("restore s", ("restore_s",), "s", "lower"),
    ("restore GB/s (Arrow bytes)", ("restore_gbps",), "GB/s", "higher"),
    ("restore peak RssAnon", ("restore_rss", "peak_mb"), "MB", "lower"),
    ("restore RssAnon rise", ("restore_rss", "delta_mb"), "MB", "lower"),
    ("delete 1% + snapshot s", ("delete_s",), "s", "lower"),
    ("delete: lake bytes written", ("delete_lake_bytes",), "MB", "lower"),
    ("delete peak RssAnon", ("delete_rss", "peak_mb"), "MB", "lower"),
    ("delete 1 group (<= 8 recent keys) + snapshot s", ("delete_few_s",), "s", "lower"),
    ("delete 1 group: lake bytes written", ("delete_few_lake_bytes",), "MB", "lower"),
]
RAW = [("raw upload GB/s (file bytes)", ("upload_gbps",), "GB/s"), ("raw download GB/s (file bytes)", ("download_gbps",), "GB/s")]


def pick(res: dict, path: tuple[str, ...]) -> float | None:
    v: Any = res
    for k in path:
        if not isinstance(v, dict) or k not in v:
            return None
        v = v[k]
    return float(v) if isinstance(v, (int, float)) else None


def median(results: list[dict], path: tuple[str, ...], unit: str) -> float | None:
    vals = [x for x in (pick(r, path) for r in results if "error" not in r) if x is not None]
    if not vals:
        return None
    m = statistics.median(vals)
    return m / 1e6 if unit == "MB" and path[-1].endswith("bytes") else m


def fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3g}"


def report(results: dict, names: dict[str, str]) -> tuple[dict, str]:
    summary: dict[str, Any] = {}
    lines = []
    for target, per in results.items():
        a, b, raw = per.get("A", []), per.get("B", []), per.get("raw", [])
        lines += [f"### {target} ({names['size_mb']} MB of rollouts, medians of {names['trials']} trials)", "",
                  f"| metric | A: {names['A']} | B: {names['B']} | B/A |", "|---|---:|---:|---:|"]
        rows = {}
        for label, path, unit, _ in METRICS:
            ma, mb = median(a, path, unit), median(b, path, unit)
            ratio = (mb / ma) if (ma and mb is not None) else None
            rows[label] = {"A": ma, "B": mb, "B/A": ratio, "unit": unit}
            lines.append(f"| {label} ({unit}) | {fmt(ma)} | {fmt(mb)} | {fmt(ratio)} |")
        for label, path, unit in RAW:
            m = median(raw, path, unit)
            rows[label] = {"raw": m, "unit": unit}
            lines.append(f"| {label} | {fmt(m)} | (same) | |")
        errs = [r["error"] for r in a + b + raw if "error" in r]
        if errs:
            lines += ["", f"{len(errs)} failed trial(s); first: `{errs[0][-300:]}`"]
        lines.append("")
        summary[target] = rows
    return summary, "\n".join(lines)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child_main(sys.argv[2])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo-a", required=True, help="old format: a checkout path or a git ref")
    ap.add_argument("--repo-b", required=True, help="new format: a checkout path or a git ref")
    ap.add_argument("--size-mb", type=float, default=200)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--targets", default="local,s3")
    ap.add_argument("--python", default=sys.executable, help="interpreter for the trials (needs both formats' dependencies)")
    ap.add_argument("--out", default=str(HERE.parent / "results-lake-formats"), help="writes <out>.json and <out>.md")
    ap.add_argument("--timeout-s", type=float, default=1800)
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="lake-formats-", dir=os.environ.get("LAKEBUFFER_BENCH_DIR")))
    made: list[Path] = []
    moto = None
    results: dict[str, dict[str, list[dict]]] = {}
    try:
        checkouts = {"A": resolve_checkout(args.repo_a, tmp, made), "B": resolve_checkout(args.repo_b, tmp, made)}
        targets = [t.strip() for t in args.targets.split(",") if t.strip()]
        if "s3" in targets:
            moto = Moto(args.python)
        for i in range(args.trials):
            for target in targets:
                for side in ("raw", "A", "B") if i % 2 == 0 else ("raw", "B", "A"):  # interleaved, order alternating
                    scratch = tmp / f"t{i}-{target}-{side}"
                    scratch.mkdir()
                    bucket = None
                    if target == "s3":
                        assert moto is not None
                        bucket = moto.bucket()
                        tgt = {"kind": "s3", "url": f"s3://{bucket}/lake", "endpoint": moto.endpoint,
                               "storage_options": {"key": KEY, "secret": SECRET, "endpoint_url": moto.endpoint,
                                                   "client_kwargs": {"region_name": REGION}}}
                        env = s3_env(moto.endpoint)
                    else:
                        tgt = {"kind": "local", "url": str(scratch / "lake")}
                        env = {}
                    spec = {"kind": "raw" if side == "raw" else "lake", "target": tgt, "size_mb": args.size_mb,
                            "scratch": str(scratch), "seed": i}
                    t0 = time.monotonic()
                    try:
                        res = run_trial(args.python, checkouts["A" if side == "raw" else side], spec, env, args.timeout_s)
                    except subprocess.TimeoutExpired:
                        res = {"error": f"timed out after {args.timeout_s} s"}
                    res["wall_s"] = time.monotonic() - t0
                    results.setdefault(target, {}).setdefault(side, []).append(res)
                    print(f"trial {i} {target} {side}: " + (res.get("error", "")[:300] or
                          " ".join(f"{k}={v:.3g}" for k, v in res.items() if k.endswith(("_s", "_gbps")) and isinstance(v, float))),
                          flush=True)
                    if bucket is not None and moto is not None:
                        with contextlib.suppress(Exception):
                            moto.drop(bucket)
                    shutil.rmtree(scratch, ignore_errors=True)
        names = {"A": args.repo_a, "B": args.repo_b, "size_mb": args.size_mb, "trials": args.trials}
        summary, md = report(results, names)
        out = Path(args.out)
        out.with_suffix(".json").write_text(json.dumps({"config": vars(args) | {"checkouts": {k: str(v) for k, v in checkouts.items()}},
                                                        "medians": summary, "trials": results}, indent=1))
        out.with_suffix(".md").write_text(md + "\n")
        print(md)
    finally:
        if moto is not None:
            moto.stop()
        for wt in made:
            subprocess.run(["git", "-C", str(HERE.parents[1]), "worktree", "remove", "--force", str(wt)], check=False)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
