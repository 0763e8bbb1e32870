"""One short process doing what the lake does with deltalake, then exiting; used by test_exit_safety.

It writes a Parquet file with pyarrow, commits it through deltalake's transaction API (creating the
table on first use), reads the table back, leaves a daemon thread in the middle of delta-rs reads,
and exits by ``--exit`` (return, sys.exit, or an uncaught exception). With ``--unsafe`` it reads the
way deltalake does by default and runs the thread unguarded: that is the reproducer of the abort
documented in ``lakebuffer/lake/runtime.py`` (expect SIGABRT/SIGSEGV in some runs).

usage: python -m tests.exit_child URI STORAGE_OPTIONS_JSON [--exit return|sysexit|exception]
       [--thread daemon|none] [--imports lance,duckdb,rocksdict] [--unsafe]
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import sys
import threading
import time
import uuid

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError
from deltalake.schema import Schema
from deltalake.transaction import AddAction, CommitProperties, create_table_with_add_actions

from lakebuffer.lake import runtime

WATCHDOG_S = 50  # under test_exit_safety's 60 s kill: a hang leaves every thread's stack in stderr (exit code 1)


def main() -> None:
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)
    ap = argparse.ArgumentParser()
    ap.add_argument("uri")
    ap.add_argument("storage_options")
    ap.add_argument("--exit", default="return", choices=["return", "sysexit", "exception"])
    ap.add_argument("--thread", default="daemon", choices=["daemon", "none"])
    ap.add_argument("--imports", default="")
    ap.add_argument("--unsafe", action="store_true")
    ap.add_argument("--buffer", default="", help="fsspec storage options (JSON): run a ReplayBuffer on the lake instead")
    a = ap.parse_args()
    for mod in filter(None, a.imports.split(",")):
        __import__(mod)
    so: dict[str, str] = json.loads(a.storage_options)
    if a.buffer:
        return buffer_child(a)
    fs, root = runtime.arrow_filesystem(a.uri, so)

    n = 2000
    table = pa.table({"run_id": pa.array(["r"] * n), "key": pa.array(range(n), pa.int64()),
                      "obs": pa.FixedSizeListArray.from_arrays(pa.array([0.5] * (16 * n), pa.float32()), 16)})
    rel = f"run_id=r/part-{uuid.uuid4().hex}.parquet"
    fs.create_dir(f"{root}/run_id=r", recursive=True)
    with fs.open_output_stream(f"{root}/{rel}") as out:
        pq.write_table(table.drop_columns(["run_id"]), out, write_page_checksum=True)
    add = AddAction(rel, fs.get_file_info(f"{root}/{rel}").size, {"run_id": "r"}, int(time.time() * 1000), True,
                    json.dumps({"numRecords": n}))
    with runtime.native_call("commit"):
        try:
            DeltaTable(a.uri, storage_options=so).create_write_transaction(
                [add], "append", table.schema, partition_by=["run_id"], commit_properties=CommitProperties(max_commit_retries=50))
        except TableNotFoundError:
            try:
                create_table_with_add_actions(a.uri, Schema.from_arrow(table.schema), [add], mode="append",
                                              partition_by=["run_id"], storage_options=so)
            except Exception:  # another child created it first: append to it
                DeltaTable(a.uri, storage_options=so).create_write_transaction(
                    [add], "append", table.schema, partition_by=["run_id"], commit_properties=CommitProperties(max_commit_retries=50))

    def read() -> int:
        dt = DeltaTable(a.uri, storage_options=so)
        if a.unsafe:  # deltalake's default: a Python filesystem under Arrow's IO threads
            return dt.to_pyarrow_table().num_rows
        return dt.to_pyarrow_dataset(filesystem=pafs.SubTreeFileSystem(root, fs)).to_table().num_rows

    def guarded_read() -> int:
        if a.unsafe:
            return read()
        with runtime.native_call("read"):
            return read()

    rows = guarded_read()
    assert rows >= n, rows

    if a.thread == "daemon":
        stop = threading.Event()

        def loop() -> None:
            try:
                while not stop.is_set():
                    guarded_read()
            except runtime.LakeExitingError:
                pass

        t = threading.Thread(target=loop, name="lake-reader", daemon=True)
        if not a.unsafe:
            runtime.register_thread(t, stop.set)
        t.start()
        time.sleep(0.05)  # exit while the thread is inside a delta-rs call

    print(json.dumps({"rows": rows}), flush=True)
    if a.exit == "sysexit":
        sys.exit(0)
    if a.exit == "exception":
        raise RuntimeError("expected: an uncaught exception at exit")


def buffer_child(a: argparse.Namespace) -> None:
    """lakebuffer itself: push, queue a background snapshot, read, and exit without ``close()``
    (on a lake of its own next to the bare deltalake table, whose partitioning is not lakebuffer's)."""
    import tempfile

    import lakebuffer as lb
    from tests.rollouts import make_rollouts

    buf = lb.ReplayBuffer.open(tempfile.mkdtemp(prefix="exit-child-"), lake=a.uri.rstrip("/") + "-lakebuffer", storage_options=json.loads(a.buffer) or None,
                               run_id=f"exit-{uuid.uuid4().hex[:8]}", snapshot_interval_s=0.05, memory_limit_mb=8)
    buf.push(make_rollouts(64, tokens=32, seed=1))
    buf.snapshot(wait=True)
    buf.push(make_rollouts(64, tokens=32, seed=2))
    buf.snapshot(wait=False)  # still running in a worker thread when the process exits
    print(json.dumps({"rows": len(buf)}), flush=True)
    if a.exit == "sysexit":
        sys.exit(0)
    if a.exit == "exception":
        raise RuntimeError("expected: an uncaught exception at exit")


if __name__ == "__main__":
    main()
