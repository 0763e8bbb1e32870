"""Issue 24 item 5: what deletes cost under sustained writes, and what the read gate costs a sample.

Two same-run comparisons, printed as JSON:

* ``delete``: ``delete(keys=40 keys)`` on an idle buffer, then while 4 threads push 64-row batches of
  1,024-token rollouts with a snapshot every second (a local lake). Before the fix a delete drained the
  whole task queue, which the producers and back-to-back snapshot steps kept refilling (10.4 s, 8.9 s,
  5.5 s seen in one run of 10 deletes).
* ``gate``: ``sample(256, where=..., columns=["response_ids"])`` p50 with the read gate, and with a
  no-op gate swapped in (the same buffer, alternating calls): the gate's overhead.

    PYTHONPATH=. python benchmarks/delete_under_writes.py [--deletes 10] [--calls 200]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import lakebuffer as lb  # noqa: E402
from tests.rollouts import make_rollouts  # noqa: E402


class _NoGate:
    @contextlib.contextmanager
    def shared(self):
        yield

    exclusive = shared


def _deletes(buf, keys, n: int) -> list[float]:
    out = []
    for j in range(n):
        t0 = time.perf_counter()
        buf.delete(keys=keys[j * 40:(j + 1) * 40])
        out.append(time.perf_counter() - t0)
    return out


def delete_figures(n: int) -> dict:
    with lb.ReplayBuffer.open(tempfile.mkdtemp(), memory_limit_mb=256, snapshot_interval_s=1,
                              push_timeout_s=300) as buf:
        keys = buf.push(make_rollouts(80 * n, tokens=16)).to_pylist()
        idle = _deletes(buf, keys, n)
        stop = threading.Event()
        pushed = [0]

        def producer(seed: int) -> None:
            batch = make_rollouts(64, tokens=1024, seed=seed)
            while not stop.is_set():
                buf.push(batch)
                pushed[0] += 1

        threads = [threading.Thread(target=producer, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        time.sleep(2)
        t0 = time.perf_counter()
        loaded = _deletes(buf, keys[40 * n:], n)
        rate = pushed[0] / (time.perf_counter() - t0 + 2)
        stop.set()
        for t in threads:
            t.join()
    return {"idle_s": [round(x, 3) for x in idle], "under_4_producers_s": [round(x, 3) for x in loaded],
            "max_under_load_s": round(max(loaded), 3), "pushes_per_s_during": round(rate, 1),
            "p50_ratio_load_over_idle": round(statistics.median(loaded) / statistics.median(idle), 2)}


def gate_figures(calls: int) -> dict:
    with lb.ReplayBuffer.open(tempfile.mkdtemp(), memory_limit_mb=64, snapshot_interval_s=0) as buf:
        for i in range(20):
            buf.push(make_rollouts(500, tokens=64, seed=i, version=i))
        gate, times = buf._state.gate, {"gate": [], "no_gate": []}
        for i in range(calls):
            for name in ("gate", "no_gate") if i % 2 else ("no_gate", "gate"):
                buf._state.gate = gate if name == "gate" else _NoGate()
                t0 = time.perf_counter()
                buf.sample(256, where="reward > 0.5 AND policy_version >= 5", columns=["response_ids"], seed=i)
                times[name].append(time.perf_counter() - t0)
        buf._state.gate = gate
    p50 = {k: statistics.median(v) * 1000 for k, v in times.items()}
    return {"sample_p50_ms_gate": round(p50["gate"], 2), "sample_p50_ms_no_gate": round(p50["no_gate"], 2),
            "ratio_gate_over_no_gate": round(p50["gate"] / p50["no_gate"], 3)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--deletes", type=int, default=10)
    ap.add_argument("--calls", type=int, default=200)
    a = ap.parse_args()
    print(json.dumps({"delete": delete_figures(a.deletes), "gate": gate_figures(a.calls)}, indent=1))


if __name__ == "__main__":
    main()
