"""verl V1's data plane, durable: TransferQueue 0.1.11 on LakeBuffer vs its in-memory default, one run.

    python benchmarks/bench_tq_durable.py --rounds 100 --blocks 4 --restore-keys 50000

In one process and one Ray, TransferQueue is initialised with its default backend (SimpleStorage)
and with LakeBuffer (every acknowledged operation durable: rows in the WAL, keys and tags in the
controller's journal) in alternated blocks (``tq.close`` / ``tq.init`` between), so both see the
same load. Per call, medians over ``--rounds``: ``kv_batch_put`` of 16 samples x L tokens (int64 ids
+ float32 logprobs + a score, with tags), ``kv_batch_get`` of both token fields, a single-field get,
a tag-only ``kv_put``, the ``kv_clear`` of the 16 keys; L = 4096 and 16384.

Then the restore: a job puts ``--restore-keys`` keys (batches of 1000, a score each, tags) and is
SIGKILLed with its whole Ray; then, alternated, a fresh process and Ray runs ``tq.init`` to the first
``kv_batch_get`` for LakeBuffer on that path and for SimpleStorage (its own start: Ray starting the
controller's and the storage units' workers). LakeBuffer's restore beyond Ray's own start is the
difference of the two.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time


def _median_ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1e3


def measure(tq, lengths: list[int], rounds: int, block: int, out: dict[str, list[float]]) -> None:
    """``rounds`` rounds of each call per length; the seconds of each call appended to ``out``."""
    import torch
    from tensordict import TensorDict

    for L in lengths:
        g = torch.Generator().manual_seed(L)
        fields = TensorDict({"input_ids": torch.randint(0, 150_000, (16, L), generator=g),
                             "logprobs": -torch.rand(16, L, generator=g), "score": torch.rand(16, generator=g)},
                            batch_size=16)
        for r in range(rounds + 3):
            keys = [f"L{L}b{block}r{r}s{i}" for i in range(16)]
            t0 = time.perf_counter()
            tq.kv_batch_put(keys=keys, partition_id="bench", fields=fields,
                            tags=[{"status": "success", "global_steps": r}] * 16)
            t1 = time.perf_counter()
            got = tq.kv_batch_get(keys=keys, partition_id="bench", select_fields=["input_ids", "logprobs"])
            t2 = time.perf_counter()
            tq.kv_batch_get(keys=keys, partition_id="bench", select_fields="logprobs")
            t3 = time.perf_counter()
            tq.kv_put(key=keys[0], partition_id="bench", tag={"status": "consumed"})
            t4 = time.perf_counter()
            if r == 0:
                assert torch.equal(got["input_ids"][3], fields["input_ids"][3])
            tq.kv_clear(keys=keys, partition_id="bench")
            t5 = time.perf_counter()
            if r < 3:
                continue  # warm-up (the first put of a field adds its column)
            for name, dt in (("put", t1 - t0), ("get", t2 - t1), ("get1", t3 - t2), ("tag", t4 - t3), ("clear", t5 - t4)):
                out.setdefault(f"{name}_{L}", []).append(dt)


def child_fill(path: str, n: int) -> None:
    """A job that puts ``n`` keys on LakeBuffer at ``path``, says ACKED and waits for its SIGKILL."""
    import ray
    import torch
    import transfer_queue as tq
    from omegaconf import OmegaConf
    from tensordict import TensorDict

    import lakebuffer.integrations.transferqueue  # noqa: F401 - registers the backend

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    tq.init(OmegaConf.create({"backend": {"storage_backend": "LakeBuffer", "LakeBuffer": _cfg(path)}}))
    for start in range(0, n, 1000):
        k = min(1000, n - start)
        tq.kv_batch_put(keys=[f"r{start + i}" for i in range(k)], partition_id="restore",
                        fields=TensorDict({"score": torch.rand(k)}, batch_size=k),
                        tags=[{"status": "finished", "global_steps": 1}] * k)
    print("ACKED", flush=True)
    time.sleep(3600)


def _cfg(path: str) -> dict:
    return {"path": path, "snapshot_interval_s": 0, "memory_limit_mb": 2048}


def child_start(backend: str, path: str, n: int) -> None:
    """A fresh process and Ray: ray.init, tq.init, the first sample; prints the times as JSON."""
    import json

    t0 = time.perf_counter()
    import ray
    import torch
    import transfer_queue as tq
    from omegaconf import OmegaConf
    from tensordict import TensorDict

    import lakebuffer.integrations.transferqueue  # noqa: F401 - registers the backend
    t_import = time.perf_counter()
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    t_ray = time.perf_counter()
    backend_conf = {"storage_backend": backend, **({backend: _cfg(path)} if backend == "LakeBuffer" else {})}
    tq.init(OmegaConf.create({"backend": backend_conf}))
    t_init = time.perf_counter()
    if backend != "LakeBuffer":  # nothing to restore: the first sample is one just put (its put not timed)
        tq.kv_batch_put(keys=[f"r{n - 1}"], partition_id="restore",
                        fields=TensorDict({"score": torch.rand(1)}, batch_size=1))
    t_put = time.perf_counter()
    got = tq.kv_batch_get(keys=[f"r{n - 1}"], partition_id="restore", select_fields="score")
    t_get = time.perf_counter()
    assert got["score"].numel() == 1
    out = {"import_s": t_import - t0, "ray_init_s": t_ray - t_import, "tq_init_s": t_init - t_ray,
           "first_get_s": t_get - t_put, "to_first_sample_s": (t_init - t_ray) + (t_get - t_put)}
    if backend == "LakeBuffer":
        import transfer_queue.interface as tqi

        out["restore_hook_s"] = tqi._TQ_STORAGE["LakeBuffer"]["restore_s"]
        out["listed"] = len(tq.kv_list("restore")["restore"])
    print("RESULT " + json.dumps(out), flush=True)
    ray.shutdown()


def restore_fresh(n: int, runs: int) -> None:
    """SIGKILL of a whole job holding ``n`` keys, then tq.init in a fresh process and Ray: LakeBuffer
    against SimpleStorage's own fresh start (Ray + its controller and storage actors), alternated."""
    import json
    import signal
    import subprocess
    import sys

    import psutil

    path = f"{tempfile.mkdtemp(prefix='tqrestore-')}/run"
    env = {**os.environ}
    fill = subprocess.Popen([sys.executable, __file__, "--child", "fill", path, str(n)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    while not fill.stdout.readline().startswith("ACKED"):
        if fill.poll() is not None:
            raise RuntimeError("the fill job died")
    procs = [psutil.Process(fill.pid), *psutil.Process(fill.pid).children(recursive=True)]
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=30)
    print(f"  {n} keys put, the job SIGKILLed ({len(procs)} processes)", flush=True)
    results: dict[str, list[dict]] = {"SimpleStorage": [], "LakeBuffer": []}
    for _ in range(runs):
        for backend in results:
            out = subprocess.run([sys.executable, __file__, "--child", "start", backend, path, str(n)], env=env,
                                 capture_output=True, text=True, timeout=600)
            line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
            if not line:
                raise RuntimeError(out.stderr[-3000:])
            results[backend].append(json.loads(line[0][7:]))
    med = {b: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for b, rs in results.items()}
    for b, m in med.items():
        print(f"  {b:13s} fresh process (median of {runs}): ray.init {m['ray_init_s']:.2f} s, tq.init "
              f"{m['tq_init_s']:.2f} s, first get {m['first_get_s'] * 1e3:.1f} ms, tq.init to first sample "
              f"{m['to_first_sample_s']:.2f} s" + (f" (journal -> controller {m['restore_hook_s']:.2f} s, "
                                                   f"{int(m['listed'])} keys listed)" if b == "LakeBuffer" else ""),
              flush=True)
    beyond = med["LakeBuffer"]["to_first_sample_s"] - med["SimpleStorage"]["to_first_sample_s"]
    print(f"  LakeBuffer's restore of {n} keys beyond SimpleStorage's own start: {beyond:.2f} s "
          f"(target <= 3 s)", flush=True)
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def main() -> None:
    import sys

    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        if sys.argv[2] == "fill":
            return child_fill(sys.argv[3], int(sys.argv[4]))
        return child_start(sys.argv[3], sys.argv[4], int(sys.argv[5]))
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--lengths", default="4096,16384")
    ap.add_argument("--restore-keys", type=int, default=50_000)
    ap.add_argument("--restore-runs", type=int, default=3, help="fresh-process restores per backend (alternated)")
    ap.add_argument("--blocks", type=int, default=2, help="SimpleStorage / LakeBuffer blocks, alternated")
    a = ap.parse_args()


    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf

    import lakebuffer.integrations.transferqueue as lbtq

    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False)
    lengths = [int(x) for x in a.lengths.split(",")]
    cfg = _cfg(f"{tempfile.mkdtemp(prefix='tqdurable-')}/run")
    confs = {"SimpleStorage": OmegaConf.create({"backend": {"storage_backend": "SimpleStorage"}}),
             "LakeBuffer": OmegaConf.create({"backend": {"storage_backend": "LakeBuffer", "LakeBuffer": cfg}})}
    raw: dict[str, dict[str, list[float]]] = {b: {} for b in confs}
    loads = []
    per_block = max(1, a.rounds // a.blocks)
    for block in range(a.blocks):  # alternated blocks: both backends see the same load swings
        for backend, conf in confs.items():
            tq.init(conf)
            measure(tq, lengths, per_block, block, raw[backend])
            tq.close()
            loads.append(os.getloadavg()[0])
    med = {b: {k: _median_ms(v) for k, v in r.items()} for b, r in raw.items()}
    print(f"  {per_block * a.blocks} rounds per backend in {a.blocks} alternated blocks; load average "
          f"{min(loads):.2f}-{max(loads):.2f}", flush=True)
    for L in lengths:
        for b in confs:
            m = med[b]
            print(f"  {b:13s} 16 x {L:5d}: put {m[f'put_{L}']:6.2f} ms  get {m[f'get_{L}']:6.2f} ms  single-field "
                  f"get {m[f'get1_{L}']:6.2f} ms  tag-only kv_put {m[f'tag_{L}']:5.2f} ms  kv_clear "
                  f"{m[f'clear_{L}']:6.2f} ms", flush=True)
        lake, base = med["LakeBuffer"], med["SimpleStorage"]
        print(f"  ratio LakeBuffer/SimpleStorage 16 x {L}: put {lake[f'put_{L}'] / base[f'put_{L}']:.2f}x  "
              f"get {lake[f'get_{L}'] / base[f'get_{L}']:.2f}x  single-field get "
              f"{lake[f'get1_{L}'] / base[f'get1_{L}']:.2f}x  tag-only {lake[f'tag_{L}'] / base[f'tag_{L}']:.2f}x  "
              f"kv_clear {lake[f'clear_{L}'] / base[f'clear_{L}']:.2f}x",
              flush=True)
    lbtq.close_store(cfg)
    ray.shutdown()
    shutil.rmtree(os.path.dirname(cfg["path"]), ignore_errors=True)
    if a.restore_keys:
        restore_fresh(a.restore_keys, a.restore_runs)

if __name__ == "__main__":
    main()
