"""verl V1's data plane, durable: TransferQueue 0.1.11 on LakeBuffer vs its in-memory default, one run.

    python benchmarks/bench_tq_durable.py --rounds 100 --restore-keys 50000

In one process and one Ray, TransferQueue is initialised with its default backend (SimpleStorage),
then closed and initialised with LakeBuffer (every acknowledged operation durable: rows in the WAL,
keys and tags in the controller's journal). For each, per call, medians over ``--rounds``:
``kv_batch_put`` of 16 samples x L tokens (int64 ids + float32 logprobs + a score, with tags),
``kv_batch_get`` of both token fields, a single-field get, a tag-only ``kv_put``; L = 4096 and 16384.
Then the restore: ``--restore-keys`` keys (batches of 1000, a score each, tags), ``tq.close()``, and
``tq.init`` on the same path to the first ``kv_batch_get``: O(metadata), what a restarted job pays
beyond Ray's own start (the journal folded and given back to a new controller).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time


def _median_ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1e3


def measure(tq, backend: str, lengths: list[int], rounds: int) -> dict[str, float]:
    import torch
    from tensordict import TensorDict

    out = {}
    for L in lengths:
        g = torch.Generator().manual_seed(L)
        fields = TensorDict({"input_ids": torch.randint(0, 150_000, (16, L), generator=g),
                             "logprobs": -torch.rand(16, L, generator=g), "score": torch.rand(16, generator=g)},
                            batch_size=16)
        puts, gets, singles, tags = [], [], [], []
        for r in range(rounds):
            keys = [f"L{L}r{r}s{i}" for i in range(16)]
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
            puts.append(t1 - t0)
            gets.append(t2 - t1)
            singles.append(t3 - t2)
            tags.append(t4 - t3)
        out.update({f"put_{L}": _median_ms(puts), f"get_{L}": _median_ms(gets), f"get1_{L}": _median_ms(singles),
                    f"tag_{L}": _median_ms(tags)})
        print(f"  {backend:13s} 16 x {L:5d}: put {out[f'put_{L}']:6.1f} ms  get {out[f'get_{L}']:6.1f} ms  "
              f"single-field get {out[f'get1_{L}']:6.1f} ms  tag-only kv_put {out[f'tag_{L}']:5.1f} ms", flush=True)
    return out


def restore(tq, conf, n: int) -> None:
    import torch
    from tensordict import TensorDict

    t0 = time.perf_counter()
    for start in range(0, n, 1000):
        k = min(1000, n - start)
        tq.kv_batch_put(keys=[f"r{start + i}" for i in range(k)], partition_id="restore",
                        fields=TensorDict({"score": torch.rand(k)}, batch_size=k),
                        tags=[{"status": "finished", "global_steps": 1}] * k)
    print(f"  {n} keys put in {time.perf_counter() - t0:.1f} s", flush=True)
    tq.close()
    t0 = time.perf_counter()
    tq.init(conf)
    t1 = time.perf_counter()
    got = tq.kv_batch_get(keys=[f"r{n - 1}"], partition_id="restore", select_fields="score")
    t2 = time.perf_counter()
    assert got["score"].numel() == 1 and len(tq.kv_list("restore")["restore"]) == n
    import transfer_queue.interface as tqi

    hook = tqi._TQ_STORAGE["LakeBuffer"]["restore_s"]  # the bootstrap hook's own time: journal -> controller
    print(f"  restore of {n} keys: tq.init {t1 - t0:.2f} s (of which the journal's fold and the controller's "
          f"restore {hook:.2f} s; the rest is Ray starting the new controller's worker), to the first sample "
          f"{t2 - t0:.2f} s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--lengths", default="4096,16384")
    ap.add_argument("--restore-keys", type=int, default=50_000)
    a = ap.parse_args()

    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf

    import lakebuffer.integrations.transferqueue as lbtq

    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False)
    lengths = [int(x) for x in a.lengths.split(",")]
    tq.init(OmegaConf.create({"backend": {"storage_backend": "SimpleStorage"}}))
    base = measure(tq, "SimpleStorage", lengths, a.rounds)
    tq.close()
    cfg = {"path": f"{tempfile.mkdtemp(prefix='tqdurable-')}/run", "snapshot_interval_s": 0, "memory_limit_mb": 2048}
    conf = OmegaConf.create({"backend": {"storage_backend": "LakeBuffer", "LakeBuffer": cfg}})
    tq.init(conf)
    lake = measure(tq, "LakeBuffer", lengths, a.rounds)
    for L in lengths:
        print(f"  ratio LakeBuffer/SimpleStorage 16 x {L}: put {lake[f'put_{L}'] / base[f'put_{L}']:.2f}x  "
              f"get {lake[f'get_{L}'] / base[f'get_{L}']:.2f}x  single-field get "
              f"{lake[f'get1_{L}'] / base[f'get1_{L}']:.2f}x  tag-only {lake[f'tag_{L}'] / base[f'tag_{L}']:.2f}x")
    if a.restore_keys:
        restore(tq, conf, a.restore_keys)
    tq.close()
    lbtq.close_store(cfg)
    ray.shutdown()


if __name__ == "__main__":
    main()
