"""Decides how a TransferQueue put reaches the store on its node (issue 28, put <= 1.5x): three hand-offs, one run.

    PYTHONPATH=. .venv/bin/python benchmarks/put_handoff.py [--length 16384] [--blocks 12]

``StoreBody`` behind its ZeroMQ socket (no Ray), a TransferQueue-shaped put of 16 samples x ``length``
(int64 ids + float32 log-probs), alternated in blocks of 25, each put deleted after it is timed:

* ``socket``: today's path, the table pickled with its buffers out of band over the Unix socket.
* ``memfd``: the client writes an Arrow IPC stream into a sealed ``memfd`` (no shrink, no write: the
  store can map it without SIGBUS), the store opens it through ``/proc/<pid>/fd`` and maps it.
* ``wal_file``: the client conforms the table and writes the WAL segment itself (Arrow IPC file + CRC
  footer, the ``WriteAheadLog`` format); the store reads it back, checks the CRC and takes the rows
  without writing a segment (the rename into the WAL stands in for the write it saves).
"""

from __future__ import annotations

import argparse
import fcntl
import mmap
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import zmq
from crc32c import crc32c

from lakebuffer.engine.ingest import now_us
from lakebuffer.integrations.tq_journal import REQUIRED, neutral
from lakebuffer.integrations.tq_store import StoreBody
from lakebuffer.integrations.tq_wire import _dumps, _loads
from lakebuffer.schema import conform
from lakebuffer.tiers.wal import WriteAheadLog

SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE


def put_memfd(self: StoreBody, pid: int, fd: int, size: int) -> str:
    f = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY)
    try:
        assert fcntl.fcntl(f, fcntl.F_GET_SEALS) & SEALS == SEALS
        mm = mmap.mmap(f, size, prot=mmap.PROT_READ)
    finally:
        os.close(f)
    return self.put(pa.ipc.open_stream(pa.py_buffer(mm)).read_all())


def put_wal_file(self: StoreBody, path: str) -> str:
    with pa.OSFile(path) as src:
        buf = src.read_buffer()
    n = buf.size
    body = buf.slice(0, n - 8)
    assert crc32c(memoryview(body)) == int.from_bytes(buf[n - 8:n - 4].to_pybytes(), "little")
    table = pa.ipc.open_file(pa.BufferReader(body)).read_all()
    state = self.buf._state
    state.durability = "none"  # the segment is already written: the push takes the rows only
    try:
        prefix = self.put(table)
    finally:
        state.durability = "wal"
    os.replace(path, path + ".adopted")
    os.unlink(path + ".adopted")
    return prefix


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--length", type=int, default=16384)
    ap.add_argument("--blocks", type=int, default=12)
    a = ap.parse_args()
    root = tempfile.mkdtemp(dir=os.environ.get("BENCH_DIR", "/work" if os.path.isdir("/work") else None))
    StoreBody.put_memfd, StoreBody.put_wal_file = put_memfd, put_wal_file
    store = StoreBody(root, {"snapshot_interval_s": 0, "memory_limit_mb": 2048},
                      {"input_ids": "list<int64>", "logprobs": "list<float32>", "score": "float32"})
    incoming = Path(root) / "incoming"
    client_wal = WriteAheadLog(incoming)
    L = a.length
    offsets = pa.array(np.arange(0, 17 * L, L, dtype=np.int32))

    def table() -> pa.Table:
        idx = pa.array(np.arange(16, dtype=np.int64))
        part = pa.array(["bench"] * 16)
        cols = {"key": pc.binary_join_element_wise(uuid.uuid4().hex[:16], pc.cast(idx, pa.string()), "/"),
                "input_ids": pa.ListArray.from_arrays(offsets, pa.array(np.arange(16 * L, dtype=np.int64))),
                "logprobs": pa.ListArray.from_arrays(offsets, pa.array(np.random.rand(16 * L).astype(np.float32))),
                "score": pa.array(np.random.rand(16).astype(np.float32)), "tq_partition": part, "tq_index": idx,
                "tq_fields": pa.repeat(pa.scalar(",input_ids,logprobs,score,"), 16)}
        for c in REQUIRED:
            cols.setdefault(c, neutral(c, store.gens[0].schema.field(c).type, part, idx))
        return pa.table(cols)

    sock = zmq.Context().socket(zmq.REQ)
    sock.connect(store._wire.address)

    def call(method: str, *args: object) -> object:
        sock.send_multipart(_dumps((method, args)), copy=False)
        status, *frames = sock.recv_multipart(copy=False)
        assert status.bytes == b"ok", frames[0].bytes[:300]
        return _loads(frames)

    def socket_put(t: pa.Table) -> None:
        call("put", t)

    def memfd_put(t: pa.Table) -> None:
        fd = os.memfd_create("lbput", os.MFD_ALLOW_SEALING | os.MFD_CLOEXEC)
        try:
            with pa.OSFile(f"/proc/self/fd/{fd}", "wb") as sink, pa.ipc.new_stream(sink, t.schema) as w:
                w.write_table(t)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
            call("put_memfd", os.getpid(), fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)

    def wal_file_put(t: pa.Table) -> None:
        conformed = conform(t, store.buf.schema, run_id=store.buf.run_id, now=now_us(), keys=None)
        final = incoming / uuid.uuid4().hex
        client_wal._write(final, final.with_suffix(".tmp"), conformed, None)
        call("put_wal_file", str(final))

    times: dict[str, list[float]] = {"socket": [], "memfd": [], "wal_file": []}
    fns = {"socket": socket_put, "memfd": memfd_put, "wal_file": wal_file_put}
    for _ in range(a.blocks):
        for name, fn in fns.items():
            for _ in range(25):
                t = table()
                t0 = time.perf_counter()
                fn(t)
                times[name].append(time.perf_counter() - t0)
                call("delete_keys", t.column("key").to_pylist())
    print(f"16 x {L}, {a.blocks * 25} puts each (first block dropped), load {os.getloadavg()[0]:.2f}")
    for name, xs in times.items():
        print(f"  {name:9s} put median {statistics.median(xs[25:]) * 1e3:6.2f} ms")
    store.close()


if __name__ == "__main__":
    main()
