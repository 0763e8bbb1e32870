"""What TransferQueue acknowledged on the LakeBuffer backend survives a SIGKILL of the whole job.

A job (``tq_job.py``, its own process with its own Ray) makes kv puts with tags, tag-only
updates, clears and a BatchMeta put, then it and every process of its Ray (controller, store actor,
raylet, GCS) are killed with SIGKILL. A later ``tq.init`` with the same config, here, must give
back every acknowledged key of every partition with its last tag, the values bit-exact, the
cleared keys absent, nothing twice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the TransferQueue backend needs torch (CPU wheel)")
ray = pytest.importorskip("ray", reason="TransferQueue runs on Ray")
tq = pytest.importorskip("transfer_queue", reason="transferqueue==0.1.11 is not installed")
psutil = pytest.importorskip("psutil")

from lakebuffer.integrations import tq_controller  # noqa: E402
from lakebuffer.integrations import transferqueue as lbtq  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import tq_job  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_transferqueue_internals_this_backend_relies_on():
    """Fails loudly when a TransferQueue release moves what tq_controller journals and restores."""
    tq_controller.check_internals()
    import transfer_queue.interface as tqi

    src = Path(tqi.__file__).read_text()
    # tq.init reuses a controller of this name, and calls the backend's bootstrap hook after creating one
    assert 'name="TransferQueueController", namespace="transfer_queue"' in src
    assert src.index("TransferQueueController.options(") < src.index("_maybe_create_tq_storage(final_conf)")
    import transfer_queue.client as tqc

    put = Path(tqc.__file__).read_text()
    # every put ends with set_custom_meta (the journaled call), tags or not
    body = put[put.index("async def async_put("):put.index("async def async_get_data(")]
    assert body.index("storage_manager.put_data(") < body.index("await self.async_set_custom_meta(metadata)")


def _kill_job(proc: subprocess.Popen) -> list[int]:
    """SIGKILL the job's driver and every process under it (its Ray: GCS, raylet, workers, actors)."""
    root = psutil.Process(proc.pid)
    procs = [root, *root.children(recursive=True)]
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=30)
    proc.wait(timeout=30)
    return [p.pid for p in procs]


def _run_and_kill(path: Path, *mode: str) -> Path:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen([sys.executable, str(Path(tq_job.__file__)), str(path), *mode], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + 240
        line = ""
        while not line.startswith("ACKED"):
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "the job died before acknowledging its operations"
            assert time.monotonic() < deadline, "the job did not finish its operations in time"
        pids = json.loads(line.split(" ", 1)[1])
        killed = _kill_job(proc)
        assert set(pids) <= set(killed)  # the driver and the store actor went down with SIGKILL
        assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)
    finally:
        if proc.poll() is None:
            _kill_job(proc)
    return path


@pytest.fixture()
def killed_job(tmp_path):
    return _run_and_kill(tmp_path / "run")


@pytest.mark.slow
def test_everything_acknowledged_survives_sigkill_of_the_whole_job(killed_job):
    from omegaconf import OmegaConf
    from tensordict import TensorDict

    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False)
    cfg = tq_job.config(str(killed_job))
    conf = OmegaConf.create({"backend": {"storage_backend": "LakeBuffer", "LakeBuffer": cfg}})
    try:
        tq.init(conf)
        tags, status = tq_job.expected()
        listed = tq.kv_list()
        assert listed["rollouts"] == tags  # 190 keys, each with its last tag; cleared keys absent
        assert listed["status"] == status  # tag-only keys, their second tag
        keys = sorted(tags)
        got = tq.kv_batch_get(keys=keys, partition_id="rollouts", select_fields=["input_ids", "logprobs", "score"])
        for pos, key in enumerate(keys):
            want = tq_job.sample(int(key[1:]))
            assert torch.equal(got["input_ids"][pos], want["input_ids"]) and got["input_ids"].dtype == torch.int64
            assert torch.equal(got["logprobs"][pos], want["logprobs"])
            assert torch.equal(got["score"][pos].reshape(()), want["score"])
        # the BatchMeta API: 4 of the 8 samples were cleared, 4 come back
        client = tq.get_client()
        meta = client.get_meta(data_fields=["prompts"], batch_size=4, partition_id="classic", mode="fetch",
                               task_name="after-crash")
        assert sorted(t[0].item() for t in client.get_data(meta)["prompts"].unbind()) == [0, 4, 8, 12]
        # what get_meta consumed stays consumed: task "train" took the first two before the crash
        meta = client.get_meta(data_fields=["prompts"], batch_size=2, partition_id="classic", mode="fetch",
                               task_name="train")
        assert sorted(t[0].item() for t in client.get_data(meta)["prompts"].unbind()) == [8, 12]
        # nothing twice: one stored row per live key, one journal state per live sample
        rows = lbtq.sql("SELECT count(*) AS n, count(DISTINCT key) AS k FROM rollouts WHERE tq_partition = 'rollouts'",
                        cfg).to_pylist()
        assert rows == [{"n": len(tags), "k": len(tags)}]
        keyed = lbtq.sql("SELECT tq_partition, count(*) AS n FROM tq_keys GROUP BY 1 ORDER BY 1", cfg).to_pylist()
        assert keyed == [{"tq_partition": "classic", "n": 4}, {"tq_partition": "rollouts", "n": len(tags)},
                         {"tq_partition": "status", "n": len(status)}]
        # a new key after the restore gets a fresh index, not one a live key holds
        tq.kv_put(key="new", partition_id="rollouts", fields=tq_job.sample(7), tag={"status": "new"})
        assert len(tq.kv_list("rollouts")["rollouts"]) == len(tags) + 1
        assert torch.equal(tq.kv_batch_get(keys=["k3"], partition_id="rollouts", select_fields="input_ids")["input_ids"][0],
                           tq_job.sample(3)["input_ids"])

        # tq.close() then tq.init() in one process: the store is reused, the new controller restored
        tq.close()
        tq.init(conf)
        assert tq.kv_list("rollouts")["rollouts"]["new"] == {"status": "new"}
        assert len(tq.kv_list("rollouts")["rollouts"]) == len(tags) + 1
        td = TensorDict({"prompts": torch.zeros(2, 4, dtype=torch.int64)}, batch_size=2)
        assert tq.get_client().put(data=td, partition_id="again").size == 2
    finally:
        tq.close()
        lbtq.close_store(cfg)
        if started:
            ray.shutdown()


def _rows(keys, partition="p", start=0, **extra):
    import pyarrow as pa

    n = len(keys)
    return pa.table({"key": keys, "prompt_id": ["x"] * n, "policy_version": [0] * n, "prompt_ids": [[1]] * n,
                     "response_ids": [[2]] * n, "reward": [0.0] * n, "tq_partition": [partition] * n,
                     "tq_index": list(range(start, start + n)), "tq_fields": [",f,"] * n, **extra})


def test_a_new_field_opens_a_generation_and_every_generation_stays_readable(tmp_path):
    """Fields appear with puts; a buffer's schema is fixed: generations, one per new field set."""
    from lakebuffer.integrations.tq_store import StoreBody, ipc_bytes, read_ipc

    store = StoreBody(str(tmp_path / "run"), {"snapshot_interval_s": 0}, None)
    assert store.put(ipc_bytes(_rows(["a/0", "a/1"]))) == ""
    store.add_fields({"ids": "list<int64>", "note": "json"})
    assert store.add_fields({"ids": "list<int64>"}) and len(store.gens) == 2  # known already: no third
    prefix = store.put(ipc_bytes(_rows(["b/0"], start=2, ids=[[2**40, 7]], note=['{"a": 1}'])))
    assert prefix == "g1:"
    got = store.get([(["a/1", "g1:b/0"], ["tq_index"]), (["g1:b/0"], ["ids", "note"])])[0]  # a table: its buffers pickle out of band
    assert got.column("tq_index").to_pylist() == [1, 2]
    assert store.get([(["g1:b/0"], ["ids", "note"])])[0].to_pylist() == [{"ids": [2**40, 7], "note": '{"a": 1}'}]
    store.close()

    store = StoreBody(str(tmp_path / "run"), {"snapshot_interval_s": 0}, None)  # reopened: both generations
    assert len(store.gens) == 2 and store.count() == 3
    assert read_ipc(store.sql("SELECT count(*) AS n, count(ids) AS with_ids FROM rollouts")).to_pylist() == [
        {"n": 3, "with_ids": 1}]
    assert store.delete("p", [0, 2]) == 2 and store.count() == 1
    store.close()


def test_the_journal_folds_to_the_live_samples_and_drops_superseded_records(tmp_path):
    import pyarrow as pa

    from lakebuffer.integrations.tq_controller import JOURNAL_SCHEMA
    from lakebuffer.integrations.tq_journal import Journal

    def records(*rows):
        return pa.Table.from_pylist([{"tq_op": op, "tq_partition": p, "tq_index": i, "tq_key": k,
                                      "tq_tags": tags, "tq_rows": "{}", "tq_schema": "{}", "tq_shapes": "{}"}
                                     for op, p, i, k, tags in rows], schema=JOURNAL_SCHEMA)

    j = Journal(str(tmp_path), {"snapshot_interval_s": 0}, "run")
    j.append(records(("state", "a", 0, "k0", '{"s": 1}'), ("state", "a", 1, "k1", "{}"), ("state", "b", 2, "k2", "{}")))
    j.append(records(("state", "a", 0, "k0", '{"s": 2}'), ("clear", "a", 1, None, "{}")))
    j.append(records(("clear_partition", "b", -1, None, "{}"), ("state", "b", 3, "k3", "{}")))
    live = {(r["tq_partition"], r["tq_key"]): r["tq_tags"] for r in j.state().to_pylist()}
    assert live == {("a", "k0"): '{"s": 2}', ("b", "k3"): "{}"}
    j.close()  # compacts: only the live records stay
    j = Journal(str(tmp_path), {"snapshot_interval_s": 0}, "run")
    assert j.buf.count() == 2 and {(r["tq_partition"], r["tq_key"]) for r in j.state().to_pylist()} == set(live)
    j.append(records(("state", "a", 5, "k5", "{}")))  # acknowledged: in the log, not yet in the buffer
    assert j.buf.count() == 2 and max(r["tq_seq"] for r in j.state().to_pylist()) == 8  # numbering goes on
    j.buf.close()  # a crash: the buffer and the log as they are, no drain
    j.log.close()
    with open(tmp_path / "tq-keys.log", "ab") as f:
        f.write((1000).to_bytes(8, "little") + b"torn")  # an append the crash cut short (never acknowledged)
    j = Journal(str(tmp_path), {"snapshot_interval_s": 0}, "run")
    assert {r["tq_key"] for r in j.state().to_pylist()} == {"k0", "k3", "k5"}
    assert j.buf.count() == 3 and (tmp_path / "tq-keys.log").stat().st_size == 0
    j.close()


def test_controller_segments_rotate_and_the_store_takes_every_record_once(tmp_path, monkeypatch):
    """The controller's own journal segments (``tq_journal_log``): rotated every ROTATE_RECORDS records,
    closed ones taken into the store's journal buffer and removed, the open one read where it lies; a
    torn last frame is an append never acknowledged; a new controller closes the old one's segment."""
    import pyarrow as pa

    from lakebuffer.integrations import tq_journal_log
    from lakebuffer.integrations.tq_controller import JOURNAL_SCHEMA
    from lakebuffer.integrations.tq_journal import Journal
    from lakebuffer.integrations.tq_journal_log import SegmentWriter, segments

    monkeypatch.setattr(tq_journal_log, "ROTATE_RECORDS", 3)

    def records(*rows):
        return pa.Table.from_pylist([{"tq_op": op, "tq_partition": p, "tq_index": i, "tq_key": k,
                                      "tq_tags": tags, "tq_rows": "{}", "tq_schema": "{}", "tq_shapes": "{}"}
                                     for op, p, i, k, tags in rows], schema=JOURNAL_SCHEMA)

    def live(j):
        return {(r["tq_partition"], r["tq_key"]): r["tq_tags"] for r in j.state().to_pylist()}

    j = Journal(str(tmp_path), {"snapshot_interval_s": 0}, "run")
    w = SegmentWriter(j.segments_dir, j.next_seq(), sync=False)
    rotated = [w.append(records(("state", "a", i, f"k{i}", "{}"))) for i in range(4)]  # 4 operations
    assert rotated == [False, False, True, False]  # the third record closed the first segment
    rotated += [w.append(records(("state", "a", 0, "k0", '{"s": 2}'), ("clear", "a", 1, None, "{}")))]
    rotated += [w.append(records(("clear_partition", "b", -1, None, "{}"), ("state", "b", 9, "k9", "{}")))]
    want = {("a", "k0"): '{"s": 2}', ("a", "k2"): "{}", ("a", "k3"): "{}", ("b", "k9"): "{}"}
    assert live(j) == want  # read where the records lie, before the store took any
    closed, open_ = segments(j.segments_dir)
    assert len(closed) == sum(rotated) == 2 and len(open_) == 1
    j.drain()  # what a rotation asks of the store
    assert segments(j.segments_dir)[0] == [] and live(j) == want
    keys = j.buf.sql("SELECT key FROM rollouts").column("key").to_pylist()
    assert len(keys) == len(set(keys))
    j.drain(with_open=True)  # a snapshot: the open segment's records too, its file stays
    assert live(j) == want and j.buf.count() == len(want)  # superseded records and clears deleted
    w.append(records(("state", "a", 2, "k2", '{"s": 3}')))  # into the open segment, after the snapshot
    with open(segments(j.segments_dir)[1][0], "ab") as f:
        f.write((1000).to_bytes(8, "little") + b"torn")  # an append a crash cut short (never acknowledged)
    want[("a", "k2")] = '{"s": 3}'
    j.buf.close()  # a crash of the store: no drain
    j.log.close()
    j = Journal(str(tmp_path), {"snapshot_interval_s": 0}, "run")
    assert live(j) == want
    nxt = j.next_seq()
    assert nxt > max(r["tq_seq"] for r in j.state().to_pylist())
    w2 = SegmentWriter(j.segments_dir, nxt, sync=False)  # a new controller: the old one's segment is closed
    assert len(segments(j.segments_dir)[0]) == 1 and segments(j.segments_dir)[1] == [w2.path]
    w2.append(records(("clear", "a", 3, None, "{}")))
    del want[("a", "k3")]
    j.close()  # takes everything: the records of the first writer once, the second's after them
    j = Journal(str(tmp_path), {"snapshot_interval_s": 0}, "run")
    assert live(j) == want and j.buf.count() == len(want)
    keys = j.buf.sql("SELECT key FROM rollouts").column("key").to_pylist()
    assert len(keys) == len(set(keys))
    j.close()
    w.close()
    w2.close()


@pytest.mark.parametrize("where", ["body", "length"])
def test_a_damaged_journal_segment_is_reported_and_kept_never_taken_short(tmp_path, monkeypatch, where):
    """A flipped byte in a closed segment, in a record or in a frame's length: opening the store's
    journal raises CorruptionError naming the file, the file stays as it was and the journal buffer
    keeps what it had (a damaged length read as the end of the log would have dropped later records)."""
    import pyarrow as pa

    import lakebuffer as lb
    from lakebuffer.integrations import tq_journal_log
    from lakebuffer.integrations.tq_controller import JOURNAL_SCHEMA
    from lakebuffer.integrations.tq_journal import Journal
    from lakebuffer.integrations.tq_journal_log import HEADER, SegmentWriter, segments

    monkeypatch.setattr(tq_journal_log, "ROTATE_RECORDS", 4)
    rec = [{"tq_op": "state", "tq_partition": "a", "tq_index": i, "tq_key": f"k{i}", "tq_tags": "{}", "tq_rows": "{}",
            "tq_schema": "{}", "tq_shapes": "{}"} for i in range(5)]
    j = Journal(str(tmp_path), {"snapshot_interval_s": 0}, "run")
    j.append(pa.Table.from_pylist(rec[:1], schema=JOURNAL_SCHEMA))
    j.drain()  # k0 in the buffer
    w = SegmentWriter(j.segments_dir, j.next_seq(), sync=False)
    for r in rec[1:]:
        w.append(pa.Table.from_pylist([r], schema=JOURNAL_SCHEMA))
    w.close()
    j.buf.close()
    j.log.close()
    seg = segments(j.segments_dir)[0][0]  # closed: four records
    raw = bytearray(seg.read_bytes())
    raw[HEADER + 40 if where == "body" else 6] ^= 0x40
    seg.write_bytes(bytes(raw))
    with pytest.raises(lb.CorruptionError, match=str(seg)):
        Journal(str(tmp_path), {"snapshot_interval_s": 0}, "run")
    assert seg.read_bytes() == bytes(raw)  # kept as it was, for fsck or a person
    raw[HEADER + 40 if where == "body" else 6] ^= 0x40  # repaired: every record comes back
    seg.write_bytes(bytes(raw))
    j = Journal(str(tmp_path), {"snapshot_interval_s": 0}, "run")
    assert sorted(r["tq_key"] for r in j.state().to_pylist()) == [f"k{i}" for i in range(5)]
    j.close()


@pytest.mark.slow
def test_verl_v1_replay_buffer_samples_the_same_groups_after_sigkill_between_produce_and_sample(tmp_path):
    """verl 0.9.1's own V1 ReplayBuffer (async mode, DAPO filter on rm_scores) over the LakeBuffer
    backend, after the producing job was SIGKILLed between produce and sample."""
    from omegaconf import OmegaConf

    rb = pytest.importorskip("verl.trainer.ppo.v1.replay_buffer", reason="verl 0.9.1 (--no-deps) is not installed")
    path = _run_and_kill(tmp_path / "run", "verl")
    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False)
    cfg = tq_job.config(str(path))
    try:
        tq.init(OmegaConf.create({"backend": {"storage_backend": "LakeBuffer", "LakeBuffer": cfg}}))
        refills: list[int] = []
        buffer = rb.ReplayBufferAsync("async", OmegaConf.create({}), max_off_policy_threshold=None,
                                      max_off_policy_strategy="drop", sampler_kwargs=OmegaConf.create({}),
                                      poll_interval=0.05, refill_fn=refills.append, filter_groups_metric="reward")
        meta, metrics = buffer.sample(global_steps=2, partition_id="train", batch_size=4)
        assert refills == [1]  # group u5 (one reward for all sessions) evicted by DAPO, one prompt refilled
        # the oldest four finished groups (global_steps 1), each with its four trajectories and their tags
        assert sorted(meta.keys) == sorted(f"u{g}_{s}_0" for g in range(4) for s in range(tq_job.N_SESSIONS))
        got = tq.kv_batch_get(keys=meta.keys, partition_id="train",
                              select_fields=["prompts", "responses", "rm_scores", "extra_fields"])
        for pos, key in enumerate(meta.keys):
            g, s, _ = (int(x) for x in key[1:].split("_"))
            want = tq_job.trajectory(g, s)
            assert meta.tags[pos]["global_steps"] == 1 and meta.tags[pos]["response_len"] == len(want["responses"])
            for field in ("prompts", "responses", "rm_scores"):
                assert torch.equal(got[field][pos], want[field])
            assert got["extra_fields"][pos] == want["extra_fields"]
        left = tq.kv_list("train")["train"]
        assert left["u7"]["status"] == "running"  # in flight when the job died: still in flight
        assert not any(k.startswith("u5") for k in left)  # the evicted group: prompt and trajectories cleared
        assert "u0" not in left and "u0_0_0" in left  # a sampled group: its prompt key cleared (verl's own rule)
        assert left["u4"]["status"] == "finished" and "u4_0_0" in left
    finally:
        tq.close()
        lbtq.close_store(cfg)
        if started:
            ray.shutdown()


@pytest.mark.slow
def test_the_store_ends_with_the_job_closed(tmp_path):
    """No tq.close(), no close_store(): when the job's driver exits, the store closes with it (the
    journal's log drained into its buffer, the directory lock released)."""
    path = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run([sys.executable, str(Path(tq_job.__file__)), str(path), "exit"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "ACKED" in out.stdout, out.stderr[-2000:]
    assert (path / "tq-keys.log").stat().st_size == 0  # closed at exit: the log went into the journal buffer
    from lakebuffer.integrations.tq_journal import Journal

    j = Journal(str(path), {"snapshot_interval_s": 0}, "run")  # opens: nobody holds the directory any more
    assert sorted(r["tq_key"] for r in j.state().to_pylist()) == [f"k{i}" for i in range(5)]
    j.close()
