"""The process that holds a TransferQueue run's rollouts: one ``ReplayBuffer`` in a Ray actor.

TransferQueue creates a storage client in every process that calls ``tq.init()``; a lakebuffer
directory has one writer. So the buffer lives in one named actor and every client talks to it.
Batches travel as Arrow buffers (an IPC stream, or a table pickled with its buffers out of band), never
as pickled Python rows; on the store's node over its ZeroMQ socket (``tq_wire``), elsewhere through Ray. The actor is
started with ``max_restarts=-1``: after a crash (``kill -9``) Ray starts it again and ``open``
replays the WAL, so every put it acknowledged is back before it serves the next call.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..errors import SchemaError
from ..index import ipc_bytes, read_ipc  # re-exported: the store and its client share one wire format
from ..schema import ROLLOUT_SCHEMA, cast_to, parse_type
from .tq_wire import WireServer, ipc_buffer, serialized  # ipc_buffer re-exported

# bookkeeping columns the backend adds to the rollout schema (all metadata: usable in where=)
TQ_COLUMNS = pa.schema([
    pa.field("tq_partition", pa.string()),  # the TransferQueue partition (e.g. "train_0")
    pa.field("tq_index", pa.int64()),  # TransferQueue's global index of the sample
    pa.field("tq_fields", pa.string()),  # ",f1,f2,": the TransferQueue fields this row carries
])


GEN_DIR = "tq-gen-"  # generation n >= 1 of the store: <path>/tq-gen-<n>


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


@serialized
class StoreBody:
    """The actor body: the buffers plus the calls the storage clients make (through Ray or the
    socket of ``tq_wire``; one call at a time).

    A buffer's schema is fixed when it is created, while TransferQueue fields appear with the puts
    that first carry them. So the store is a list of *generations*: generation 0 is ``path`` (the
    declared fields), and a put of a field no generation has opens the next one, ``path/tq-gen-<n>``,
    whose schema adds it (its own run in the same lake: every engine reads the lake's evolved table).
    New rows go to the newest generation; a row key says which generation holds it (``g<n>:`` prefix).
    """

    def __init__(self, path: str, open_kwargs: dict[str, Any], fields: dict[str, str] | None) -> None:
        from ..buffer import ReplayBuffer
        from .tq_journal import Journal

        self._lock = threading.RLock()
        self.path_, self.open_kwargs = Path(path), dict(open_kwargs)
        self.gens = [ReplayBuffer.open(path, schema=store_schema(fields), **open_kwargs)]
        n = 1
        while (self.path_ / f"{GEN_DIR}{n}").exists():
            self.gens.append(ReplayBuffer.open(str(self.path_ / f"{GEN_DIR}{n}"), **self._gen_kwargs(n)))
            n += 1
        self.keys = Journal(path, open_kwargs, self.gens[0].run_id)  # the controller's journal (keys, tags, clears)
        self._wire = WireServer(self)

    def endpoint(self) -> tuple[str, str, int]:
        """(node id, socket address, pid): where a client on the same node sends its calls."""
        return self._wire.endpoint()

    @property
    def buf(self) -> Any:
        """The generation new rows go to."""
        return self.gens[-1]

    def _gen_kwargs(self, n: int) -> dict[str, Any]:
        kw = {k: v for k, v in self.open_kwargs.items() if k != "run_id"}
        kw.setdefault("lake", str(self.path_ / "lake"))
        return {**kw, "run_id": f"{self.gens[0].run_id}.g{n}"}

    def schema(self) -> bytes:
        return self.buf.schema.serialize().to_pybytes()

    def path(self) -> str:
        return str(self.path_)

    def add_fields(self, fields: dict[str, str]) -> bytes:
        """Columns for TransferQueue fields no generation has yet (type text or ``json``): a new
        generation with them; returns the newest schema (the fields another client added included)."""
        from ..buffer import ReplayBuffer

        missing = {f: t for f, t in fields.items() if f not in self.buf.schema.names}
        if missing:
            extra = [f for f in self.buf.schema if f.name not in ROLLOUT_SCHEMA.names]
            declared = [f for f in store_schema(missing) if f.name not in TQ_COLUMNS.names]
            n = len(self.gens)
            self.buf.evict_all()  # its rows leave RAM: only the newest generation takes puts
            self.gens.append(ReplayBuffer.open(str(self.path_ / f"{GEN_DIR}{n}"), schema=pa.schema(extra + declared),
                                               **self._gen_kwargs(n)))
        return self.schema()

    def put(self, data: pa.Table | bytes) -> str:
        """Store one put (a table, or an IPC stream) in the newest generation; returns the prefix of its
        row keys. Idempotent, so a call retried after a crash it survived stores it once."""
        import pyarrow.compute as pc

        table = _table(data)
        n = len(self.gens) - 1
        prefix = f"g{n}:" if n else ""
        if prefix:
            table = table.set_column(0, "key", pc.binary_join_element_wise(prefix, table.column("key"), ""))
        try:
            self.buf.push(table)
        except SchemaError:
            # a batch is all-or-nothing: if its first key is stored, the whole batch was (a retry)
            if table.num_rows and self._stored(table.column("key")[:1].to_pylist()):
                return prefix
            raise
        return prefix

    def _stored(self, keys: list[str]) -> bool:
        return self.buf.count(where="key IN (" + ", ".join(_quote(k) for k in keys) + ")") == len(keys)

    def _gen_of(self, key: str) -> int:
        return int(key[1:key.index(":")]) if key.startswith("g") and ":" in key else 0

    def get(self, requests: Sequence[tuple[list[str], list[str]]]) -> list[pa.Table]:
        """For each (row keys, columns): those rows' columns, in key order (a table pickles its
        buffers out of band: the socket and Ray send them without a copy into a stream)."""
        out = []
        for keys, columns in requests:
            gens = {self._gen_of(k) for k in keys}
            if len(gens) == 1:
                out.append(self.gens[gens.pop()].get(keys, columns=list(columns)))
                continue
            import pyarrow.compute as pc

            parts = [self.gens[g].get([k for k in keys if self._gen_of(k) == g], columns=["key", *columns])
                     for g in sorted(gens)]
            table = pa.concat_tables(parts, promote_options="permissive")
            order = pc.index_in(pa.array(keys), table.column("key"))
            out.append(table.take(order).select(list(columns)))
        return out

    def delete(self, partition: str, indexes: list[int]) -> int:
        """Delete every row of these samples (all puts, overwritten ones included)."""
        if not indexes:
            return 0
        where = f"tq_partition = {_quote(partition)} AND tq_index IN ({', '.join(str(int(i)) for i in indexes)})"
        return sum(g.delete(where=where) for g in self.gens)

    def delete_keys(self, keys: list[str]) -> int:
        done = 0
        for g in {self._gen_of(k) for k in keys}:
            done += self.gens[g].delete(keys=[k for k in keys if self._gen_of(k) == g])
        return done

    def save(self, directory: str) -> int:
        """Write every stored row to ``<directory>/rows.parquet`` (``rows-g<n>.parquet`` for generation n;
        TransferQueue's storage checkpoint)."""
        import pyarrow.parquet as pq

        os.makedirs(directory, exist_ok=True)
        rows = 0
        for n, buf in enumerate(self.gens):
            name = f"rows-g{n}.parquet" if n else "rows.parquet"
            tmp, final = os.path.join(directory, name + ".tmp"), os.path.join(directory, name)
            with pq.ParquetWriter(tmp, buf.schema, compression="zstd") as writer:
                for batch in buf.scan():
                    writer.write_table(cast_to(batch, buf.schema))
                    rows += batch.num_rows
            os.replace(tmp, final)  # a crash mid-save leaves the previous checkpoint's file whole
        return rows

    def load(self, directory: str) -> int:
        """Push back the rows of a checkpoint the buffer no longer holds (those cleared since);
        rows put after the checkpoint stay. Returns the rows restored."""
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        if not os.path.exists(os.path.join(directory, "rows.parquet")):
            raise SchemaError(f"no lakebuffer rows in the TransferQueue checkpoint {directory} (rows.parquet)")
        restored = 0
        for n, buf in enumerate(self.gens):
            path = os.path.join(directory, f"rows-g{n}.parquet" if n else "rows.parquet")
            if not os.path.exists(path):
                continue
            present = buf.sql("SELECT key FROM rollouts").column("key").combine_chunks()
            for batch in pq.ParquetFile(path).iter_batches():
                keep = pc.invert(pc.is_in(batch.column("key"), value_set=present))
                missing = pa.Table.from_batches([batch]).filter(keep)
                if missing.num_rows:
                    buf.push(missing)
                    restored += missing.num_rows
        return restored

    def journal(self, records: pa.Table | bytes) -> int:
        """The controller's journal records of one acknowledged operation (durable on return)."""
        return self.keys.append(_table(records))

    def journal_state(self) -> pa.Buffer:
        """The live samples of the journal, for a new controller to take back."""
        return ipc_buffer(self.keys.state())

    def journal_target(self) -> tuple[str, int, bool]:
        """For a controller on this node: the directory of its journal segments, the number its next
        record gets, and whether appends are fsynced (``sync``)."""
        return str(self.keys.segments_dir), self.keys.next_seq(), self.keys.sync

    def journal_drain(self) -> None:
        """A controller closed a segment: its records into the journal buffer."""
        self.keys.drain()

    def sql(self, query: str) -> bytes:
        """Read-only SQL over ``rollouts`` (the values) and ``tq_keys`` (TransferQueue's keys and tags)."""
        if "tq_keys" not in query and len(self.gens) == 1:
            return ipc_bytes(self.buf.sql(query))
        import duckdb

        from ..sandbox import check_read_only, sandbox

        check_read_only(query)
        con = duckdb.connect()
        try:  # the keys (O(metadata)) and the rollouts streamed from every tier (bounded memory)
            con.register("tq_keys", self.keys.keys_table())
            for n, g in enumerate(self.gens):
                con.register(f"gen{n}", pa.RecordBatchReader.from_batches(g.schema, g.scan()))
            con.execute("CREATE VIEW rollouts AS " + " UNION ALL BY NAME ".join(
                f"SELECT * FROM gen{n}" for n in range(len(self.gens))))
            sandbox(con, memory_limit_bytes=self.buf.memory_limit_bytes)
            return ipc_bytes(con.sql(query).to_arrow_table())
        finally:
            con.close()

    def count(self, where: str | None = None) -> int:
        return sum(g.count(where) for g in self.gens)

    def tiers(self) -> dict[str, int]:
        """Rows per tier and WAL segments (where a put lives: RAM + WAL, or the warm tier)."""
        out = {"hot": 0, "warm": 0, "wal_segments": 0, "generations": len(self.gens)}
        for g in self.gens:
            st = g.stats()
            out["hot"] += st["hot"]["rows"]
            out["warm"] += st["warm"]["rows"]
            out["wal_segments"] += st["wal"]["segments"]
        return out

    def flush(self) -> None:
        for g in self.gens:
            g.flush()

    def snapshot(self) -> int:
        rows = 0
        self.keys.drain(with_open=True)  # the journal's records into its buffer: the lake gets every key and tag
        for g in [*self.gens, self.keys.buf]:
            snap = g.snapshot(wait=True)
            rows += snap.rows if snap is not None and g is not self.keys.buf else 0
        return rows

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        self._wire.close()
        self.keys.close()
        for g in self.gens:
            g.close()


def _table(data: pa.Table | bytes) -> pa.Table:
    return data if isinstance(data, pa.Table) else read_ipc(data)


def _quote(text: str) -> str:
    return "'" + str(text).replace("'", "''") + "'"
