"""The lakebuffer backend under the real TransferQueue 0.1.11 on a local Ray (CPU only).

Everything goes through TransferQueue's own client (``tq.init`` with ``storage_backend:
LakeBuffer``, ``put`` / ``get_meta`` / ``get_data`` / ``clear_samples``); the store actor is killed
with SIGKILL to check that acknowledged puts come back, and the rows are read with SQL, from the
live buffer and from the lake after a snapshot.
"""

from __future__ import annotations

import os
import signal
import time
import uuid

import numpy as np
import pyarrow as pa
import pytest

torch = pytest.importorskip("torch", reason="the TransferQueue backend needs torch (CPU wheel)")
pytest.importorskip("tensordict", reason="the TransferQueue backend needs tensordict")
ray = pytest.importorskip("ray", reason="TransferQueue runs on Ray")
tq = pytest.importorskip("transfer_queue", reason="transferqueue==0.1.11 is not installed "
                         "(pip install -r requirements-integration.txt)")

import lakebuffer as lb  # noqa: E402
from lakebuffer.errors import SchemaError  # noqa: E402
from lakebuffer.integrations import transferqueue as lbtq  # noqa: E402

B, P, R = 8, 6, 5


@pytest.fixture(scope="module")
def tq_system(tmp_path_factory):
    """TransferQueue with the LakeBuffer backend: the controller, the store actor, the client."""
    from omegaconf import OmegaConf
    from tensordict import NonTensorStack  # noqa: F401  (imported here so a skip happens above)

    started = not ray.is_initialized()
    if started:  # the documented setup: Ray imports the backend in every worker it starts
        ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False,
                 runtime_env={"worker_process_setup_hook": "lakebuffer.integrations.transferqueue.register"})
    path = tmp_path_factory.mktemp("tq") / "run"
    cfg = {
        "path": str(path), "snapshot_interval_s": 0, "memory_limit_mb": 64, "run_id": "tq-test",
        "columns": {"prompt_ids": "prompts", "response_ids": "responses", "response_logprobs": "old_log_probs",
                    "reward": "score", "prompt_id": "uid", "policy_version": "version"},
        "fields": {"attention_mask": "list<int8>", "values": "list<float32>", "extra_fields": "json"},
    }
    tq.init(OmegaConf.create({"controller": {"polling_mode": True},
                              "backend": {"storage_backend": "LakeBuffer", "LakeBuffer": cfg}}))
    yield {"client": tq.get_client(), "cfg": cfg, "path": path, "hook": started,
           "store": lbtq.LakeBufferStorageClient(cfg)}
    tq.close()
    lbtq.close_store(cfg)
    if started:
        ray.shutdown()


def rollouts(seed: int, n: int = B):
    """Two puts as a trainer makes them: the prompts, then the generation with its scores."""
    from tensordict import NonTensorStack, TensorDict

    g = torch.Generator().manual_seed(seed)
    prompts = TensorDict({
        "prompts": torch.randint(0, 150_000, (n, P), generator=g),
        "uid": NonTensorStack(*[f"q{seed}-{i // 4}" for i in range(n)]),
        "attention_mask": (torch.rand(n, P + R, generator=g) > 0.2).long(),
    }, batch_size=n)
    lengths = torch.randint(1, R + 1, (n,), generator=g)
    generation = TensorDict({
        "responses": torch.nested.nested_tensor(
            [torch.randint(0, 150_000, (int(k),), generator=g) for k in lengths], layout=torch.jagged),
        "old_log_probs": -torch.rand(n, R, generator=g),
        "score": torch.rand(n, generator=g),
        "version": torch.full((n,), seed, dtype=torch.int64),
        "values": torch.randn(n, R, 2, generator=g).to(torch.bfloat16),
        # verl V1 puts Python dicts (extra_fields, metrics): declared json, stored as JSON text
        "extra_fields": NonTensorStack(*[{"turns": i, "tool": None, "scores": [0.5, i]} for i in range(n)]),
    }, batch_size=n)
    return prompts, generation


def put_both(client, partition: str, seed: int):
    prompts, generation = rollouts(seed)
    meta = client.put(data=prompts, partition_id=partition)
    client.put(data=generation, metadata=meta)
    return prompts, generation


def fetch(client, partition: str, fields: list[str], n: int = B):
    meta = client.get_meta(data_fields=fields, batch_size=n, partition_id=partition, mode="fetch",
                           task_name=f"t-{uuid.uuid4().hex[:6]}")
    assert meta.size == n
    return meta, client.get_data(meta)


def dense(t):
    """A field TransferQueue handed back jagged (as its default backend does for per-sample dims), stacked."""
    assert t.is_nested and t.layout == torch.jagged
    return torch.stack(t.unbind())


def assert_same(got, prompts, generation):
    assert torch.equal(dense(got["prompts"]), prompts["prompts"]) and got["prompts"].dtype == torch.int64
    assert torch.equal(dense(got["attention_mask"]), prompts["attention_mask"])
    assert got["uid"].tolist() == prompts["uid"].tolist()
    assert got["responses"].is_nested
    for a, b in zip(got["responses"].unbind(), generation["responses"].unbind(), strict=True):
        assert torch.equal(a, b)
    assert torch.equal(dense(got["old_log_probs"]), generation["old_log_probs"])
    assert not got["score"].is_nested and torch.equal(got["score"], generation["score"])  # 1-D: dense (B,)
    assert got["values"].dtype == torch.bfloat16 and torch.equal(dense(got["values"]), generation["values"])
    assert got["extra_fields"].tolist() == generation["extra_fields"].tolist()


ALL = ["prompts", "uid", "attention_mask", "responses", "old_log_probs", "score", "version", "values",
       "extra_fields"]


def test_round_trip_and_clear_through_transferqueue_client(tq_system):
    client, store = tq_system["client"], tq_system["store"]
    prompts, generation = put_both(client, "rt", seed=1)
    meta, got = fetch(client, "rt", ALL)
    assert_same(got, prompts, generation)

    # stored as typed Arrow columns of the rollout schema, not as blobs: SQL sees the token ids
    rows = store.sql("SELECT tq_index, response_ids, reward, prompt_id FROM rollouts "
                     "WHERE tq_partition = 'rt' AND tq_fields LIKE '%,score,%' ORDER BY tq_index")
    assert rows.schema.field("response_ids").type == pa.list_(pa.int32())
    order = np.argsort(meta.global_indexes)
    want = [generation["responses"].unbind()[i].tolist() for i in order]
    assert rows.column("response_ids").to_pylist() == want
    np.testing.assert_allclose(rows.column("reward").to_numpy(), generation["score"].numpy()[order], rtol=1e-6)
    uid_rows = store.sql("SELECT prompt_id FROM rollouts WHERE tq_partition = 'rt' AND tq_fields LIKE '%,uid,%' "
                         "ORDER BY tq_index")
    assert uid_rows.column("prompt_id").to_pylist() == [prompts["uid"].tolist()[i] for i in order]

    client.clear_samples(meta)
    assert store.sql("SELECT count(*) AS n FROM rollouts WHERE tq_partition = 'rt'").column("n")[0].as_py() == 0


def test_acknowledged_puts_survive_kill_9_of_the_store(tq_system):
    client, store = tq_system["client"], tq_system["store"]
    prompts, generation = put_both(client, "crash", seed=2)  # acknowledged: returned to the caller
    handle = lbtq.store_handle(tq_system["cfg"])
    before = ray.get(handle.tiers.remote())
    assert before["warm"] == 0 and before["wal_segments"] > 0  # in RAM and the WAL only: the WAL must bring them back
    pid = ray.get(handle.pid.remote())
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 90
    while True:  # Ray restarts the actor (max_restarts=-1); its open replays the WAL
        try:
            new_pid = ray.get(handle.pid.remote(), timeout=10)
            if new_pid != pid:
                break
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):
            pass
        assert time.monotonic() < deadline, "the store actor was not restarted"
        time.sleep(0.2)

    assert ray.get(handle.tiers.remote())["hot"] == before["hot"]  # replayed into RAM from the WAL
    _, got = fetch(client, "crash", ALL)  # the controller still knows the rows; the store has them again
    assert_same(got, prompts, generation)
    n = store.sql("SELECT count(*) AS n FROM rollouts WHERE tq_partition = 'crash'").column("n")[0].as_py()
    assert n == 2 * B  # one row per sample per put, none lost, none doubled
    put_both(client, "after-crash", seed=3)  # and the restarted store takes new puts
    assert store.sql("SELECT count(*) AS n FROM rollouts WHERE tq_partition = 'after-crash'").column("n")[0].as_py() == 2 * B


def test_stored_rollouts_answer_sql_live_and_in_the_lake(tq_system):
    client, store = tq_system["client"], tq_system["store"]
    scores = {}
    for seed, part in ((4, "sql_a"), (5, "sql_b")):
        _, generation = put_both(client, part, seed=seed)
        scores[part] = generation["score"].double().mean().item()
    query = ("SELECT tq_partition, count(*) AS n, avg(reward) AS avg_reward, max(policy_version) AS version "
             "FROM rollouts WHERE tq_partition LIKE 'sql_%' AND tq_fields LIKE '%,score,%' GROUP BY 1 ORDER BY 1")
    live = store.sql(query).to_pylist()
    assert [r["tq_partition"] for r in live] == ["sql_a", "sql_b"]
    assert [r["n"] for r in live] == [B, B] and [r["version"] for r in live] == [4, 5]
    for r in live:
        assert r["avg_reward"] == pytest.approx(scores[r["tq_partition"]], rel=1e-6)

    rows = ray.get(lbtq.store_handle(tq_system["cfg"]).snapshot.remote())
    assert rows > 0
    view = lb.ReplayBuffer.open_lake(str(tq_system["path"] / "lake"))
    assert view.sql(query).to_pylist() == live

    client.clear_partition("sql_a")  # TransferQueue's partition clear reaches every row of it
    left = store.sql("SELECT tq_partition, count(*) AS n FROM rollouts WHERE tq_partition LIKE 'sql_%' GROUP BY 1")
    assert left.to_pylist() == [{"tq_partition": "sql_b", "n": 2 * B}]


def test_a_ray_worker_reads_through_its_own_transferqueue_client(tq_system):
    """verl's workers are other processes: each has the backend imported (by the Ray setup hook the
    docs show, or by hand), calls tq.init() and attaches to the running controller."""
    prompts, generation = put_both(tq_system["client"], "worker", seed=6)
    by_hand = not tq_system["hook"]

    @ray.remote(num_cpus=0)
    def consume() -> dict:
        import transfer_queue as tq_w

        if by_hand:
            import lakebuffer.integrations.transferqueue  # noqa: F401  (registers the backend here)
        tq_w.init()  # attaches to the running controller; builds a LakeBuffer storage manager
        client = tq_w.get_client()
        meta = client.get_meta(data_fields=["responses", "score"], batch_size=B, partition_id="worker",
                               mode="fetch", task_name="worker")
        got = client.get_data(meta)
        return {"responses": [t.tolist() for t in got["responses"].unbind()],
                "score": got["score"].reshape(-1).tolist(), "kind": type(client.storage_manager).__name__}

    out = ray.get(consume.remote(), timeout=120)
    assert out["kind"] == "LakeBufferStorageManager"
    assert out["responses"] == [t.tolist() for t in generation["responses"].unbind()]
    assert out["score"] == generation["score"].tolist()


def test_the_kv_interface_verl_v1_uses(tq_system):
    """verl V1's agent loop: kv_put (tags only), kv_batch_put (fields + tags), kv_batch_get, kv_list, kv_clear."""
    store = tq_system["store"]
    prompts, generation = rollouts(seed=8, n=4)
    keys = [f"uid{i}_s0_0" for i in range(4)]
    for k in keys:
        tq.kv_put(key=k, partition_id="kv", tag={"status": "running"})
    tq.kv_batch_put(keys=keys, partition_id="kv", fields=generation.select("responses", "score", "extra_fields"),
                    tags=[{"status": "success", "global_steps": 3}] * 4)
    assert set(tq.kv_list("kv")["kv"]) == set(keys)
    # the controller (on the store's node) appended the keys and tags to its own journal segment
    from lakebuffer.integrations.tq_journal_log import read_frames

    logged = [r for seg in sorted((tq_system["path"] / "tq-keys.d").glob("*.log")) for t in read_frames(seg)
              for r in t.to_pylist()]
    assert {(r["tq_key"], r["tq_tags"]) for r in logged if r["tq_partition"] == "kv"} >= \
        {(k, '{"status": "success", "global_steps": 3}') for k in keys}
    assert (tq_system["path"] / "tq-keys.log").stat().st_size == 0  # nothing went through the store
    got = tq.kv_batch_get(keys=keys[::-1], partition_id="kv", select_fields=["responses", "score", "extra_fields"])
    for a, b in zip(got["responses"].unbind(), generation["responses"].unbind()[::-1], strict=True):
        assert torch.equal(a, b)
    assert torch.equal(got["score"].reshape(-1), generation["score"].flip(0))
    assert got["extra_fields"].tolist() == generation["extra_fields"].tolist()[::-1]
    assert store.sql("SELECT count(*) AS n FROM rollouts WHERE tq_partition = 'kv'").column("n")[0].as_py() == 4
    tq.kv_clear(keys=keys, partition_id="kv")
    assert store.sql("SELECT count(*) AS n FROM rollouts WHERE tq_partition = 'kv'").column("n")[0].as_py() == 0


def test_tq_checkpoint_brings_back_rows_cleared_since(tq_system, tmp_path):
    """verl V1 calls tq.save_checkpoint with its model checkpoints and tq.load_checkpoint on resume."""
    client, store = tq_system["client"], tq_system["store"]
    prompts, generation = put_both(client, "ckpt", seed=7)
    tq.save_checkpoint(tmp_path / "tq")  # include_storage: the backend writes its rows as Parquet
    assert (tmp_path / "tq" / "lakebuffer" / "rows.parquet").exists()
    meta, _ = fetch(client, "ckpt", ["prompts"])
    client.clear_samples(meta)  # trained on and cleared after the checkpoint...
    assert store.sql("SELECT count(*) AS n FROM rollouts WHERE tq_partition = 'ckpt'").column("n")[0].as_py() == 0
    keyed = "SELECT count(*) AS n FROM tq_keys WHERE tq_partition = 'ckpt'"
    assert store.sql(keyed).column("n")[0].as_py() == 0  # the journal knows they were cleared
    tq.load_checkpoint(tmp_path / "tq")  # ...then the run resumes from it
    assert store.sql(keyed).column("n")[0].as_py() == B  # and that the checkpoint brought them back
    _, got = fetch(client, "ckpt", ALL)
    assert_same(got, prompts, generation)


def test_an_undeclared_field_gets_a_column_typed_from_its_first_put(tq_system):
    """Drop-in: no declaration needed; the field's column is typed from the first put that carries it."""
    from tensordict import NonTensorStack, TensorDict

    client, store = tq_system["client"], tq_system["store"]
    mystery = torch.arange(6, dtype=torch.int16).reshape(2, 3)
    meta = client.put(data=TensorDict({"mystery": mystery, "note": NonTensorStack({"a": 1}, {"b": [2]}),
                                       "reward": torch.tensor([0.5, 1.5])}, batch_size=2), partition_id="undeclared")
    got = client.get_data(meta)
    assert torch.equal(dense(got["mystery"]), mystery) and got["mystery"].dtype == torch.int16
    assert got["note"].tolist() == [{"a": 1}, {"b": [2]}]
    assert torch.equal(got["reward"], torch.tensor([0.5, 1.5]))  # a rollout column's name: its own column
    typed = store.sql("SELECT mystery, note, tqf_reward FROM rollouts WHERE tq_partition = 'undeclared' "
                      "ORDER BY tq_index")
    assert typed.schema.field("mystery").type == pa.list_(pa.int16())
    assert typed.column("note").to_pylist() == ['{"a": 1}', '{"b": [2]}']
    assert typed.column("tqf_reward").to_pylist() == [0.5, 1.5]


def test_store_calls_go_over_its_socket_and_keep_their_errors(tq_system):
    """A client on the store's node calls it over the Unix socket (tq_wire), not Ray; a store error
    comes back as its own LakeBufferError class, and the socket still serves after it."""
    store = tq_system["store"]
    assert store._call("path") == str(tq_system["path"])  # (reconnects if an earlier test restarted the store)
    assert not store.wire.remote and store.wire.address.startswith("ipc://")
    assert store.wire.pid == ray.get(lbtq.store_handle(tq_system["cfg"]).pid.remote())
    bad = pa.table({"key": ["w/1"], "not_a_column": [1]})
    with pytest.raises(SchemaError, match="not_a_column"):
        store._call("put", bad)
    with pytest.raises(lb.LakeBufferError, match="no call"):
        store.wire.call("_stored", ["w/1"])  # private methods are not served
    assert store._call("count") >= 0  # the socket serves on after errors


def test_a_put_retried_after_the_store_died_is_stored_once(tmp_path):
    """A put that reached the WAL just before a crash is retried by the client: stored once, acknowledged."""
    from lakebuffer.integrations.tq_store import StoreBody, ipc_bytes

    store = StoreBody(str(tmp_path / "run"), {"snapshot_interval_s": 0}, {"values": "list<float32>"})
    table = pa.table({"key": ["a/1", "a/2"], "prompt_id": ["p", "p"], "policy_version": [0, 0],
                      "prompt_ids": [[1], [2]], "response_ids": [[3], [4]], "reward": [0.5, 1.0],
                      "tq_partition": ["a", "a"], "tq_index": [1, 2], "tq_fields": [",x,", ",x,"]})
    assert store.put(ipc_bytes(table)) == ""  # the row keys' prefix: generation 0 has none
    assert store.put(ipc_bytes(table)) == ""
    assert store.count() == 2
    other = table.set_column(0, "key", pa.array(["a/9", "a/1"]))  # a genuinely conflicting batch still fails
    with pytest.raises(SchemaError):
        store.put(ipc_bytes(other))
    store.close()


def test_storage_kv_client_contract(tq_system):
    """The StorageKVClient contract TransferQueue's KV managers use: '<index>@<field>' keys, values per sample."""
    client = lbtq.LakeBufferStorageClient(tq_system["cfg"])
    keys = [f"{i}@{f}" for f in ("attention_mask", "old_log_probs") for i in (100, 101)]
    values = [torch.ones(4, dtype=torch.int64), torch.zeros(4, dtype=torch.int64),
              torch.tensor([-0.5, -1.0]), torch.tensor([-2.0, -3.0])]
    meta = client.put(keys, values)
    assert meta[0] == meta[2] and meta[1] == meta[3]  # one row per sample holds both fields
    got = client.get(keys, shapes=[(4,), (4,), (2,), (2,)],
                     dtypes=[torch.int64, torch.int64, torch.float32, torch.float32], custom_backend_meta=meta)
    for a, b in zip(got, values, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
    client.clear(keys, custom_backend_meta=meta)
    with pytest.raises(lb.KeyNotFoundError):
        client.get(keys, custom_backend_meta=meta)
    with pytest.raises(SchemaError, match="custom_backend_meta"):
        client.get(keys)


def test_a_misspelt_setting_is_an_error():
    with pytest.raises(lb.LakeBufferError, match="unknown backend.LakeBuffer setting 'memory_limit'"):
        lbtq.start_store({"path": "x", "memory_limit": 64})
    with pytest.raises(lb.LakeBufferError, match="'rewards' is not one"):
        lbtq.start_store({"path": "x", "columns": {"rewards": "score"}})


@pytest.mark.parametrize("layout", ["jagged", "strided"])
def test_jagged_fields_with_inner_dims_round_trip_as_one_list_column(layout):
    """[L_i, K] per sample: one list column over the flat values, offsets scaled by K; read back jagged."""
    from lakebuffer.integrations.tensor_columns import to_arrow, to_field

    parts = [torch.arange(6.0).reshape(3, 2), torch.arange(10.0, 12.0).reshape(1, 2), torch.zeros(0, 2)]
    nt = torch.nested.as_nested_tensor(parts, layout=torch.jagged if layout == "jagged" else torch.strided)
    col = to_arrow(nt, pa.list_(pa.float32()), "f")
    assert col.to_pylist() == [p.reshape(-1).tolist() for p in parts]
    back = to_field(col, {"dtype": torch.float32, "shape": (3, 2), "is_nested": True})
    assert back.is_nested and [t.tolist() for t in back.unbind()] == [p.tolist() for p in parts]


def test_a_received_reply_is_read_in_place_and_anything_shared_is_copied():
    """A get's reply buffers (writable, this call's alone) become the tensors without a copy; a shared
    or read-only column, or one that needs a cast, is copied, so writing into the result changes nothing else."""
    import pickle

    from lakebuffer.integrations.tensor_columns import to_field

    table = pa.table({"ids": pa.array([np.arange(8, dtype=np.int64)] * 3), "score": pa.array([1.0, 2.0, 3.0])})
    frames: list[pickle.PickleBuffer] = []
    head = pickle.dumps(table, protocol=5, buffer_callback=frames.append)
    received = pickle.loads(head, buffers=[memoryview(bytearray(f.raw())) for f in frames])  # as the wire does
    schema = {"dtype": torch.int64, "is_nested": True}

    ids = to_field(received.column("ids"), schema, private=True)
    values = received.column("ids").chunk(0).flatten()
    assert ids.values().data_ptr() == values.buffers()[1].address  # in place
    ids.values()[0] = 99  # writable, and only this reply sees it
    assert values.to_pylist()[0] == 99 and table.column("ids").to_pylist()[0][0] == 0
    score = to_field(received.column("score"), {"dtype": torch.float64}, private=True)
    assert score.data_ptr() == received.column("score").chunk(0).buffers()[1].address

    shared = to_field(table.column("ids"), schema)  # not private: a copy
    assert shared.values().data_ptr() != table.column("ids").chunk(0).flatten().buffers()[1].address
    shared.values()[1] = -1
    assert table.column("ids").to_pylist()[0][1] == 1
    cast = to_field(received.column("score"), {"dtype": torch.float32}, private=True)  # a cast: a copy
    assert cast.dtype == torch.float32 and cast.tolist() == [1.0, 2.0, 3.0]
    read_only = pickle.loads(head, buffers=[bytes(f.raw()) for f in frames])  # Ray's read-only objects
    kept = to_field(read_only.column("ids"), schema, private=True)
    assert kept.values().data_ptr() != read_only.column("ids").chunk(0).flatten().buffers()[1].address


def test_kv_contract_strings_and_refusals():
    from lakebuffer.integrations.tensor_columns import to_arrow, to_field

    col = to_arrow(["a", "b"], pa.string(), "s")
    assert to_field(col, {}).tolist() == ["a", "b"]  # a string column is a NonTensorStack again
    with pytest.raises(SchemaError, match="'ids'"):  # an id past int32 is refused, not wrapped
        to_arrow(torch.tensor([[2**40]]), pa.list_(pa.int32()), "ids")
    with pytest.raises(SchemaError, match="needs a list"):
        to_arrow(torch.zeros(2, 3), pa.float32(), "m")
