"""The exit hook's contract (lakebuffer/lake/runtime.py), checked in a fresh interpreter each time
because the hook's "exiting" state is for the life of a process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow.compute as pc
import pytest

from tests.rollouts import make_rollouts

REPO = Path(__file__).resolve().parents[1]


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=REPO, timeout=120)


def test_shutdown_stops_joins_and_waits_then_refuses_other_threads() -> None:
    p = run("""
        import threading, time
        from lakebuffer.lake import runtime
        stop = threading.Event(); order = []
        def worker():
            while not stop.is_set():
                with runtime.native_call("work"):
                    time.sleep(0.05)  # stands in for a delta-rs call with the GIL released
            order.append("worker done")
        t = threading.Thread(target=worker, daemon=True); runtime.register_thread(t, stop.set); t.start()
        inflight = threading.Event(); release = threading.Event()
        def long_call():
            with runtime.native_call("long"):
                inflight.set(); release.wait()
            order.append("long done")
        u = threading.Thread(target=long_call, daemon=True); u.start(); inflight.wait()
        threading.Timer(0.3, release.set).start()
        assert runtime.shutdown(timeout_s=10) is True
        assert not t.is_alive() and "long done" in order, order
        refused = []
        def late():
            try:
                with runtime.native_call("late"):
                    pass
            except runtime.LakeExitingError as e:
                refused.append(e)
        v = threading.Thread(target=late); v.start(); v.join()
        assert refused and isinstance(refused[0], runtime.LakeError)
        with runtime.native_call("main thread may still finish its work"):
            pass
        print("ok")
    """)
    assert p.returncode == 0 and "ok" in p.stdout, p.stderr


def test_shutdown_gives_up_after_its_deadline() -> None:
    p = run("""
        import threading
        from lakebuffer.lake import runtime
        started = threading.Event()
        def stuck():
            with runtime.native_call("hung request"):
                started.set(); threading.Event().wait()
        threading.Thread(target=stuck, daemon=True).start(); started.wait()
        assert runtime.shutdown(timeout_s=0.2) is False
        print("ok")
    """)
    assert p.returncode == 0 and "ok" in p.stdout, p.stderr


def test_arrow_filesystem_is_native() -> None:
    p = run("""
        import pyarrow.fs as pafs
        from lakebuffer.lake import runtime
        fs, root = runtime.arrow_filesystem("s3://bucket/lake/", {"key": "k", "secret": "s", "endpoint_url": "http://127.0.0.1:9",
                                                                   "client_kwargs": {"region_name": "us-east-1"}})
        assert isinstance(fs, pafs.S3FileSystem) and root == "bucket/lake", (fs, root)
        fs, root = runtime.arrow_filesystem("s3://b/x", {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "k",
                                                         "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "us-east-1"})
        assert isinstance(fs, pafs.S3FileSystem) and root == "b/x"
        fs, root = runtime.arrow_filesystem("/tmp/some/lake", None)
        assert isinstance(fs, pafs.LocalFileSystem) and root == "/tmp/some/lake"
        print("ok")
    """)
    assert p.returncode == 0 and "ok" in p.stdout, p.stderr


def test_a_worker_parked_at_exit_does_not_hold_the_hook_until_its_deadline() -> None:
    """A registered daemon worker that finishes its running task with a new lake call after the hook began
    is parked there for good (issue 24); the hook must go on at once, not join it until EXIT_WAIT_S (a
    buffer child exiting with a periodic snapshot in flight was killed as hung in CI this way)."""
    code = """
        import os, threading, time
        from lakebuffer.lake import runtime
        started = threading.Event()
        def worker():
            started.set()
            while not runtime.exiting():
                time.sleep(0.01)
            time.sleep(0.2)  # the stop asked it to finish its task: the task's last step calls the lake
            with runtime.native_call("the running task's last lake call"):
                pass
        t = threading.Thread(target=worker, daemon=True); runtime.register_thread(t, lambda: None); t.start()
        started.wait()
        print("exiting", flush=True)
    """
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=REPO, timeout=120,
                       env=dict(os.environ, LAKEBUFFER_EXIT_WAIT_S="30"))
    took = time.monotonic() - t0
    assert p.returncode == 0 and "exiting" in p.stdout, p.stderr
    assert took < 15, f"the exit hook waited {took:.1f} s for a parked thread (deadline 30 s)"


def test_an_exit_during_a_snapshot_says_where_the_rows_are_and_loses_none(tmp_path) -> None:
    """A process that exits while a snapshot is under way (no ``close()``): Python's shutdown refuses
    the snapshot's next piece of work, so it is cut short. The user reads where the rows are (a
    warning, not a "snapshot failed ... retried at the next one" error, which no next one follows),
    and the next open has every row and takes them to the lake."""
    child = f"""
        import threading
        import lakebuffer as lb
        from tests.rollouts import make_rollouts
        buf = lb.ReplayBuffer.open({str(tmp_path / "buf")!r}, lake={str(tmp_path / "lake")!r}, run_id="r",
                                   snapshot_interval_s=0, memory_limit_mb=64)
        for i in range(40):
            buf.push(make_rollouts(64, tokens=512, seed=i))
        underway = threading.Event()
        buf.snapshot(wait=False, progress=lambda done, total: underway.set())
        assert underway.wait(60)
        print("exiting", len(buf), flush=True)
    """
    p = run(child)
    assert p.returncode == 0 and "exiting 2560" in p.stdout, p.stderr
    assert "go to the lake at the next open" in p.stderr, p.stderr
    assert "failed" not in p.stderr and "Traceback" not in p.stderr, p.stderr
    import lakebuffer as lb

    with lb.ReplayBuffer.open(tmp_path / "buf", lake=str(tmp_path / "lake"), run_id="r", snapshot_interval_s=0) as buf:
        assert len(buf) == 2560
        buf.snapshot(wait=True)
        assert buf.stats()["cold"]["rows"] == 2560
        assert buf.sql("SELECT count(DISTINCT key) AS n FROM rollouts").column("n")[0].as_py() == 2560


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_close_registered_with_atexit_takes_the_final_snapshot(tmp_path, request, where) -> None:
    """``atexit.register(buf.close)``: by then Python's shutdown has closed every executor, so the final
    snapshot's work (the snapshot thread, the lake writer's encoder and commit pools) runs on the main
    thread instead; a fresh node then finds every pushed row in the lake."""
    if where == "local":
        lake, so = str(tmp_path / "lake"), None
    else:
        lake = f"{request.getfixturevalue('s3_bucket')}/lake"
        so = request.getfixturevalue("s3_server").storage_options
    child = f"""
        import atexit
        import lakebuffer as lb
        from tests.rollouts import make_rollouts
        buf = lb.ReplayBuffer.open({str(tmp_path / "buf")!r}, lake={lake!r}, storage_options={so!r}, run_id="r",
                                   snapshot_interval_s=600, memory_limit_mb=64)
        atexit.register(buf.close)
        keys = [buf.push(make_rollouts(64, tokens=512, seed=i)) for i in range(10)]
        print("pushed", len(buf), flush=True)
    """
    p = run(child)
    assert p.returncode == 0 and "pushed 640" in p.stdout, p.stderr
    assert "failed" not in p.stderr and "cut short" not in p.stderr, p.stderr
    import lakebuffer as lb

    with lb.ReplayBuffer.open(tmp_path / "fresh", lake=lake, storage_options=so, run_id="r", snapshot_interval_s=0,
                              restore="cold") as fresh:
        assert len(fresh) == 640
        ref = [make_rollouts(64, tokens=512, seed=i) for i in range(10)]
        got = fresh.sql("SELECT sum(reward) AS s, count(DISTINCT key) AS n FROM rollouts").to_pylist()[0]
        assert got["n"] == 640
        assert got["s"] == pytest.approx(sum(pc.sum(t.column("reward")).as_py() for t in ref))


def test_submit_runs_on_the_pool_and_inlines_only_on_an_exiting_main_thread() -> None:
    """``runtime.submit`` / ``pool_map``: work goes to the pool while the process runs; a pool shut down by
    our own code is still an error (nothing is run in its place); only at exit, on the main thread, the
    work runs inline, and another thread's refusal is a ``LakeExitingError`` (a child's atexit hook)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from lakebuffer.lake import runtime

    with ThreadPoolExecutor(2, thread_name_prefix="t-pool") as pool:
        assert runtime.submit(pool, lambda: threading.current_thread().name).result().startswith("t-pool")
        assert runtime.pool_map(pool, lambda x: x * x, range(20)) == [x * x for x in range(20)]
    with pytest.raises(RuntimeError):
        runtime.submit(pool, lambda: None)
    p = run("""
        import atexit, threading
        from concurrent.futures import ThreadPoolExecutor
        from lakebuffer.lake import runtime
        pool = ThreadPoolExecutor(2)
        def at_exit():
            names = runtime.pool_map(pool, lambda x: (x, threading.current_thread().name), range(3))
            print("ran", names, runtime.interpreter_exiting(), flush=True)
            got = []
            t = threading.Thread(target=lambda: got.append(_refused()))
            t.start(); t.join()
            print("other thread refused", got, flush=True)
        def _refused():
            try:
                runtime.submit(pool, lambda: None)
            except runtime.LakeExitingError:
                return True
            return False
        atexit.register(at_exit)
    """)
    assert p.returncode == 0, p.stderr
    assert "ran [(0, 'MainThread'), (1, 'MainThread'), (2, 'MainThread')] True" in p.stdout, p.stdout
    assert "other thread refused [True]" in p.stdout, p.stdout
