"""Put/get throughput of TransferQueue 0.1.11 with the LakeBuffer backend vs its SimpleStorage default.

    python benchmarks/bench_transferqueue.py --backend LakeBuffer  --batch 256 --prompt 512 --response 1024
    python benchmarks/bench_transferqueue.py --backend SimpleStorage ...

One process per backend (TransferQueue's controller is a named singleton). Each round puts a
generated batch (prompts, then responses + log-probs + scores, as a trainer does) into a fresh
partition, reads every field back through ``get_meta``/``get_data`` and clears it; medians printed.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="LakeBuffer", choices=["LakeBuffer", "SimpleStorage"])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--response", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()

    import ray
    import torch
    import transfer_queue as tq
    from omegaconf import OmegaConf
    from tensordict import TensorDict

    import lakebuffer.integrations.transferqueue as lbtq

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    tmp = tempfile.mkdtemp(prefix="tqbench-")
    backend = {"storage_backend": a.backend}
    if a.backend == "LakeBuffer":
        backend["LakeBuffer"] = {"path": f"{tmp}/run", "snapshot_interval_s": 0, "memory_limit_mb": 4096,
                                 "columns": {"prompt_ids": "prompts", "response_ids": "responses",
                                             "response_logprobs": "old_log_probs", "reward": "score"}}
    tq.init(OmegaConf.create({"controller": {"polling_mode": True}, "backend": backend}))
    client = tq.get_client()
    b = a.batch
    g = torch.Generator().manual_seed(0)
    prompts = TensorDict({"prompts": torch.randint(0, 150_000, (b, a.prompt), generator=g)}, batch_size=b)
    gen = TensorDict({"responses": torch.randint(0, 150_000, (b, a.response), generator=g),
                      "old_log_probs": -torch.rand(b, a.response, generator=g),
                      "score": torch.rand(b, generator=g)}, batch_size=b)
    nbytes = sum(t.numel() * t.element_size() for t in (*prompts.values(), *gen.values()))
    puts, gets = [], []
    for r in range(a.rounds):
        part = f"bench{r}"
        t0 = time.perf_counter()
        meta = client.put(data=prompts, partition_id=part)
        client.put(data=gen, metadata=meta)
        t1 = time.perf_counter()
        m = client.get_meta(data_fields=["prompts", "responses", "old_log_probs", "score"], batch_size=b,
                            partition_id=part, mode="fetch", task_name="bench")
        got = client.get_data(m)
        t2 = time.perf_counter()
        resp = got["responses"]
        assert torch.equal(torch.stack(resp.unbind()) if resp.is_nested else resp, gen["responses"])
        client.clear_samples(m)
        puts.append(t1 - t0)
        gets.append(t2 - t1)
    mb = nbytes / 2**20
    print(f"{a.backend}: batch {b} x ({a.prompt}+{a.response}) tokens, {mb:.1f} MiB of tensors per round; "
          f"put {statistics.median(puts) * 1e3:.0f} ms ({mb / statistics.median(puts):.0f} MiB/s), "
          f"get {statistics.median(gets) * 1e3:.0f} ms ({mb / statistics.median(gets):.0f} MiB/s) (medians of {a.rounds})")
    tq.close()
    lbtq.close_store()
    ray.shutdown()


if __name__ == "__main__":
    main()
