"""Issue 23's "done when", measured side by side in one run: cold ``get``/``sample`` at 2 and 8 GB against
a Lance ``take`` of the same rows from the same storage, reopen bytes, and a fresh-node resume.

Build (once per size, kept for later runs: ``--reuse``): a buffer (``memory_limit_mb=512``, ``disk_limit_gb``
a quarter of the data, so ~3/4 of the rows end cold) filled with generated GRPO rollouts
(``lakebuffer.bench.data``) and snapshotted as it goes, then a Lance dataset of exactly the same rows (the
buffer's keys, every column; files of the lake files' row count) on the same storage. The build of a size
resumes where it stopped (the buffer is reopened and the stream continues from its row count; the Lance
copy is written once the buffer is complete). Local ``file://`` lakes live under ``ROOT/local/<mb>mb``; a
moto S3 lake (loopback, ``--s3``) holds its state in the moto process, so with ``--s3`` each run builds and
measures in one process (the buffer directories are local, under ``ROOT/s3``, and deleted at the start).

Measure (every size in one process, interleaved: round r runs every size's operations, order rotating):

* ``get``: ``--keys`` random cold keys' ``response_ids`` (fresh keys each call) vs ``lance``: a Lance
  ``take`` by row position of the same rows (the key -> position map comes from the Lance key column;
  take by position is the random-access floor); ``sample``: ``sample(keys, where="reward > 0.5 AND
  policy_version >= v", columns=[key, response_ids])`` with ``v`` keeping ~30% of the rows, vs
  ``lance_sample``: a Lance take of the rows it returned. Round 0 is reported apart (``first_ms``),
  p50/p99 over the ``--calls`` rounds after it. The rows of round 0 are checked equal in both systems.
* ``reopen``: a child process (imports and a throwaway buffer first) opens the built buffer: bytes read
  and written (``/proc/self/io`` rchar/wchar, page cache included; on S3 plus the bytes through a
  counting loopback proxy in front of moto) as a fraction of the lake's bytes, and its time.
* ``resume``: a child opens an empty directory with ``lake=, run_id=`` (a fresh node), then one
  ``sample + get`` as above: bytes read and written until that call returned (fraction of the lake),
  its time against the steady ``sample`` p50, and the p50 of 5 calls after it.

Load average at start and end, the machine and versions go in the JSON. Commands (``PYTHONPATH=.``):

    .venv/bin/python benchmarks/cold_scale.py --root /work/coldscale-data --mb 512 --calls 20
    .venv/bin/python benchmarks/cold_scale.py --root /work/coldscale-data --mb 2048 8192 --calls 20 \
        --out benchmarks/notes/coldscale_local.json                      # builds what is missing
    .venv/bin/python benchmarks/cold_scale.py --root /work/coldscale-data --mb 2048 8192 --reuse  # measure only
    .venv/bin/python benchmarks/cold_scale.py --root /work/coldscale-data --mb 2048 --s3 --calls 20
    .venv/bin/python benchmarks/cold_scale.py --root /tmp/cs --mb 16 --calls 3 --keys 32   # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

MiB = 2**20
COLS = ["response_ids"]
PREDICATE_SHARE = 0.3  # the share of rows ``where`` keeps


# ---- small helpers ------------------------------------------------------------------------------
def io() -> tuple[int, int]:
    """(rchar, wchar) of this process: bytes through read()/write() syscalls, page cache hits included."""
    f = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(f["rchar"]), int(f["wchar"])


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def local_files(url: str) -> list[Path]:
    return [p for p in Path(url).rglob("*") if p.is_file()]


def resident_share(url: str) -> float | None:
    """The share of a local directory's bytes in the page cache (``fincore``), None when unknown."""
    files = local_files(url)
    total = sum(p.stat().st_size for p in files)
    if not total or not shutil.which("fincore"):
        return None
    res = 0
    for i in range(0, len(files), 200):
        p = subprocess.run(["fincore", "-b", "-n", "-o", "RES", *map(str, files[i:i + 200])],
                           capture_output=True, text=True)
        res += sum(int(x) for x in p.stdout.split() if x.isdigit())
    return round(res / total, 3)


def evict_cache(url: str) -> None:
    """Drop a local directory's clean pages from the page cache (``posix_fadvise DONTNEED``; no root)."""
    for p in local_files(url):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def summary(xs: list[float]) -> dict[str, float]:
    return {"p50_ms": round(statistics.median(xs) * 1e3, 2), "p99_ms": round(pct(xs, 0.99) * 1e3, 2),
            "mean_ms": round(statistics.fmean(xs) * 1e3, 2)}


class CountingProxy:
    """A loopback TCP proxy in front of moto that counts the bytes each way (S3 reads go through
    Rust and Python sockets alike, which ``/proc/self/io`` does not count). It runs in the parent,
    which idles while the measured child works: in the child, a Rust call that holds the GIL while it
    waits on the network (deltalake's ``history``) would starve a proxy thread, a deadlock. The child
    reads the counters from ``control_port`` (one line, "down up")."""

    def __init__(self, port: int) -> None:
        self.target = ("127.0.0.1", port)
        self.up = self.down = 0
        self._lock = threading.Lock()
        self._srv, self.port = self._listen()
        self._ctl, self.control_port = self._listen()
        threading.Thread(target=self._accept, daemon=True).start()
        threading.Thread(target=self._control, daemon=True).start()

    @staticmethod
    def _listen() -> tuple[socket.socket, int]:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        return s, s.getsockname()[1]

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._srv.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            threading.Thread(target=self._pipe, args=(client, server, "up"), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, "down"), daemon=True).start()

    def _control(self) -> None:
        while True:
            try:
                c, _ = self._ctl.accept()
            except OSError:
                return
            with c, self._lock:
                c.sendall(f"{self.down} {self.up}\n".encode())

    def _pipe(self, src: socket.socket, dst: socket.socket, way: str) -> None:
        try:
            while chunk := src.recv(1 << 18):
                with self._lock:
                    setattr(self, way, getattr(self, way) + len(chunk))
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        for s in (self._srv, self._ctl):
            s.close()


class RequestLog:
    """Counts the requests moto served since the last call, from its request log (one line each):
    on moto every ranged GET reads the whole object, so requests, not bytes, are what a call costs there."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, path.stat().st_size if path.exists() else 0

    def since_last(self) -> int:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            new = f.read()
        self.offset += len(new)
        return new.count(b'" 20')  # request lines answered 200 / 206 (the log has other lines too)


def proxy_counts(control_port: int) -> tuple[int, int]:
    """(bytes down, bytes up) so far through the proxy whose control port is given."""
    with socket.create_connection(("127.0.0.1", control_port)) as c:
        down, up = c.makefile().readline().split()
    return int(down), int(up)


# ---- where each size lives ----------------------------------------------------------------------
class Target:
    """One built size: the buffer directory (always local), the lake and the Lance dataset."""

    def __init__(self, root: Path, mb: int, s3: dict | None) -> None:
        self.mb, self.s3 = mb, s3
        self.dir = root / ("s3" if s3 else "local") / f"{mb}mb"
        self.buf = self.dir / "buf"
        self.run_id = f"cs{mb}"
        if s3:
            base = f"s3://{s3['bucket']}/cs{mb}"
            self.lake, self.lance = f"{base}/lake", f"{base}/lance"
        else:
            self.lake, self.lance = str(self.dir / "lake"), str(self.dir / "data.lance")

    def storage_options(self, endpoint: str | None = None) -> dict | None:
        if not self.s3:
            return None
        return {"key": "bench", "secret": "bench", "endpoint_url": endpoint or self.s3["endpoint"],
                "client_kwargs": {"region_name": "us-east-1"}}

    def lance_options(self) -> dict | None:
        if not self.s3:
            return None
        return {"access_key_id": "bench", "secret_access_key": "bench", "aws_endpoint": self.s3["endpoint"],
                "region": "us-east-1", "allow_http": "true"}

    def open_kwargs(self) -> dict:
        """What every open of this size's buffer passes (the build's budgets)."""
        total = self.mb * MiB
        return {"lake": self.lake, "storage_options": self.storage_options(), "run_id": self.run_id,
                "memory_limit_mb": min(512, max(4, self.mb // 16)), "disk_limit_gb": total / 4 / 2**30,
                "snapshot_interval_s": 0}

    def bytes_of(self, url: str) -> int:
        if self.s3:
            import s3fs

            fs = s3fs.S3FileSystem(skip_instance_cache=True, **self.storage_options())
            return int(fs.du(url.removeprefix("s3://")))
        return sum(p.stat().st_size for p in local_files(url))

    @property
    def info_path(self) -> Path:
        return self.dir / "build.json"


# ---- build --------------------------------------------------------------------------------------
def batch_rows(mb: int) -> int:
    return 512 if mb >= 1024 else 128


def build(t: Target) -> dict:
    """Fill the buffer to ``t.mb`` (resuming a partial build), then write the Lance copy."""
    import lakebuffer as lb
    from lakebuffer.bench.data import rollouts

    info: dict[str, Any] = json.loads(t.info_path.read_text()) if t.info_path.exists() else {}
    if info.get("done"):
        return info
    t.dir.mkdir(parents=True, exist_ok=True)
    total, rows = t.mb * MiB, batch_rows(t.mb)
    snap_every = max(1, int(min(256 * MiB, max(2 * MiB, total / 16)) // (rows * 20_000)))
    t0 = time.perf_counter()
    with lb.ReplayBuffer.open(t.buf, **t.open_kwargs()) as buf:
        first = len(buf)  # pushes are atomic and rows are generated in order: continue from here
        produced = info.get("pushed_bytes", 0) if first else 0  # as of the last snapshot: decides when to stop
        i = 0
        while produced < total:
            tb = rollouts(first, rows, run_id=t.run_id)
            buf.push(tb.drop_columns(["key"]))
            produced += tb.nbytes
            first += rows
            i += 1
            if i % snap_every == 0:
                buf.snapshot(wait=True)
                info.update(pushed_bytes=produced, pushed_rows=first)
                t.info_path.write_text(json.dumps(info))
                print(f"  {t.mb} MB: pushed {produced / MiB:.0f} MB, {time.perf_counter() - t0:.0f} s", flush=True)
        buf.snapshot(wait=True)
        buf.flush()
        st = buf.stats()
        keys = buf.sql("SELECT key FROM meta ORDER BY key").column("key")
        info.update(pushed_bytes=produced, pushed_rows=first, push_s=round(time.perf_counter() - t0, 1),
                    tiers={k: v["rows"] for k, v in st["tiers"].items()}, lake_files=st["cold"].get("files"))
    assert len(keys) == first, (len(keys), first)
    t.info_path.write_text(json.dumps(info))
    info.update(write_lance(t, keys, rows))
    info["lake_bytes"] = t.bytes_of(t.lake)
    info["done"] = True
    t.info_path.write_text(json.dumps(info))
    return info


def write_lance(t: Target, keys: pa.ChunkedArray, rows: int) -> dict:
    """The same rows (the buffer's keys, every generated column) as one Lance dataset."""
    import lance

    from lakebuffer.bench.data import rollouts

    n = len(keys)
    keys = keys.combine_chunks()

    def batches():
        for first in range(0, n, rows):
            tb = rollouts(first, min(rows, n - first), run_id=t.run_id)
            yield from tb.set_column(0, "key", keys.slice(first, tb.num_rows)).to_batches()

    schema = rollouts(0, 8, run_id=t.run_id).schema
    files = max(1, int(json.loads(t.info_path.read_text()).get("lake_files") or 1))
    t0 = time.perf_counter()
    lance.write_dataset(pa.RecordBatchReader.from_batches(schema, batches()), t.lance, mode="overwrite",
                        max_rows_per_file=max(1024, -(-n // files)), storage_options=t.lance_options())
    return {"lance_write_s": round(time.perf_counter() - t0, 1), "lance_bytes": t.bytes_of(t.lance)}


# ---- children: reopen and fresh-node resume -----------------------------------------------------
def warm_up(scratch: Path) -> None:
    """Imports, DuckDB, RocksDB, deltalake and DataFusion paid before counting (on another lake)."""
    import lakebuffer as lb
    from lakebuffer.bench.data import rollouts

    d = Path(tempfile.mkdtemp(dir=scratch))
    with lb.ReplayBuffer.open(d / "b", lake=str(d / "lake"), snapshot_interval_s=0, run_id="w") as b:
        b.push(rollouts(0, 64, run_id="w").drop_columns(["key"]))
        b.snapshot(wait=True)
        b.evict_all()
        b.get(b.sample(8, return_keys=True), COLS)
    shutil.rmtree(d, ignore_errors=True)


def child(op: str, spec: dict) -> dict:
    import lakebuffer as lb

    warm_up(Path(spec["scratch"]))
    kw = dict(spec["open"])
    proxy = spec.get("proxy")
    if proxy:
        kw["storage_options"] = dict(kw["storage_options"], endpoint_url=f"http://127.0.0.1:{proxy[0]}")

    def counts() -> dict:
        r, w = io()
        down, up = proxy_counts(proxy[1]) if proxy else (0, 0)
        return {"read": r, "write": w, "s3_down": down, "s3_up": up}

    c0, t0 = counts(), time.perf_counter()
    path = spec["buf"] if op == "reopen" else spec["fresh"]
    buf = lb.ReplayBuffer.open(path, **kw)
    out: dict[str, Any] = {"open_s": round(time.perf_counter() - t0, 3)}
    c1 = counts()
    out["open"] = {k: c1[k] - c0[k] for k in c0}
    out["rows"] = len(buf)
    if op == "resume":
        t1 = time.perf_counter()
        got = buf.sample(spec["keys"], where=spec["where"], columns=["key", *COLS], seed=12345)
        out["first_call_s"] = round(time.perf_counter() - t1, 3)
        c2 = counts()
        out["until_first"] = {k: c2[k] - c0[k] for k in c0}
        assert got.num_rows == spec["keys"]
        more = []
        for s in range(5):
            t1 = time.perf_counter()
            buf.sample(spec["keys"], where=spec["where"], columns=["key", *COLS], seed=s)
            more.append(time.perf_counter() - t1)
        out["next5"] = summary(more)
        out["tiers_after"] = {k: v["rows"] for k, v in buf.stats()["tiers"].items()}
    buf.close()
    return out


def run_child(op: str, t: Target, scratch: Path, where: str, keys: int, moto_port: int | None) -> dict:
    fresh = t.dir / "fresh-node"
    shutil.rmtree(fresh, ignore_errors=True)
    proxy = CountingProxy(moto_port) if moto_port else None
    spec = {"open": t.open_kwargs(), "buf": str(t.buf), "fresh": str(fresh), "where": where, "keys": keys,
            "scratch": str(scratch), "proxy": [proxy.port, proxy.control_port] if proxy else None}
    if op == "resume":
        spec["open"] = dict(spec["open"], restore="lazy")
    try:
        p = subprocess.run([sys.executable, __file__, "--child", op, json.dumps(spec)], capture_output=True,
                           text=True, timeout=900, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
        if p.returncode:
            return {"error": f"exit {p.returncode}: {p.stderr[-3000:]}"}
        return json.loads(p.stdout.strip().splitlines()[-1])
    except subprocess.TimeoutExpired:
        return {"error": "timed out after 900 s"}
    finally:
        shutil.rmtree(fresh, ignore_errors=True)
        if proxy:
            proxy.close()


def where_for(rows: int) -> str:
    """The predicate keeping ~PREDICATE_SHARE of ``rows`` generated rows (reward > 0.5 keeps half;
    ``policy_version`` is row // 1024)."""
    v = int((1 - PREDICATE_SHARE / 0.5) * (rows - 1) // 1024)
    return f"reward > 0.5 AND policy_version >= {v}"


# ---- measure ------------------------------------------------------------------------------------
class Side:
    """One size, opened for the in-process loop."""

    def __init__(self, t: Target, n_keys: int, seed: int, evict: bool, requests: RequestLog | None = None) -> None:
        import lance

        import lakebuffer as lb

        self.t = t
        self.cache: dict[str, Any] = {}
        if not t.s3 and evict:  # the open is timed from disk too
            for url in (t.lake, t.lance, str(t.buf)):
                evict_cache(url)
        t0 = time.perf_counter()
        self.buf = lb.ReplayBuffer.open(t.buf, **t.open_kwargs())
        self.open_s = time.perf_counter() - t0
        self.ds = lance.dataset(t.lance, storage_options=t.lance_options())
        # the harness's keys live in numpy string arrays, not Python dicts / lists / sets: those hold
        # ~550k keys over both sizes, and each collection of Python's oldest GC generation walked them
        # (46 of a 65 ms pause, charged to whichever timed call it fell in: the p99 of 20 calls)
        lkeys = np.asarray(self.ds.to_table(columns=["key"]).column("key").to_numpy(zero_copy_only=False), "U")
        self.lance_order = np.argsort(lkeys, kind="stable")
        self.lance_sorted = lkeys[self.lance_order]
        try:
            cold = self.buf.sql("SELECT key FROM cold_rows").column("key")
        except Exception:  # noqa: BLE001 - a branch without the view: the same set from public tables
            cold = self.buf.sql("SELECT key FROM meta WHERE key NOT IN (SELECT key FROM hot UNION ALL "
                                "SELECT key FROM warm)").column("key")
        self.rows = len(self.buf)
        self.cold = np.asarray(cold.to_numpy(zero_copy_only=False), "U")
        self.cold_sorted = np.sort(self.cold)
        self.sampled = self.sampled_cold = 0
        self.cold = self.cold[np.random.default_rng(seed).permutation(len(self.cold))]
        self.n_keys, self.next = n_keys, 0
        self.where = where_for(self.rows)
        self.where_share = self.buf.count(self.where) / self.rows
        self.times: dict[str, list[float]] = {k: [] for k in ("get", "lance", "sample", "lance_sample")}
        self.requests_log = requests
        self.requests: dict[str, list[int]] = {k: [] for k in self.times}
        self.first: dict[str, float] = {}
        self.same_rows: bool | None = None
        st = self.buf.stats()
        self.served0 = dict(st["reads"]["rows_from"])
        self.wal_bytes = st["wal"]["bytes"]
        if not t.s3:
            if evict:  # again: the SQL above read every lake file whole (a scan checks each file's sha256)
                for url in (t.lake, t.lance, str(t.buf)):
                    evict_cache(url)
            self.cache = {"lake": resident_share(t.lake), "lance": resident_share(t.lance)}

    def fresh_keys(self) -> list[str]:
        if self.next + self.n_keys > len(self.cold):
            self.next = 0  # more calls than cold keys / n: keys repeat (said in the output)
        ks = self.cold[self.next:self.next + self.n_keys].tolist()
        self.next += self.n_keys
        return ks

    def take(self, keys: list[str]) -> pa.Table:
        return self.ds.take(self.lance_order[np.searchsorted(self.lance_sorted, keys)], columns=COLS)

    def round(self, r: int, seed: int) -> None:
        keys = self.fresh_keys()
        sampled: list[str] = []
        got: dict[str, pa.Table] = {}

        def op_get() -> None:
            got["get"] = self.buf.get(keys, COLS)

        def op_lance() -> None:
            got["lance"] = self.take(keys)

        def op_sample() -> None:
            s = self.buf.sample(self.n_keys, where=self.where, columns=["key", *COLS], seed=seed + r)
            sampled.extend(s.column("key").to_pylist())
            self.sampled += len(sampled)
            at = np.searchsorted(self.cold_sorted, sampled).clip(0, len(self.cold_sorted) - 1)
            self.sampled_cold += int((self.cold_sorted[at] == np.asarray(sampled, "U")).sum())

        def op_lance_sample() -> None:
            self.take(sampled)

        ops = [("get", op_get), ("lance", op_lance), ("sample", op_sample), ("lance_sample", op_lance_sample)]
        if r % 2:  # rotate which system goes first (sample must precede its Lance take)
            ops = [ops[1], ops[0], ops[2], ops[3]]
        if r % 4 >= 2:
            ops = ops[2:] + ops[:2]
        for name, fn in ops:
            if self.requests_log:
                self.requests_log.since_last()
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            if self.requests_log and r:
                self.requests[name].append(self.requests_log.since_last())
            if r == 0:
                self.first[name] = dt
            else:
                self.times[name].append(dt)
        assert got["get"].num_rows == len(keys)
        if r == 0:
            self.same_rows = got["get"].column("response_ids").equals(got["lance"].column("response_ids"))

    def result(self, info: dict) -> dict:
        st = self.buf.stats()
        served = {k: v - self.served0.get(k, 0) for k, v in st["reads"]["rows_from"].items()}
        out = {"mb": self.t.mb, "rows": self.rows, "cold_rows": len(self.cold),
               "cold_share": round(len(self.cold) / self.rows, 3), "lake_bytes": info["lake_bytes"],
               "lance_bytes": info["lance_bytes"], "lake_files": info.get("lake_files"),
               "build": {k: info.get(k) for k in ("push_s", "lance_write_s", "tiers")},
               "open_s": round(self.open_s, 2), "wal_bytes": self.wal_bytes, "page_cache_at_start": self.cache, "where": self.where, "where_share": round(self.where_share, 3),
               "same_rows_round0": self.same_rows, "rows_served_from": served,
               "sampled_cold_share": round(self.sampled_cold / max(1, self.sampled), 3),
               "first_ms": {k: round(v * 1e3, 1) for k, v in self.first.items()}}
        for k, xs in self.times.items():
            out[k] = summary(xs)
        if any(self.requests.values()):
            out["s3_requests_p50"] = {k: float(np.median(v)) for k, v in self.requests.items() if v}
        out["get_over_lance_p50"] = round(out["get"]["p50_ms"] / out["lance"]["p50_ms"], 2)
        out["get_p99_over_p50"] = round(out["get"]["p99_ms"] / out["get"]["p50_ms"], 2)
        out["sample_over_lance_p50"] = round(out["sample"]["p50_ms"] / out["lance_sample"]["p50_ms"], 2)
        out["sample_p99_over_p50"] = round(out["sample"]["p99_ms"] / out["sample"]["p50_ms"], 2)
        return out


def measure(targets: list[Target], infos: list[dict], calls: int, n_keys: int, seed: int, scratch: Path,
            moto_port: int | None, children: bool, evict: bool = False, requests: RequestLog | None = None) -> list[dict]:
    # children first: the buffers must be closed while another process opens them
    kids: list[dict] = []
    for t, info in zip(targets, infos):
        where = where_for(info.get("pushed_rows") or 1)
        k: dict[str, Any] = {}
        if children:
            for op in ("reopen", "resume"):
                print(f"  {t.mb} MB: {op} child", flush=True)
                k[op] = run_child(op, t, scratch, where, n_keys, moto_port)
        kids.append(k)
    sides = [Side(t, n_keys, seed + i, evict, requests) for i, t in enumerate(targets)]
    try:
        for r in range(calls + 1):
            order = sides if r % 2 == 0 else sides[::-1]
            for s in order:
                s.round(r, seed)
            if r % 5 == 0:
                print(f"  round {r}/{calls}", flush=True)
        out = []
        for s, info, k in zip(sides, infos, kids):
            res = s.result(info)
            res["calls"], res["keys_per_call"] = calls, n_keys
            res["keys_repeat"] = (calls + 1) * n_keys > len(s.cold)
            lake = res["lake_bytes"]
            for op, c in k.items():
                if "error" not in c:
                    for phase in ("open", "until_first"):
                        if phase in c:
                            c[phase]["read_share"] = round((c[phase]["read"] + c[phase]["s3_down"]) / lake, 4)
                            c[phase]["write_share"] = round((c[phase]["write"] + c[phase]["s3_up"]) / lake, 4)
                    if "first_call_s" in c:
                        c["first_over_steady_sample_p50"] = round(c["first_call_s"] * 1e3 / res["sample"]["p50_ms"], 2)
                res[op] = c
            out.append(res)
        return out
    finally:
        for s in sides:
            s.buf.close()


# ---- report -------------------------------------------------------------------------------------
def scale_ratios(results: list[dict]) -> dict | None:
    if len(results) < 2:
        return None
    lo, hi = min(results, key=lambda r: r["mb"]), max(results, key=lambda r: r["mb"])
    return {"small_mb": lo["mb"], "big_mb": hi["mb"],
            "get_p50": round(hi["get"]["p50_ms"] / lo["get"]["p50_ms"], 2),
            "sample_p50": round(hi["sample"]["p50_ms"] / lo["sample"]["p50_ms"], 2),
            "lance_p50": round(hi["lance"]["p50_ms"] / lo["lance"]["p50_ms"], 2),
            **({"s3_requests_get_p50": round(hi["s3_requests_p50"]["get"] / max(lo["s3_requests_p50"]["get"], 1), 2),
                "s3_requests_lance_p50": round(hi["s3_requests_p50"]["lance"] / max(lo["s3_requests_p50"]["lance"], 1), 2)}
               if "s3_requests_p50" in hi and "s3_requests_p50" in lo else {})}


def markdown(doc: dict) -> str:
    lines = [f"storage: {doc['storage']}; load average start {doc['load_start']} end {doc['load_end']}; "
             f"{doc['machine'].get('cores')} cores, {doc['machine'].get('ram_gb')} GB RAM, {doc['machine'].get('cpu')}; "
             f"lakebuffer {doc['machine'].get('lakebuffer_commit')}",
             "", "| figure | " + " | ".join(f"{r['mb']} MB" for r in doc["results"]) + " | done when |",
             "|---|" + "---|" * len(doc["results"]) + "---|"]

    def row(name: str, fn, goal: str = "") -> None:
        cells = []
        for r in doc["results"]:
            try:
                cells.append(str(fn(r)))
            except (KeyError, TypeError, ZeroDivisionError):
                cells.append("-")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {goal} |")

    row("rows (cold share)", lambda r: f"{r['rows']:,} ({r['cold_share']:.0%})", ">= 70% cold")
    row("lake / Lance GB", lambda r: f"{r['lake_bytes'] / 2**30:.2f} / {r['lance_bytes'] / 2**30:.2f}")
    row("cold get p50 / p99 ms", lambda r: f"{r['get']['p50_ms']:.0f} / {r['get']['p99_ms']:.0f}")
    row("Lance take p50 / p99 ms", lambda r: f"{r['lance']['p50_ms']:.0f} / {r['lance']['p99_ms']:.0f}")
    row("get / Lance p50", lambda r: r["get_over_lance_p50"], "<= 3")
    row("get p99 / p50", lambda r: r["get_p99_over_p50"], "<= 3")
    row("first get ms (Lance)", lambda r: f"{r['first_ms']['get']:.0f} ({r['first_ms']['lance']:.0f})")
    row("sample+get p50 / p99 ms", lambda r: f"{r['sample']['p50_ms']:.0f} / {r['sample']['p99_ms']:.0f}")
    row("Lance take of sampled p50 ms", lambda r: f"{r['lance_sample']['p50_ms']:.0f}")
    row("sample / Lance p50", lambda r: r["sample_over_lance_p50"], "<= 3")
    row("sample p99 / p50", lambda r: r["sample_p99_over_p50"], "<= 3")
    row("where keeps (sampled rows cold)", lambda r: f"{r['where_share']:.0%} ({r['sampled_cold_share']:.0%})")
    row("page cache at start: lake / Lance", lambda r: f"{r['page_cache_at_start']['lake']:.0%} / "
        f"{r['page_cache_at_start']['lance']:.0%}")
    row("open in process s (WAL MB replayed)", lambda r: f"{r['open_s']} ({r['wal_bytes'] / MiB:.0f})")
    row("reopen: read / written of lake", lambda r: f"{r['reopen']['open']['read_share']:.1%} / "
        f"{r['reopen']['open']['write_share']:.1%} ({r['reopen']['open_s']} s)", "read <= 5%")
    row("resume: read+written before 1st call", lambda r: f"{r['resume']['until_first']['read_share']:.1%} + "
        f"{r['resume']['until_first']['write_share']:.1%}", "<= 15%")
    row("resume: open s, 1st sample+get s", lambda r: f"{r['resume']['open_s']} / {r['resume']['first_call_s']}")
    row("resume 1st call / steady sample p50", lambda r: r["resume"]["first_over_steady_sample_p50"], "<= 3")
    row("rows equal (get vs Lance)", lambda r: r["same_rows_round0"])
    if all("s3_requests_p50" in r for r in doc["results"]):
        row("S3 requests a call p50: get / Lance / sample+get / Lance", lambda r: " / ".join(
            f"{r['s3_requests_p50'][k]:.0f}" for k in ("get", "lance", "sample", "lance_sample")))
    sr = doc.get("scale")
    if sr:
        lines += ["", f"{sr['big_mb']} MB over {sr['small_mb']} MB p50: get {sr['get_p50']}x, sample+get "
                  f"{sr['sample_p50']}x, Lance {sr['lance_p50']}x (done when: <= 1.3x)"]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path("/work/coldscale-data"))
    ap.add_argument("--mb", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--keys", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--s3", action="store_true", help="moto S3 on loopback (builds and measures in this run)")
    ap.add_argument("--reuse", action="store_true", help="measure only: every size must be built already")
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--no-children", action="store_true", help="skip the reopen and resume children")
    ap.add_argument("--evict-cache", action="store_true",
                    help="local: drop the lake's, Lance's and buffer's pages from the page cache before measuring")
    ap.add_argument("--out", type=Path, default=None, help="JSON; a .md with the table goes next to it")
    ap.add_argument("--page-kb", type=int, default=None,
                    help="build with this Parquet data page size (default: the lake writer's); a probe")
    ap.add_argument("--child", nargs=2, metavar=("OP", "SPEC"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.page_kb:
        import lakebuffer.lake.writer as lake_writer

        lake_writer.DATA_PAGE_BYTES = a.page_kb * 1024
    if a.child:
        print(json.dumps(child(a.child[0], json.loads(a.child[1]))), flush=True)
        return
    from lakebuffer.bench.report import machine
    from lakebuffer.bench.s3 import MotoServer

    a.root.mkdir(parents=True, exist_ok=True)
    scratch = a.root / "scratch"
    scratch.mkdir(exist_ok=True)
    doc: dict[str, Any] = {"storage": "s3 (moto, loopback)" if a.s3 else "local file://", "load_start": loadavg(),
                           "machine": machine(), "argv": sys.argv[1:]}
    moto = None
    try:
        s3 = None
        if a.s3:
            if a.reuse:
                raise SystemExit("--reuse cannot apply to --s3: moto keeps its objects in its process")
            os.environ["TMPDIR"] = str(scratch)  # moto spools objects over 5 MB to temp files: keep them here
            moto = MotoServer(log_path=str(scratch / "moto_requests.log")).start()
            s3 = {"endpoint": moto.endpoint, "bucket": moto.bucket}
            shutil.rmtree(a.root / "s3", ignore_errors=True)
        targets = [Target(a.root, mb, s3) for mb in a.mb]
        infos = []
        for t in targets:
            if a.reuse:
                if not t.info_path.exists() or not json.loads(t.info_path.read_text()).get("done"):
                    raise SystemExit(f"{t.dir} is not built: run without --reuse first")
                infos.append(json.loads(t.info_path.read_text()))
            else:
                t0 = time.perf_counter()
                print(f"build {t.mb} MB in {t.dir}", flush=True)
                infos.append(build(t))
                print(f"  built in {time.perf_counter() - t0:.0f} s: {json.dumps(infos[-1])}", flush=True)
        doc["load_after_build"] = loadavg()
        if a.build_only:
            return
        doc["results"] = measure(targets, infos, a.calls, a.keys, a.seed, scratch,
                                 moto.port if moto else None, not a.no_children, a.evict_cache,
                                 RequestLog(Path(moto.log_path)) if moto else None)
        doc["scale"] = scale_ratios(doc["results"])
        doc["load_end"] = loadavg()
        md = markdown(doc)
        print(json.dumps(doc, indent=1))
        print(md)
        if a.out:
            a.out.write_text(json.dumps(doc, indent=1) + "\n")
            a.out.with_suffix(".md").write_text(md)
    finally:
        if moto:
            moto.stop()


if __name__ == "__main__":
    main()
