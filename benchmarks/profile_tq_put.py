"""Where a TransferQueue ``kv_batch_put`` / ``kv_batch_get`` on LakeBuffer spends its time, per process.

    python benchmarks/profile_tq_put.py --rounds 60 --length 4096 [--clear]

Wraps methods with ``perf_counter`` spans in each process (the driver's TQ client and storage
manager, the controller actor, the store actor, the buffer's ingest steps) and prints the median
per call of each span, side by side for SimpleStorage and LakeBuffer. Spans nest: a parent's time
includes its children's; the difference between a caller's span and the callee's (in another
process) is the hop (serialization + transport + scheduling).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from typing import Any


def _spans() -> dict[str, list[float]]:
    import sys

    if not hasattr(sys, "_lb_spans"):
        sys._lb_spans = defaultdict(list)
    return sys._lb_spans


def wrap(obj: Any, name: str, label: str) -> None:
    """Replace ``obj.name`` by a wrapper adding its wall time to ``SPANS[label]``."""
    fn = getattr(obj, name)
    if asyncio.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def awrapper(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await fn(*a, **k)
            finally:
                _spans()[label].append(time.perf_counter() - t0)
        setattr(obj, name, awrapper)
    else:
        @functools.wraps(fn)
        def wrapper(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                _spans()[label].append(time.perf_counter() - t0)
        setattr(obj, name, wrapper)


def take() -> dict[str, list[float]]:
    out = dict(_spans())
    _spans().clear()
    return out


def _store_spans(store: Any) -> None:
    ing = store.buf._ingest
    wrap(store.buf, "push", "store.put > buf.push")
    wrap(ing, "_conform", "store.put > buf.push > conform")
    wrap(ing.s.wal, "write", "store.put > buf.push > wal.write")
    wrap(ing.s.index, "record_batch", "store.put > buf.push > index.record_batch")
    wrap(ing.s, "meta_of", "store.put > buf.push > meta_of")
    wrap(ing.s.catalog, "insert_meta", "store.put > buf.push > catalog.insert_meta")
    wrap(store.keys, "append", "store.journal > journal.append")
    wrap(store.buf, "get", "store.get > buf.get")
    wrap(store, "delete", "store.delete")
    wrap(store.buf, "delete", "store.delete > buf.delete")


def _ctrl_spans(ctrl: Any) -> None:
    for name in ("set_custom_meta", "kv_retrieve_meta", "update_production_status", "get_metadata"):
        if hasattr(ctrl, name):
            wrap(ctrl, name, f"ctrl.{name}")
    if getattr(ctrl, "_lakebuffer_journal", None) is not None:  # the journal's parts (LakeBuffer only)
        import lakebuffer.integrations.tq_controller as tc
        import lakebuffer.integrations.tq_journal_log as jl

        wrap(tc, "_state", "ctrl.journal > _state (per sample)")
        wrap(jl.SegmentWriter, "append", "ctrl.journal > append")
        wrap(jl, "frame_of", "ctrl.journal > append > frame_of")


def _install(actor_self: Any, fn: Any) -> None:
    fn(actor_self)


def _take(actor_self: Any) -> dict[str, list[float]]:
    out = take()
    _spans()["_cpu0"].append(time.process_time())  # CPU time of this process from here on
    return out


def _cpu(actor_self: Any = None) -> float:
    return time.process_time() - _spans()["_cpu0"][0]


def _driver_spans(tq: Any, lake: bool) -> None:
    import transfer_queue.interface as tqi

    client = tqi._maybe_create_tq_client()
    wrap(client, "async_kv_retrieve_meta", "drv.kv_retrieve_meta")
    wrap(client, "async_set_custom_meta", "drv.set_custom_meta")
    wrap(client, "async_put", "drv.async_put")
    wrap(client, "async_get_data", "drv.get_data")
    sm = client.storage_manager
    wrap(sm, "put_data", "drv.async_put > put_data")
    wrap(sm, "notify_data_update", "drv.async_put > put_data > notify_data_update")
    if lake:
        sc = sm.storage_client
        wrap(sc, "put_batch", "drv.async_put > put_data > put_batch")
        wrap(sc, "get_batch", "drv.get_data > get_batch")
        call = sc._call

        def _call(method: str, *args: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return call(method, *args)
            finally:
                _spans()[f"drv.ray call {method}"].append(time.perf_counter() - t0)
        sc._call = _call
        import lakebuffer.integrations.transferqueue as lbtq

        wrap(lbtq, "to_arrow", "drv.put_batch > to_arrow")
        wrap(lbtq, "to_field", "drv.get_batch > to_field")
        wrap(lbtq, "read_ipc", "drv.get_batch > read_ipc")


def run(tq: Any, backend: str, length: int, rounds: int, clear: bool = False) -> dict[str, list[float]]:
    import ray
    import torch
    from tensordict import TensorDict

    lake = backend == "LakeBuffer"
    ctrl = ray.get_actor("TransferQueueController", namespace="transfer_queue")
    ray.get(ctrl.__ray_call__.remote(_install, _ctrl_spans))
    store = None
    if lake:
        import lakebuffer.integrations.transferqueue as lbtq

        store = lbtq.store_handle({})
    _driver_spans(tq, lake)
    g = torch.Generator().manual_seed(length)
    fields = TensorDict({"input_ids": torch.randint(0, 150_000, (16, length), generator=g),
                         "logprobs": -torch.rand(16, length, generator=g), "score": torch.rand(16, generator=g)},
                        batch_size=16)
    for r in range(rounds + 5):
        if r == 5:  # warm-up rounds dropped
            _take(None)
            ray.get(ctrl.__ray_call__.remote(_take))
            if store is not None:  # after the first put: it opened the generation with the new fields
                ray.get(store.__ray_call__.remote(_install, _store_spans))
                ray.get(store.__ray_call__.remote(_take))
        keys = [f"p{length}r{r}s{i}" for i in range(16)]
        t0 = time.perf_counter()
        tq.kv_batch_put(keys=keys, partition_id="prof", fields=fields,
                        tags=[{"status": "success", "global_steps": r}] * 16)
        t1 = time.perf_counter()
        tq.kv_batch_get(keys=keys, partition_id="prof", select_fields=["input_ids", "logprobs"])
        t2 = time.perf_counter()
        tq.kv_put(key=keys[0], partition_id="prof", tag={"status": "consumed"})
        t3 = time.perf_counter()
        _spans()["TOTAL kv_batch_put"].append(t1 - t0)
        _spans()["TOTAL kv_batch_get"].append(t2 - t1)
        _spans()["TOTAL tag-only kv_put"].append(t3 - t2)
        if clear:  # the bench's loop: each round's keys cleared before the next put
            tq.kv_clear(keys=keys, partition_id="prof")
            _spans()["TOTAL kv_clear"].append(time.perf_counter() - t3)
    cpu = {"CPU ms/round driver": [_cpu()], "CPU ms/round controller": [ray.get(ctrl.__ray_call__.remote(_cpu))]}
    if store is not None:
        cpu["CPU ms/round store"] = [ray.get(store.__ray_call__.remote(_cpu))]
    out = take()
    out.update(ray.get(ctrl.__ray_call__.remote(_take)))
    if store is not None:
        out.update(ray.get(store.__ray_call__.remote(_take)))
    out.update({k: [v[0] / rounds] for k, v in cpu.items()})
    out.pop("_cpu0", None)
    if not clear:
        tq.kv_clear(keys=[f"p{length}r{r}s{i}" for r in range(rounds + 5) for i in range(16)], partition_id="prof")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--clear", action="store_true", help="kv_clear each round's keys, as bench_tq_durable.py does")
    a = ap.parse_args()


    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf

    import lakebuffer.integrations.transferqueue as lbtq

    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}})
    tq.init(OmegaConf.create({"backend": {"storage_backend": "SimpleStorage"}}))
    base = run(tq, "SimpleStorage", a.length, a.rounds, a.clear)
    tq.close()
    cfg = {"path": f"{tempfile.mkdtemp(prefix='tqprof-')}/run", "snapshot_interval_s": 0, "memory_limit_mb": 2048}
    tq.init(OmegaConf.create({"backend": {"storage_backend": "LakeBuffer", "LakeBuffer": cfg}}))
    lake = run(tq, "LakeBuffer", a.length, a.rounds, a.clear)
    print(f"\n16 x {a.length}, {a.rounds} rounds, load {os.getloadavg()[0]:.2f}; median ms per call (calls/round)")
    for label in sorted(set(base) | set(lake)):
        cells = []
        for spans in (base, lake):
            xs = spans.get(label)
            per = 1.0 if label.startswith("CPU") else len(xs or []) / a.rounds
            cells.append(f"{statistics.median(xs) * 1e3:8.2f} ({per:3.1f})" if xs else " " * 14)
        print(f"  {label:55s} {cells[0]}  {cells[1]}")
    tq.close()
    lbtq.close_store(cfg)
    ray.shutdown()
    shutil.rmtree(os.path.dirname(cfg["path"]), ignore_errors=True)


if __name__ == "__main__":
    main()
