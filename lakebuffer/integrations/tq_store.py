"""The process that holds a TransferQueue run's rollouts: one ``ReplayBuffer`` in a Ray actor.

TransferQueue creates a storage client in every process that calls ``tq.init()``; a lakebuffer
directory has one writer. So the buffer lives in one named actor and every client talks to it.
Batches travel as Arrow IPC streams (``bytes``), never as pickled Python rows. The actor is
started with ``max_restarts=-1``: after a crash (``kill -9``) Ray starts it again and ``open``
replays the WAL, so every put it acknowledged is back before it serves the next call.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from ..errors import SchemaError
from ..index import ipc_bytes, read_ipc  # re-exported: the store and its client share one wire format
from ..schema import ROLLOUT_SCHEMA, cast_to, parse_type

# bookkeeping columns the backend adds to the rollout schema (all metadata: usable in where=)
TQ_COLUMNS = pa.schema([
    pa.field("tq_partition", pa.string()),  # the TransferQueue partition (e.g. "train_0")
    pa.field("tq_index", pa.int64()),  # TransferQueue's global index of the sample
    pa.field("tq_fields", pa.string()),  # ",f1,f2,": the TransferQueue fields this row carries
])


def store_schema(fields: dict[str, str] | None) -> pa.Schema:
    """The extra columns of the buffer: the bookkeeping ones plus the declared TransferQueue fields."""
    extra = list(TQ_COLUMNS)
    for name, type_text in (fields or {}).items():
        if name in ROLLOUT_SCHEMA.names or name in TQ_COLUMNS.names:
            raise SchemaError(f"TransferQueue field {name!r} collides with a lakebuffer column; map it "
                              f"with columns: {{{name}: <field>}} instead of declaring it in fields")
        if str(type_text).strip() == "json":  # Python objects (verl's extra_fields, metrics): JSON text
            extra.append(pa.field(name, pa.string(), metadata={"lakebuffer.tq": "json"}))
            continue
        try:
            extra.append(pa.field(name, parse_type(str(type_text))))
        except ValueError as e:
            raise SchemaError(f"fields.{name}: {e}") from e
    return pa.schema(extra)


class StoreBody:
    """The actor body: the buffer plus the calls the storage clients make."""

    def __init__(self, path: str, open_kwargs: dict[str, Any], fields: dict[str, str] | None) -> None:
        from ..buffer import ReplayBuffer

        self.buf = ReplayBuffer.open(path, schema=store_schema(fields), **open_kwargs)

    def schema(self) -> bytes:
        return self.buf.schema.serialize().to_pybytes()

    def put(self, data: bytes) -> int:
        """Store one put; idempotent, so a call retried after a crash it survived stores it once."""
        table = read_ipc(data)
        try:
            self.buf.push(table)
        except SchemaError:
            # a batch is all-or-nothing: if its first key is stored, the whole batch was (a retry)
            if table.num_rows and self._stored(table.column("key")[:1].to_pylist()):
                return table.num_rows
            raise
        return table.num_rows

    def _stored(self, keys: list[str]) -> bool:
        return self.buf.count(where="key IN (" + ", ".join(_quote(k) for k in keys) + ")") == len(keys)

    def get(self, requests: Sequence[tuple[list[str], list[str]]]) -> list[bytes]:
        """For each (row keys, columns): those rows' columns, in key order, as an IPC stream."""
        return [ipc_bytes(self.buf.get(keys, columns=list(columns))) for keys, columns in requests]

    def delete(self, partition: str, indexes: list[int]) -> int:
        """Delete every row of these samples (all puts, overwritten ones included)."""
        if not indexes:
            return 0
        where = f"tq_partition = {_quote(partition)} AND tq_index IN ({', '.join(str(int(i)) for i in indexes)})"
        return self.buf.delete(where=where)

    def delete_keys(self, keys: list[str]) -> int:
        return self.buf.delete(keys=keys) if keys else 0

    def save(self, directory: str) -> int:
        """Write every stored row to ``<directory>/rows.parquet`` (TransferQueue's storage checkpoint)."""
        import pyarrow.parquet as pq

        os.makedirs(directory, exist_ok=True)
        tmp, final = os.path.join(directory, "rows.parquet.tmp"), os.path.join(directory, "rows.parquet")
        rows = 0
        with pq.ParquetWriter(tmp, self.buf.schema, compression="zstd") as writer:
            for batch in self.buf.scan():
                writer.write_table(cast_to(batch, self.buf.schema))
                rows += batch.num_rows
        os.replace(tmp, final)  # a crash mid-save leaves the previous checkpoint's file whole
        return rows

    def load(self, directory: str) -> int:
        """Push back the rows of a checkpoint the buffer no longer holds (those cleared since);
        rows put after the checkpoint stay. Returns the rows restored."""
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        path = os.path.join(directory, "rows.parquet")
        if not os.path.exists(path):
            raise SchemaError(f"no lakebuffer rows in the TransferQueue checkpoint {directory} (rows.parquet)")
        present = self.buf.sql("SELECT key FROM rollouts").column("key").combine_chunks()
        restored = 0
        for batch in pq.ParquetFile(path).iter_batches():
            keep = pc.invert(pc.is_in(batch.column("key"), value_set=present))
            missing = pa.Table.from_batches([batch]).filter(keep)
            if missing.num_rows:
                self.buf.push(missing)
                restored += missing.num_rows
        return restored

    def sql(self, query: str) -> bytes:
        return ipc_bytes(self.buf.sql(query))

    def count(self, where: str | None = None) -> int:
        return self.buf.count(where)

    def tiers(self) -> dict[str, int]:
        """Rows per tier and WAL segments (where a put lives: RAM + WAL, or the warm tier)."""
        st = self.buf.stats()
        return {"hot": st["hot"]["rows"], "warm": st["warm"]["rows"], "wal_segments": st["wal"]["segments"]}

    def flush(self) -> None:
        self.buf.flush()

    def snapshot(self) -> int:
        snap = self.buf.snapshot(wait=True)
        return snap.rows if snap is not None else 0

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        self.buf.close()


def _quote(text: str) -> str:
    return "'" + str(text).replace("'", "''") + "'"
