"""Notebook-friendly, honest output: Snapshot results, reprs, clear errors for misleading cases."""

from __future__ import annotations

import multiprocessing as mp

import pytest

import lakebuffer as lb
from lakebuffer.dataset import RolloutDataset, SamplingDataset
from tests.rollouts import make_rollouts


def test_snapshot_returns_a_small_snapshot_object(tmp_path):
    with lb.ReplayBuffer.open(tmp_path / "b", snapshot_interval_s=0, run_id="r1") as buf:
        buf.push(make_rollouts(20, tokens=4))
        s = buf.snapshot(wait=True)
        assert isinstance(s, lb.Snapshot)
        assert (s.snapshot_id, s.run_id, s.rows, s.lake) == (1, "r1", 20, buf.lake_url)
        assert s.files >= 1 and s.bytes > 0
        assert s["snapshot_id"] == 1  # dict-style access kept
        assert len(repr(s)) < 400
        buf.delete(keys=buf.sample(5, return_keys=True))
        s2 = buf.snapshot(wait=True)
        assert s2.snapshot_id == 2 and s2.rows == 15 and s2.deleted_keys == 5  # tombstoned rows not counted
        assert buf.stats()["cold"]["rows"] == 15


def test_reprs_and_html(tmp_path):
    with lb.ReplayBuffer.open(tmp_path / "b", snapshot_interval_s=0, run_id="r1", memory_limit_mb=32) as buf:
        buf.push(make_rollouts(12, tokens=4))
        r = repr(buf)
        assert "rows=12" in r and "run_id='r1'" in r and "memory_limit_mb=32" in r
        h = buf._repr_html_()
        assert "<table>" in h and "<td>hot</td>" in h and "<td>12</td>" in h
        buf.snapshot(wait=True)
        url = buf.lake_url
    assert "closed" in repr(buf)
    with lb.ReplayBuffer.open_lake(url) as view:
        assert "runs=['r1']" in repr(view) and "rows=12" in repr(view)
        assert "<td>cold</td>" in view._repr_html_()


def test_bad_sampler_option_names_the_sampler_and_option(tmp_path):
    with lb.ReplayBuffer.open(tmp_path / "b", snapshot_interval_s=0) as buf:
        buf.push(make_rollouts(10, tokens=4))
        with pytest.raises(lb.OptionError) as e:
            buf.sample(2, sampler="freshness", max_lagg=1)
        msg = str(e.value)
        assert "'freshness'" in msg and "'max_lagg'" in msg and "max_lag" in msg and "UniformSampler" not in msg


def test_second_open_in_same_process_says_so(tmp_path):
    with lb.ReplayBuffer.open(tmp_path / "b", snapshot_interval_s=0):
        with pytest.raises(lb.LockedError, match="already open in this process"):
            lb.ReplayBuffer.open(tmp_path / "b", snapshot_interval_s=0)
    lb.ReplayBuffer.open(tmp_path / "b", snapshot_interval_s=0).close()  # released on close


def _iterate_in_child(ds, q):
    try:
        for _ in ds:
            pass
        q.put("no error")
    except lb.LakeBufferError as e:
        q.put(str(e))


@pytest.mark.filterwarnings("ignore:lance is not fork-safe")
@pytest.mark.parametrize("kind", ["rollout", "sampling"])
def test_live_buffer_dataset_refuses_other_processes(tmp_path, kind):
    with lb.ReplayBuffer.open(tmp_path / "b", snapshot_interval_s=0) as buf:
        buf.push(make_rollouts(20, tokens=4))
        ds = (RolloutDataset(buf, batch_size=5, columns=["key"]) if kind == "rollout"
              else SamplingDataset(buf, n_steps=2, batch_size=4))
        assert sum(1 for _ in ds) >= 2  # in the owning process it works
        q = mp.get_context("fork").Queue()
        p = mp.get_context("fork").Process(target=_iterate_in_child, args=(ds, q))
        p.start()
        msg = q.get(timeout=60)
        p.join(60)
        assert "live ReplayBuffer cannot be read from another process" in msg and "open_lake" in msg


def test_grpo_example_leaves_no_temp_data(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    sys.path.insert(0, str(root / "examples"))
    try:
        import grpo_loop
    finally:
        sys.path.remove(str(root / "examples"))
    grpo_loop.main(["--steps", "2", "--updates", "1", "--prompts", "4", "--group", "2", "--batch-size", "4"])
    # torch keeps its compiler cache in $TMPDIR/torchinductor_<user> (torch's, not the example's data)
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith("torchinductor_")] == []
