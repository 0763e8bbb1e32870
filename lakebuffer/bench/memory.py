"""Peak anonymous memory of every buffer path, one child process per run (issue 16).

``RssAnon`` (``/proc/self/status``) is what a budget is about: file-backed pages (the page cache of
Lance fragments, memory-mapped WAL segments) are reclaimable, anonymous pages are not. A thread
samples it every 5 ms while one phase runs; each phase reports its peak growth over the RssAnon the
process had right after opening the buffer (and warming DuckDB and the WAL up), so fixed
costs that every buffer pays once are not charged to the path.

The default test suite runs it at 16x a 64 MB budget (``tests/test_memory_bounds.py``); the bench's
``scale`` scenario at >= 16 GB under 1 GB. Usage::

    python -m lakebuffer.bench.memory '{"dir": ..., "lake": ..., "bytes": ..., "budget_mb": 64}'

prints one JSON object ``{"phases": {name: {"peak_growth_bytes", "seconds", ...}}, ...}``.
"""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: The bound issue 16 sets on every path: growth of anonymous RSS under ``budget x 1.3 + 300 MB``.
BOUND_FACTOR, BOUND_FIXED = 1.3, 300 << 20


def bound_bytes(budget_mb: int) -> int:
    """Allowed RssAnon growth for a buffer with ``memory_limit_mb=budget_mb``."""
    return int((budget_mb << 20) * BOUND_FACTOR) + BOUND_FIXED


def rss_anon() -> int:
    """This process's anonymous resident memory in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise OSError("RssAnon not found in /proc/self/status (Linux only)")


class PeakSampler(threading.Thread):
    """Polls RssAnon every ``interval_s`` until stopped; ``peak`` is the highest value seen."""

    def __init__(self, interval_s: float = 0.005) -> None:
        super().__init__(daemon=True)
        self.interval_s = interval_s
        self.peak = rss_anon()
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.peak = max(self.peak, rss_anon())
            time.sleep(self.interval_s)

    def finish(self) -> int:
        self._stop_event.set()
        self.join()
        return max(self.peak, rss_anon())


def measure(phases: dict[str, dict[str, Any]], name: str, base: int, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` as phase ``name``, recording its peak RssAnon growth over ``base``."""
    sampler = PeakSampler()
    start = sampler.peak
    sampler.start()
    t0 = time.perf_counter()
    try:
        out = fn()
    finally:
        peak = sampler.finish()
        phases[name] = {"peak_growth_bytes": peak - base, "phase_growth_bytes": peak - start,
                        "seconds": round(time.perf_counter() - t0, 3)}
    return out


def run(args: dict[str, Any]) -> dict[str, Any]:
    """Every path of the buffer over ``args["bytes"]`` of generated GRPO rollouts."""
    import lakebuffer as lb
    from lakebuffer import fsck

    from . import data

    root, lake = Path(args["dir"]), args.get("lake")
    budget_mb, total = int(args["budget_mb"]), int(args["bytes"])
    batch_rows = int(args.get("batch_rows", 256))
    data._pools(0)  # the generator's pool is the harness's memory, not the buffer's
    phases: dict[str, dict[str, Any]] = {}
    only = set(args.get("phases") or ())  # `make test`'s small run: push plus these (no lake), then stop
    # no lake deadline: on a shared machine a 1 GB snapshot may take minutes; memory is what is measured
    opts = dict(memory_limit_mb=budget_mb, snapshot_interval_s=0, storage_options=args.get("storage_options"), lake_timeout_s=None,
                disk_limit_gb=args.get("disk_limit_gb"))  # with a lake: most rows end cold (issue 16, part 2)
    buf = lb.ReplayBuffer.open(root / "buf", lake=lake, run_id="mem", **opts)
    warm = next(data.stream(1 << 20, batch_rows=8, seed=99))  # start DuckDB and the WAL
    buf.push(warm.drop_columns(["run_id", "key"]))
    buf.evict_all()
    len(buf)
    base = rss_anon()
    pushed = {"bytes": 0, "rows": 0}

    def push() -> None:
        for t in data.stream(total, batch_rows=batch_rows, seed=0):
            buf.push(t.drop_columns(["run_id", "key"]))
            pushed["bytes"] += t.nbytes
            pushed["rows"] += t.num_rows
            del t
        buf.flush()

    measure(phases, "push", base, push)
    tier_rows = {name: t["rows"] for name, t in buf.stats()["tiers"].items()}  # where the rows sit (disk budget: cold)
    if only:
        for name in sorted(only & {"sample_get", "scan_payload", "dataset"}):
            measure(phases, name, base, {"sample_get": lambda: _sample_get(buf), "dataset": lambda: _dataset(buf),
                                         "scan_payload": lambda: _scan_payload(buf)}[name])
        buf.close()
        return {"phases": phases, "base_bytes": base, "pushed_bytes": pushed["bytes"], "rows": pushed["rows"],
                "budget_mb": budget_mb, "bound_bytes": bound_bytes(budget_mb), "tier_rows": tier_rows}
    if args.get("lake_only"):  # the lake's paths only (the S3 test: the local ones are the same code)
        return _lake_phases(args, buf, root, lake, opts, phases, base, pushed, warm.num_rows, tier_rows)
    measure(phases, "sql_payload", base, lambda: buf.sql("SELECT avg(len(response_ids)), sum(list_sum(response_ids)) FROM rollouts"))

    def sort_payload() -> None:  # needs more than DuckDB's share: spills, or says to raise the budget
        try:
            buf.sql("SELECT count(*), sum(len(response_ids)) FROM (SELECT response_ids FROM rollouts ORDER BY reward)")
        except lb.QueryError as e:
            phases["sql_sort_payload_error"] = {"error": str(e)[:400]}

    measure(phases, "sql_sort_payload", base, sort_payload)
    measure(phases, "scan_payload", base, lambda: _scan_payload(buf))
    measure(phases, "sample_get", base, lambda: _sample_get(buf))

    measure(phases, "dataset", base, lambda: _dataset(buf))
    if lake is not None:
        return _lake_phases(args, buf, root, lake, opts, phases, base, pushed, warm.num_rows, tier_rows)
    buf.close()
    measure(phases, "fsck", base, lambda: fsck.check(root / "buf"))
    return {"phases": phases, "base_bytes": base, "pushed_bytes": pushed["bytes"], "rows": pushed["rows"],
            "budget_mb": budget_mb, "bound_bytes": bound_bytes(budget_mb), "tier_rows": tier_rows}


def _scan_payload(buf: Any) -> int:
    return sum(b.num_rows for b in buf.scan(columns=["key", "response_ids", "response_logprobs"]))


def _dataset(buf: Any) -> int:
    from lakebuffer.dataset import iter_batches

    return sum(b.num_rows for b in iter_batches(buf, columns=["key", "response_ids"], batch_size=256, shuffle=True))


def _sample_get(buf: Any) -> None:
    for i in range(16):
        keys = buf.sample(256, seed=i, return_keys=True)
        buf.get(keys, columns=["response_ids", "response_logprobs"])


def _lake_phases(args: dict[str, Any], buf: Any, root: Path, lake: str, opts: dict[str, Any],
                 phases: dict[str, dict[str, Any]], base: int, pushed: dict[str, int], extra_rows: int,
                 tier_rows: dict[str, int]) -> dict[str, Any]:
    """Snapshot of the whole backlog, a copy-on-write delete, compaction, gc, fsck, the lake's
    verification (every file's sha256, what ``fsck --repair`` runs before rebuilding from the lake)
    and a restore into a fresh directory, each a phase."""
    import lakebuffer as lb
    from lakebuffer import fsck

    measure(phases, "snapshot", base, lambda: buf.snapshot(wait=True))
    keys = sorted(set(buf.sample(256, seed=7, return_keys=True).to_pylist()))  # spread over the run: most files hit
    buf.delete(keys)
    measure(phases, "delete_snapshot", base, lambda: buf.snapshot(wait=True))
    measure(phases, "compact", base, lambda: buf.compact())
    measure(phases, "gc", base, lambda: buf.lake.gc(older_than_s=0))
    buf.close()
    measure(phases, "fsck", base, lambda: fsck.check(root / "buf"))
    from lakebuffer.lake import Lake

    measure(phases, "lake_verify", base, lambda: Lake(lake, args.get("storage_options")).verify("mem"))  # fsck's lake check
    restored = root / "restored"
    shutil.rmtree(restored, ignore_errors=True)
    box: dict[str, Any] = {}
    measure(phases, "restore", base, lambda: box.setdefault("b", lb.ReplayBuffer.open(restored, lake=lake, run_id="mem", **opts)))
    rows = len(box["b"])
    box["b"].close()
    want = pushed["rows"] + extra_rows - len(keys)
    if rows != want:
        raise AssertionError(f"restore brought back {rows} rows, not {want}")
    return {"phases": phases, "base_bytes": base, "pushed_bytes": pushed["bytes"], "rows": pushed["rows"],
            "budget_mb": int(args["budget_mb"]), "bound_bytes": bound_bytes(int(args["budget_mb"])), "tier_rows": tier_rows}


def main(argv: list[str]) -> int:
    print(json.dumps(run(json.loads(argv[0]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
