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

SCHEMA = pa.schema([*JOURNAL_SCHEMA, pa.field("tq_seq", pa.int64())])
COMPACT_EVERY = 4096  # superseded records deleted per batch
DIRNAME = "tq-keys"


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
    """The controller's journal in ``<path>/tq-keys`` (its own run in the same lake)."""

    def __init__(self, path: str, open_kwargs: dict[str, Any], run_id: str) -> None:
        from ..buffer import ReplayBuffer

        kwargs = {k: v for k, v in open_kwargs.items() if k not in ("max_rows", "max_policy_lag", "run_id")}
        kwargs["memory_limit_mb"] = min(float(kwargs.get("memory_limit_mb") or 64), 64)
        kwargs.setdefault("lake", str(Path(path) / "lake"))
        self.buf = ReplayBuffer.open(str(Path(path) / DIRNAME), schema=SCHEMA, run_id=f"{run_id}.tq-keys", **kwargs)
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

    def append(self, records: pa.Table) -> int:
        """Store records durably (they are acknowledged when this returns), in arrival order."""
        n = records.num_rows
        if n == 0:
            return 0
        seq = pa.array(np.arange(self.seq, self.seq + n, dtype=np.int64))
        keys = pc.binary_join_element_wise("j", pc.cast(seq, pa.string()), "")
        cols = {"key": keys, **{c: records.column(c) for c in JOURNAL_SCHEMA.names}, "tq_seq": seq}
        part, idx = records.column("tq_partition"), records.column("tq_index")
        for col in REQUIRED:
            cols[col] = neutral(col, ROLLOUT_SCHEMA.field(col).type, part, idx)
        self.buf.push(pa.table(cols))
        self.seq += n
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
        if len(self.stale) + len(self.clears) >= COMPACT_EVERY:
            self.compact()
        return n

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
        return fold(self.buf.sql("SELECT * FROM rollouts"))

    def keys_table(self) -> pa.Table:
        """The live samples as a table for SQL: partition, index, key, tags, fields."""
        t = self.state().select(["tq_partition", "tq_index", "tq_key", "tq_tags", "tq_rows", "tq_schema", "tq_seq"])
        fields = [",".join(sorted(json.loads(s))) for s in t.column("tq_schema").to_pylist()]
        return t.append_column("tq_fields", pa.array(fields, pa.string()))

    def close(self) -> None:
        self.compact()
        self.buf.close()
