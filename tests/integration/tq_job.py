"""A verl-V1-shaped TransferQueue job on the LakeBuffer backend, run as its own process by the tests.

``python tq_job.py PATH`` starts Ray, ``tq.init``s the backend on PATH, makes the acknowledged
operations of :func:`expected` (kv puts with tags, a BatchMeta put, tag-only updates, clears), prints
``ACKED <pids>`` and waits to be killed: the test SIGKILLs this process and every process of its Ray.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

N = 200  # kv_put calls, one key each
L = 64  # tokens per sample
RETAGGED = range(0, 40, 2)  # keys whose tag a tag-only kv_put changed afterwards
CLEARED = range(100, 110)  # keys kv_clear removed
TAG_ONLY = 5  # keys that only ever got a tag (no fields)


def config(path: str) -> dict[str, Any]:
    return {"path": path, "snapshot_interval_s": 0, "memory_limit_mb": 64}


def sample(i: int) -> dict[str, Any]:
    """The fields of key ``k<i>``: int64 token ids, float32 logprobs, a score (bit-exact checks)."""
    import torch

    g = torch.Generator().manual_seed(1000 + i)
    return {"input_ids": torch.randint(0, 150_000, (L,), generator=g),
            "logprobs": -torch.rand(L, generator=g), "score": torch.rand((), generator=g)}


def expected() -> tuple[dict[str, dict], dict[str, dict]]:
    """What must come back: {key: tag} of partition "rollouts" and of partition "status"."""
    tags = {f"k{i}": {"status": "success", "global_steps": i // 16, "uid": f"u{i // 4}"} for i in range(N)}
    for i in RETAGGED:  # TransferQueue merges a tag update into the key's tags
        tags[f"k{i}"].update({"status": "consumed", "global_steps": 99})
    for i in CLEARED:
        del tags[f"k{i}"]
    status = {f"t{i}": {"status": "running", "attempt": 2} for i in range(TAG_ONLY)}
    return tags, status


GROUPS, N_SESSIONS, RESP = 8, 4, 6  # verl mode: GRPO prompts, sessions per prompt, max response tokens


def trajectory(uid: int, session: int) -> dict[str, Any]:
    """One verl V1 trajectory's fields (what the agent loop puts), deterministic for bit-exact checks."""
    import torch

    g = torch.Generator().manual_seed(10_000 + 10 * uid + session)
    n = int(torch.randint(1, RESP + 1, (1,), generator=g))
    rm = torch.zeros(RESP)
    rm[n - 1] = 0.5 if uid == 5 else float(torch.rand((), generator=g))  # group 5: one reward for all (DAPO)
    return {"prompts": torch.randint(0, 150_000, (4,), generator=g),
            "responses": torch.randint(0, 150_000, (n,), generator=g), "rm_scores": rm,
            "extra_fields": {"reward_extra_info": {"acc": float(rm.sum())}, "turns": session}}


def run_verl(path: str) -> None:
    """verl V1's producer side (trainer_base + agent_loop_tq): prompts pending -> running -> finished,
    trajectories with tags; group 7 is still running when the job dies."""
    import ray
    import torch
    import transfer_queue as tq
    from omegaconf import OmegaConf
    from tensordict import NonTensorStack, TensorDict

    import lakebuffer.integrations.transferqueue as lbtq

    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False)
    cfg = config(path)
    tq.init(OmegaConf.create({"backend": {"storage_backend": "LakeBuffer", "LakeBuffer": cfg}}))
    uids = [f"u{i}" for i in range(GROUPS)]
    batch = TensorDict({"raw_prompt": NonTensorStack(*[[{"role": "user", "content": f"q{i}"}] for i in range(GROUPS)]),
                        "index": torch.arange(GROUPS), "uid": NonTensorStack(*uids)}, batch_size=GROUPS)
    tq.kv_batch_put(keys=uids, partition_id="train", fields=batch,
                    tags=[{"is_prompt": True, "status": "pending", "global_steps": 1 + i // 4} for i in range(GROUPS)])
    for i, uid in enumerate(uids):
        tq.kv_put(key=uid, partition_id="train", tag={"status": "running"})
        if i == GROUPS - 1:
            break
        trajs = [trajectory(i, s) for s in range(N_SESSIONS)]
        fields = TensorDict({
            "prompts": torch.stack([t["prompts"] for t in trajs]),
            "responses": torch.nested.nested_tensor([t["responses"] for t in trajs], layout=torch.jagged),
            "rm_scores": torch.stack([t["rm_scores"] for t in trajs]),
            "extra_fields": NonTensorStack(*[t["extra_fields"] for t in trajs])}, batch_size=N_SESSIONS)
        tq.kv_batch_put(keys=[f"{uid}_{s}_0" for s in range(N_SESSIONS)], partition_id="train", fields=fields,
                        tags=[{"status": "success", "global_steps": 1 + i // 4, "response_len": len(t["responses"])}
                              for t in trajs])
        tq.kv_put(key=uid, partition_id="train", tag={"status": "finished"})
    pids = [os.getpid(), ray.get(lbtq.store_handle(cfg).pid.remote())]
    print("ACKED " + json.dumps(pids), flush=True)
    time.sleep(3600)


def run(path: str) -> None:
    import ray
    import torch
    import transfer_queue as tq
    from omegaconf import OmegaConf
    from tensordict import TensorDict

    import lakebuffer.integrations.transferqueue as lbtq

    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False)
    cfg = config(path)
    tq.init(OmegaConf.create({"backend": {"storage_backend": "LakeBuffer", "LakeBuffer": cfg}}))
    for i in range(N):
        tq.kv_put(key=f"k{i}", partition_id="rollouts", fields=sample(i),
                  tag={"status": "success", "global_steps": i // 16, "uid": f"u{i // 4}"})
    for i in RETAGGED:  # tag-only updates: client -> controller, no storage call
        tq.kv_put(key=f"k{i}", partition_id="rollouts", tag={"status": "consumed", "global_steps": 99})
    tq.kv_clear(keys=[f"k{i}" for i in CLEARED], partition_id="rollouts")
    for i in range(TAG_ONLY):
        tq.kv_put(key=f"t{i}", partition_id="status", tag={"status": "running", "attempt": 1})
        tq.kv_put(key=f"t{i}", partition_id="status", tag={"status": "running", "attempt": 2})
    # the classic BatchMeta API: a put without keys or tags, then a clear of half of it
    client = tq.get_client()
    meta = client.put(data=TensorDict({"prompts": torch.arange(32).reshape(8, 4)}, batch_size=8), partition_id="classic")
    client.clear_samples(meta.select_samples(list(range(4, 8))))
    got = client.get_meta(data_fields=["prompts"], batch_size=2, partition_id="classic", mode="fetch", task_name="train")
    assert got.size == 2  # task "train" consumed two of the four left
    pids = [os.getpid(), ray.get(lbtq.store_handle(cfg).pid.remote())]
    print("ACKED " + json.dumps(pids), flush=True)
    time.sleep(3600)


def run_and_exit(path: str) -> None:
    """A job that ends normally without tq.close() or close_store(): the store must end with it, closed."""
    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf

    import lakebuffer.integrations.transferqueue  # noqa: F401  registers the backend

    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False)
    tq.init(OmegaConf.create({"backend": {"storage_backend": "LakeBuffer", "LakeBuffer": config(path)}}))
    for i in range(5):
        tq.kv_put(key=f"k{i}", partition_id="rollouts", fields=sample(i), tag={"status": "success"})
    print("ACKED []", flush=True)


if __name__ == "__main__":
    {"verl": run_verl, "exit": run_and_exit}.get(sys.argv[2] if sys.argv[2:] else "", run)(sys.argv[1])
