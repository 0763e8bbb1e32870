"""The store side of TransferQueue's durable controller: its journal, a lakebuffer of state records.

Each record is the state of one sample after an acknowledged TransferQueue operation (its key,
tags, fields with their schema and row keys), or a clear of a sample or of a partition; records are
numbered (``tq_seq``) in the order the controller made them. ``state()`` folds them into the live
samples (what a restarted controller is given back). Records another one superseded are deleted in
batches, state records before the clears that masked them, so a crash mid-way never brings a
cleared sample back. The journal is a ``ReplayBuffer`` like any other (WAL, the lake, SQL): keys and
tags of a verl V1 run are queryable next to its rollouts (``tq_keys`` in :meth:`StoreBody.sql`).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..schema import ROLLOUT_SCHEMA
from .tq_controller import JOURNAL_SCHEMA, fold

SCHEMA = pa.schema([*JOURNAL_SCHEMA, pa.field("tq_seq", pa.int64())])
COMPACT_EVERY = 4096  # records the log holds before they go into the buffer (and superseded ones are deleted)
DIRNAME = "tq-keys"
LOG_NAME = "tq-keys.log"


def neutral(col: str, type_: pa.DataType, part: pa.Array, idx: pa.Array) -> pa.Array:
    """A placeholder for a rollout column a row does not carry (``tq_fields`` says which it does)."""
    n = len(idx)
    if col == "prompt_id":
        return pc.binary_join_element_wise(part, pc.cast(idx, pa.string()), "/")
    if pa.types.is_list(type_):
        return pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, dtype=np.int32)), pa.array([], type_.value_type))
    return pa.array(np.zeros(n)).cast(type_)


REQUIRED = ("prompt_id", "policy_version", "prompt_ids", "response_ids", "reward")


class Journal:
    """The controller's journal in ``<path>/tq-keys`` (its own run in the same lake).

    An acknowledged record is first appended to ``<path>/tq-keys.log`` (one length-prefixed Arrow IPC
    stream per call, flushed to the OS: what the WAL does for a push, at a fraction of a push's fixed
    cost); every ``COMPACT_EVERY`` records, at a snapshot and at close the log's records are pushed into
    the journal buffer in one batch, superseded ones deleted, and the log emptied. A crash between the
    push and the truncation leaves records in both: the next open pushes only the keys it lacks."""

    def __init__(self, path: str, open_kwargs: dict[str, Any], run_id: str) -> None:
        from ..buffer import ReplayBuffer

        kwargs = {k: v for k, v in open_kwargs.items() if k not in ("max_rows", "max_policy_lag", "run_id")}
        kwargs["memory_limit_mb"] = min(float(kwargs.get("memory_limit_mb") or 64), 64)
        kwargs.setdefault("lake", str(Path(path) / "lake"))
        self.sync = bool(open_kwargs.get("sync"))
        self.buf = ReplayBuffer.open(str(Path(path) / DIRNAME), schema=SCHEMA, run_id=f"{run_id}.tq-keys", **kwargs)
        self.log_path = Path(path) / LOG_NAME
        self.tail: list[pa.Table] = []  # records in the log, not yet in the buffer
        self._push_new(_read_log(self.log_path))
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - held open for appends, closed in close()
        all_records = self.buf.sql("SELECT key, tq_op, tq_partition, tq_index, tq_seq FROM rollouts")
        self.seq = int(pc.max(all_records.column("tq_seq")).as_py() or 0) + 1 if all_records.num_rows else 1
        self.latest: dict[str, dict[int, str]] = defaultdict(dict)  # partition -> index -> key of its state
        live = fold(all_records)
        for key, pid, gi in zip(*(live.column(c).to_pylist() for c in ("key", "tq_partition", "tq_index")),
                                strict=True):
            self.latest[pid][gi] = key
        live_keys = set(live.column("key").to_pylist())
        ops = all_records.column("tq_op").to_pylist()
        self.stale: list[str] = [k for k, op in zip(all_records.column("key").to_pylist(), ops, strict=True)
                                 if k not in live_keys and op == "state"]
        self.clears: list[str] = [k for k, op in zip(all_records.column("key").to_pylist(), ops, strict=True)
                                  if op != "state"]
        self.compact()

    def _push_new(self, records: pa.Table | None) -> None:
        """Push journal records (key, journal columns, tq_seq) the buffer does not hold yet."""
        if records is None or records.num_rows == 0:
            return
        present = self.buf.sql("SELECT key FROM rollouts").column("key").combine_chunks()
        records = records.filter(pc.invert(pc.is_in(records.column("key"), value_set=present)))
        if records.num_rows == 0:
            return
        cols = {c: records.column(c) for c in ("key", *JOURNAL_SCHEMA.names, "tq_seq")}
        part, idx = records.column("tq_partition"), records.column("tq_index")
        for col in REQUIRED:
            cols[col] = neutral(col, ROLLOUT_SCHEMA.field(col).type, part, idx)
        self.buf.push(pa.table(cols))

    def append(self, records: pa.Table) -> int:
        """Store records durably (they are acknowledged when this returns), in arrival order."""
        from ..index import ipc_bytes

        n = records.num_rows
        if n == 0:
            return 0
        seq = pa.array(np.arange(self.seq, self.seq + n, dtype=np.int64))
        keys = pc.binary_join_element_wise("j", pc.cast(seq, pa.string()), "")
        table = pa.table({"key": keys, **{c: records.column(c) for c in JOURNAL_SCHEMA.names}, "tq_seq": seq})
        data = ipc_bytes(table)
        self.log.write(len(data).to_bytes(8, "little") + data)
        self.log.flush()  # in the OS: survives a SIGKILL of the process, like a push's WAL write
        if self.sync:
            os.fsync(self.log.fileno())
        self.tail.append(table)
        self.seq += n
        part, idx = records.column("tq_partition"), records.column("tq_index")
        for key, op, pid, gi in zip(keys.to_pylist(), records.column("tq_op").to_pylist(), part.to_pylist(),
                                    idx.to_pylist(), strict=True):
            if op == "clear_partition":
                self.stale += self.latest.pop(pid, {}).values()
                self.clears.append(key)
                continue
            old = self.latest[pid].pop(gi, None)
            if old is not None:
                self.stale.append(old)
            if op == "state":
                self.latest[pid][gi] = key
            else:
                self.clears.append(key)
        if sum(t.num_rows for t in self.tail) >= COMPACT_EVERY:
            self.drain()
        return n

    def drain(self) -> None:
        """The log's records into the buffer (one push), superseded records deleted, the log emptied."""
        if self.tail:
            self._push_new(pa.concat_tables(self.tail))
            self.tail = []
        self.compact()
        self.log.seek(0)
        self.log.truncate()
        self.log.flush()

    def compact(self) -> None:
        """Delete superseded records: state records first, then the clears that masked them."""
        if self.stale:
            self.buf.delete(keys=self.stale)
            self.stale = []
        if self.clears:
            self.buf.delete(keys=self.clears)
            self.clears = []

    def state(self) -> pa.Table:
        """The live samples (the newest state of each), O(metadata)."""
        cols = ["key", *JOURNAL_SCHEMA.names, "tq_seq"]
        stored = self.buf.sql(f"SELECT {', '.join(cols)} FROM rollouts")
        return fold(pa.concat_tables([stored, *(t.select(cols) for t in self.tail)]))

    def keys_table(self) -> pa.Table:
        """The live samples as a table for SQL: partition, index, key, tags, fields."""
        t = self.state().select(["tq_partition", "tq_index", "tq_key", "tq_tags", "tq_rows", "tq_schema", "tq_seq"])
        fields = [",".join(sorted(json.loads(s))) for s in t.column("tq_schema").to_pylist()]
        return t.append_column("tq_fields", pa.array(fields, pa.string()))

    def close(self) -> None:
        self.drain()
        self.log.close()
        self.buf.close()


def _read_log(path: Path) -> pa.Table | None:
    """The records of a journal log; a torn last frame (a crash mid-append: never acknowledged) is ignored."""
    from ..index import read_ipc

    if not path.exists():
        return None
    data = path.read_bytes()
    tables, pos = [], 0
    while pos + 8 <= len(data):
        size = int.from_bytes(data[pos:pos + 8], "little")
        if pos + 8 + size > len(data):
            break
        tables.append(read_ipc(data[pos + 8:pos + 8 + size]))
        pos += 8 + size
    return pa.concat_tables(tables) if tables else None
