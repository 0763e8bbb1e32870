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
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..schema import ROLLOUT_SCHEMA
from .tq_controller import JOURNAL_SCHEMA, fold
from .tq_journal_log import DIRNAME as SEGMENTS_DIR
from .tq_journal_log import Sequencer, append_frame, read_frames, segments

SCHEMA = pa.schema([*JOURNAL_SCHEMA, pa.field("tq_seq", pa.int64())])
RECORD_COLUMNS = ["key", *SCHEMA.names]  # a record as logged and pushed
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

    Acknowledged records arrive two ways: a controller on this node appends them to its own segments
    (``tq_journal_log``: ``<path>/tq-keys.d``); one on another node sends them here, where they are
    appended to ``<path>/tq-keys.log`` (one length-prefixed Arrow IPC stream per call, flushed to the
    OS: what the WAL does for a push). Records are numbered by the controller (``tq_seq``). At every
    ``COMPACT_EVERY`` records of the log, a segment's rotation, a snapshot, open and close, the records
    not yet taken (``tq_seq`` above ``taken``) go into the journal buffer in one push, superseded ones
    are deleted, then the log is emptied and the closed segments removed. A crash between the push and
    that leaves records in both: records at or below ``taken`` are never pushed twice."""

    def __init__(self, path: str, open_kwargs: dict[str, Any], run_id: str) -> None:
        from ..buffer import ReplayBuffer

        kwargs = {k: v for k, v in open_kwargs.items() if k not in ("max_rows", "max_policy_lag", "run_id")}
        kwargs["memory_limit_mb"] = min(float(kwargs.get("memory_limit_mb") or 64), 64)
        kwargs.setdefault("lake", str(Path(path) / "lake"))
        self.sync = bool(open_kwargs.get("sync"))
        self.buf = ReplayBuffer.open(str(Path(path) / DIRNAME), schema=SCHEMA, run_id=f"{run_id}.tq-keys", **kwargs)
        self.log_path = Path(path) / LOG_NAME
        self.segments_dir = Path(path) / SEGMENTS_DIR
        all_records = self.buf.sql("SELECT key, tq_op, tq_partition, tq_index, tq_seq FROM rollouts")
        self.taken = int(pc.max(all_records.column("tq_seq")).as_py() or 0) if all_records.num_rows else 0
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
        self.tail: list[pa.Table] = []  # the log's records, not yet in the buffer
        self.log = open(self.log_path, "ab")  # noqa: SIM115 - held open for appends, closed in close()
        try:
            self.tail = read_frames(self.log_path)
            self.drain()
        except BaseException:  # e.g. a damaged segment: reported, and the directory is not left locked
            self.log.close()
            self.buf.close()
            raise

    def _take(self, tables: list[pa.Table]) -> None:
        """Push the records above ``taken`` (in ``tq_seq`` order) and note what they supersede."""
        if not tables:
            return
        records = pa.concat_tables([t.select(RECORD_COLUMNS) for t in tables])
        records = records.filter(pc.greater(records.column("tq_seq"), self.taken))
        if records.num_rows == 0:
            return
        records = records.sort_by([("tq_seq", "ascending")])
        cols = {c: records.column(c) for c in RECORD_COLUMNS}
        part, idx = records.column("tq_partition"), records.column("tq_index")
        for col in REQUIRED:
            cols[col] = neutral(col, ROLLOUT_SCHEMA.field(col).type, part, idx)
        self.buf.push(pa.table(cols))
        self.taken = int(pc.max(records.column("tq_seq")).as_py())
        for key, op, pid, gi in zip(records.column("key").to_pylist(), records.column("tq_op").to_pylist(),
                                    part.to_pylist(), idx.to_pylist(), strict=True):
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

    def append(self, records: pa.Table) -> int:
        """Store records of a controller on another node durably (acknowledged when this returns), in
        arrival order; records without ``tq_seq`` are numbered here."""
        n = records.num_rows
        if n == 0:
            return 0
        table = records if "tq_seq" in records.column_names else Sequencer(self.next_seq()).number(records)
        append_frame(self.log.fileno(), table.select(RECORD_COLUMNS), self.sync)
        self.tail.append(table)
        if sum(t.num_rows for t in self.tail) >= COMPACT_EVERY:
            self.drain()
        return n

    def _pending(self, with_open: bool) -> tuple[list[pa.Table], list[Path]]:
        """Records not necessarily in the buffer: the log's, the closed segments' (and the open ones')."""
        closed, open_ = segments(self.segments_dir)
        tables = list(self.tail)
        for seg in [*closed, *(open_ if with_open else [])]:
            tables += read_frames(seg)
        return tables, closed

    def drain(self, with_open: bool = False) -> None:
        """Pending records into the buffer (one push), superseded records deleted, the log emptied,
        closed segments removed. ``with_open``: the open segments' records too (their files stay)."""
        tables, closed = self._pending(with_open)
        self._take(tables)
        self.compact()
        self.tail = []
        self.log.seek(0)
        self.log.truncate()
        self.log.flush()
        for seg in closed:
            seg.unlink(missing_ok=True)

    def next_seq(self) -> int:
        """The number the next record gets: above every record stored, logged or in a segment."""
        tables, _ = self._pending(with_open=True)
        seqs = [self.taken, *(int(pc.max(t.column("tq_seq")).as_py() or 0) for t in tables if t.num_rows)]
        return max(seqs) + 1

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
        stored = self.buf.sql(f"SELECT {', '.join(RECORD_COLUMNS)} FROM rollouts")
        pending = [t.select(RECORD_COLUMNS) for t in self._pending(with_open=True)[0]]
        pending = [t.filter(pc.greater(t.column("tq_seq"), self.taken)) for t in pending]
        return fold(pa.concat_tables([stored, *pending]))

    def keys_table(self) -> pa.Table:
        """The live samples as a table for SQL: partition, index, key, tags, fields."""
        t = self.state().select(["tq_partition", "tq_index", "tq_key", "tq_tags", "tq_rows", "tq_schema", "tq_seq"])
        fields = [",".join(sorted(json.loads(s))) for s in t.column("tq_schema").to_pylist()]
        return t.append_column("tq_fields", pa.array(fields, pa.string()))

    def close(self) -> None:
        try:
            self.drain(with_open=True)
        finally:  # a damaged segment stays for the next open to report; the buffer still closes
            self.log.close()
            self.buf.close()
