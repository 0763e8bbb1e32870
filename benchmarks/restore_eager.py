"""Issue 23 item 3: ``restore="eager"`` against a raw copy of the same lake files, side by side.

One lake (``--mb`` of generated GRPO rollouts, local ``file://``), then rounds of, each in a fresh child
process, in turn (so load swings hit every candidate alike):

* ``copytree``: ``shutil.copytree`` of the lake's files (the kernel's ``copy_file_range``: no user-space pass);
* ``copy+sha256``: the same files read, sha256-hashed and written in one pass, 2 files at a time (the floor
  of any copy that verifies what it copies);
* ``eager-before``: ``restore="eager"`` with another tree's code (``--before``, e.g. ``/work/main``):
  decode every zstd Parquet row group, write uncompressed Arrow IPC fragments;
* ``eager``: this tree: verified local mirror (``tiers/mirror.py``) + index from the copies' metadata columns;
* ``lazy``: ``restore="lazy"`` (the default; rows stay in the lake, open is O(metadata)), for scale.

Each with the page cache warm, and with the lake's pages dropped first (``posix_fadvise(DONTNEED)`` of
the lake files only). Per candidate: wall and CPU seconds (the child's user+sys; for the buffer modes until
``open`` returns), RssAnon growth at its peak (same span), and for the buffer modes the first and second
``sample(256) + get`` (every column) after open::

    PYTHONPATH=$PWD .venv/bin/python benchmarks/restore_eager.py --mb 256 --rounds 3 --before /work/main
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

MODES = ("copytree", "copy+sha256", "eager-before", "eager", "lazy")


def _rss_anon() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    return 0


class _Peak:
    """RssAnon sampled every 5 ms on a thread: the peak growth over the start."""

    def __init__(self) -> None:
        self.base = _rss_anon()
        self.peak = self.base
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss_anon())

    def stop(self) -> int:
        self._stop.set()
        self._t.join()
        return max(self.peak, _rss_anon()) - self.base


def _copy_sha(src: Path, dst: Path) -> str:
    h = hashlib.sha256()
    buf = bytearray(8 << 20)
    view = memoryview(buf)
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(src, "rb", buffering=0) as f, open(dst, "wb", buffering=0) as g:
        while n := f.readinto(buf):
            h.update(view[:n])
            g.write(view[:n])
    return h.hexdigest()


def child(mode: str, lake: Path, out: Path) -> dict:
    """One candidate, timed in this (fresh) process."""
    import lakebuffer as lb

    peak = _Peak()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    s = time.perf_counter()
    res: dict = {}
    if mode == "copytree":
        shutil.copytree(lake, out)
    elif mode == "copy+sha256":
        files = sorted(lake.rglob("*.parquet"))
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda p: _copy_sha(p, out / p.relative_to(lake)), files))
    else:
        restore = "eager" if mode.startswith("eager") else mode
        b = lb.ReplayBuffer.open(out, lake=str(lake), run_id="re", memory_limit_mb=64, snapshot_interval_s=0,
                                 restore=restore)
        res["open_s"] = time.perf_counter() - s
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        res["open_cpu_s"] = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        res["open_rss_anon_growth_mb"] = peak.stop() / 2**20
        t = time.perf_counter()
        b.sample(256, seed=1)
        res["first_sample_get_s"] = time.perf_counter() - t
        t = time.perf_counter()
        b.sample(256, seed=2)
        res["second_sample_get_s"] = time.perf_counter() - t
        tiers = b.stats()["tiers"]
        res["rows"] = sum(v["rows"] for v in tiers.values())
        res["local_rows"] = tiers["warm"]["rows"] + tiers["cold"].get("local_rows", 0)
        b.close()
    if "open_s" in res:  # the open alone: the restore is what is compared
        res.update(mode=mode, wall_s=res.pop("open_s"), cpu_s=res.pop("open_cpu_s"),
                   rss_anon_growth_mb=res.pop("open_rss_anon_growth_mb"))
        return res
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    res.update(mode=mode, wall_s=time.perf_counter() - s, cpu_s=(r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime),
               rss_anon_growth_mb=peak.stop() / 2**20)
    return res


def _drop_cache(lake: Path) -> None:
    for p in lake.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _make_lake(root: Path, mb: int) -> Path:
    import lakebuffer as lb
    from lakebuffer.bench.data import stream

    lake = root / "lake"
    with lb.ReplayBuffer.open(root / "src", lake=str(lake), run_id="re", memory_limit_mb=64, snapshot_interval_s=0) as b:
        for t in stream(mb * 2**20, batch_rows=64, run_id="gen"):
            b.push(t.drop_columns([c for c in ("key", "run_id") if c in t.column_names]))
        b.snapshot(wait=True)
    shutil.rmtree(root / "src")
    return lake


def run(mb: int, rounds: int, before: str | None, keep: str | None) -> dict:
    root = Path(keep) if keep else Path(tempfile.mkdtemp(dir=os.environ.get("TMPDIR")))
    try:
        lake = root / "lake"
        if not lake.exists():
            _make_lake(root, mb)
        lake_mb = sum(p.stat().st_size for p in lake.rglob("*.parquet")) / 2**20
        got: dict[str, list[dict]] = {}
        loads = []
        for _ in range(rounds):
            for cache in ("warm", "dropped"):
                for mode in MODES:
                    if mode == "eager-before" and not before:
                        continue
                    out = root / "out"
                    shutil.rmtree(out, ignore_errors=True)
                    if cache == "dropped":
                        _drop_cache(lake)
                    else:  # warm the lake's pages: read every file once
                        for p in lake.rglob("*.parquet"):
                            p.read_bytes()
                    tree = before if mode == "eager-before" else os.getcwd()
                    env = {**os.environ, "PYTHONPATH": tree}
                    r = subprocess.run([sys.executable, __file__, "--child", mode, str(lake), str(out)], env=env,
                                       capture_output=True, text=True, timeout=600)
                    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
                    if not lines:
                        raise RuntimeError(f"{mode}: {r.stderr[-2000:]}")
                    got.setdefault(f"{mode} [{cache}]", []).append(json.loads(lines[-1]))
                    loads.append(os.getloadavg()[0])
        shutil.rmtree(root / "out", ignore_errors=True)
        table = {}
        for name, runs in got.items():
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0] if isinstance(runs[0][k], (int, float))}
            table[name] = med
        for cache in ("warm", "dropped"):
            raw = table[f"copytree [{cache}]"]["wall_s"]
            for mode in MODES:
                key = f"{mode} [{cache}]"
                if key in table:
                    table[key]["raw_copy_over_this"] = raw / table[key]["wall_s"]
        return {"lake_mb": lake_mb, "rounds": rounds, "load_1min": [min(loads), max(loads)], "median": table,
                "runs": got}
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]))))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--before", help="a tree whose restore='eager' is the 'before' (PYTHONPATH for that child)")
    ap.add_argument("--keep", help="keep the lake in this folder (built once, reused)")
    ap.add_argument("--out")
    a = ap.parse_args()
    res = run(a.mb, a.rounds, a.before, a.keep)
    print(json.dumps({"lake_mb": res["lake_mb"], "load_1min": res["load_1min"], "median": res["median"]}, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
