"""``Lake``: the cold store of the buffer, one Delta Lake table composed of a ``LakeFS`` (file bytes),
a ``DeltaLog`` (commits, versions, snapshot ids), the snapshot ``Writer`` and the verified ``FileReader``.

It implements ``lakebuffer.lake.ColdStore``; its public methods and their signatures are the ones the
rest of the package, the CLI and users call (see the package docstring for the layout and protocol).
A "manifest" is now a view of the Delta table: the run's live files at the version of one of its
snapshot commits, plus that commit's lakebuffer document (``snapshot_id``, ``version``, ``meta``...).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
from deltalake import DeltaTable

from ..errors import LakeError, OldLakeFormatError, ReadOnlyError, SchemaError
from ..predicate import partition_hint
from ..resources import render_sql
from ..schema import PARTITIONING, ROLLOUT_SCHEMA
from ..tiers.base import DeferredDataset
from . import commit, maintenance
from .claims import WriterClaims
from .delta import DeltaLog, app_id
from .entries import entries_of
from .fs import LakeFS
from .layout import DELTA_LOG, OLD_FORMAT_MARKERS, PARTITION_FIELDS, MiB, check_run_id
from .options import LakeOptions
from .reader import FileReader, read_group
from .rows import schema_from_b64, with_run_id
from .verified import verify_entries
from .writer import Writer

EMPTY_KEYS = pa.array([], pa.string())
DELTA_PROTOCOLS = {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "azure"}


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _option(name: str) -> property:
    """A ``Lake`` attribute backed by its frozen ``LakeOptions`` (assigning replaces the options)."""

    def get(self: Lake) -> Any:
        return getattr(self.options, name)

    def set_(self: Lake, value: Any) -> None:
        self.options = replace(self.options, **{name: value})

    return property(get, set_, doc=f"``LakeOptions.{name}``")


@dataclass(frozen=True)
class ViewRegistration:
    """A DuckDB view over a lake's rows, ready to put on a connection (``apply``: two quick calls)."""

    source: str
    dataset: Any
    sql: str

    def apply(self, con: Any) -> None:
        con.register(self.source, self.dataset)
        con.execute(self.sql)


class Lake:
    """Cold tier of the buffer: one Delta table, hive-partitioned by ``run_id`` and policy bucket.

    ``policy_bucket_size`` (``None``: the lake's stored value, else ``schemas/rollout.json``'s: 16 policy
    versions a partition) is fixed per lake at the first commit and stored in the table's description; opening with a different explicit value raises
    ``LakeError``. ``filesystem`` replaces the fsspec filesystem built from ``url`` for the data-file
    bytes (deltalake reaches the store with ``storage_options``). The other keyword arguments are
    ``LakeOptions``; each is also readable and assignable as an attribute of the lake.
    """

    row_group_bytes = _option("row_group_bytes")
    row_group_rows = _option("row_group_rows")
    target_file_bytes = _option("target_file_bytes")
    encode_threads = _option("encode_threads")
    read_concurrency = _option("read_concurrency")
    read_ahead_bytes = _option("read_ahead_bytes")
    ranged_reads = _option("ranged_reads")
    verify_reads = _option("verify_reads")
    memory_bytes = _option("memory_bytes")
    spill_dir = _option("spill_dir")

    def __init__(
        self,
        url: str,
        storage_options: dict | None = None,
        *,
        policy_bucket_size: int | None = None,
        read_only: bool = False,
        filesystem: fsspec.AbstractFileSystem | None = None,
        row_group_bytes: int = 32 * MiB,
        row_group_rows: int = 64 * 1024,
        target_file_bytes: int = 32 * MiB,
        encode_threads: int | None = None,
        read_concurrency: int = 3,
        read_ahead_bytes: int = 128 * MiB,
        ranged_reads: bool = False,
        verify_reads: bool = True,
        memory_bytes: int = 128 * MiB,
        spill_dir: str | None = None,
    ) -> None:
        self.read_only = read_only
        self.options = LakeOptions.build(
            row_group_bytes=row_group_bytes,
            row_group_rows=row_group_rows,
            target_file_bytes=target_file_bytes,
            encode_threads=encode_threads,
            read_concurrency=read_concurrency,
            read_ahead_bytes=read_ahead_bytes,
            ranged_reads=ranged_reads,
            verify_reads=verify_reads,
            memory_bytes=memory_bytes,
            spill_dir=spill_dir,
        )
        self.store = LakeFS(url, storage_options, filesystem)
        if not (self.store.local or self.store.protocol in DELTA_PROTOCOLS):
            raise LakeError(
                f"lake {url!r}: deltalake cannot open {self.store.protocol}:// URLs; use a local path, s3://, gs:// "
                "or an Azure URL (abfss://, az://)"
            )
        self.delta = DeltaLog(self.store)
        self.claims = WriterClaims(self.store)
        self._format = ds.ParquetFileFormat(
            default_fragment_scan_options=ds.ParquetFragmentScanOptions(pre_buffer=True, page_checksum_verification=True)
        )
        self.store.probe()
        dt = self.delta.table()
        if dt is None:
            self._refuse_old_format()
        default = int(PARTITIONING.get("policy_bucket_size", 1))
        stored = self.delta.settings(dt).get("policy_bucket_size") if dt is not None else None
        if stored is not None:
            size = int(stored)
            if policy_bucket_size is not None and int(policy_bucket_size) != size:
                raise LakeError(
                    f"lake {self.url} is partitioned with policy_bucket_size={size}, not {policy_bucket_size}; "
                    "open it without policy_bucket_size or with the stored value"
                )
        else:
            size = int(policy_bucket_size) if policy_bucket_size is not None else default
        if size < 1:
            raise ValueError(f"policy_bucket_size must be >= 1, not {size}")
        self.policy_bucket_size = size

    def _refuse_old_format(self) -> None:
        for marker in OLD_FORMAT_MARKERS:
            with contextlib.suppress(Exception):
                if self.store.fs.exists(self.store.abs(marker)):
                    raise OldLakeFormatError(
                        f"lake {self.url} was written by lakebuffer's format before Delta Lake ({marker} and no "
                        f"{DELTA_LOG}/); this version reads Delta tables only. Snapshot the runs again into a new "
                        "lake URL (open each buffer with the new lake= and call snapshot()), or read the old lake "
                        "with the lakebuffer version that wrote it"
                    )

    # ---- where the lake is --------------------------------------------------------------
    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        """The fsspec filesystem of the lake."""
        return self.store.fs

    @property
    def url(self) -> str:
        """The lake's URL (an absolute path for a local lake): ``deltalake.DeltaTable(url)`` opens it."""
        return self.store.url

    @property
    def root(self) -> str:
        return self.store.root

    @property
    def protocol(self) -> str:
        return self.store.protocol

    @property
    def storage_options(self) -> dict:
        return self.store.storage_options

    @property
    def delta_storage_options(self) -> dict[str, str]:
        """``storage_options`` for deltalake / polars ``scan_delta`` readers: the ``AWS_*`` (etc.)
        connection keys (lakebuffer's own timeouts and retries stay out: not every reader takes them)."""
        return {k: v for k, v in self.delta.options.items() if k.isupper()}

    def table(self, version: int | None = None) -> DeltaTable | None:
        """The ``deltalake.DeltaTable`` (at ``version``), or None before the first commit."""
        return self.delta.table(version)

    def _check_writable(self) -> None:
        if self.read_only:
            raise ReadOnlyError(f"lake {self.url} is opened read-only")

    def _writer(self, run_id: str, snapshot_id: int, schema: pa.Schema, target: int, **kw: Any) -> Writer:
        return Writer(self.store, self.options, self.policy_bucket_size, run_id, snapshot_id, schema, target, **kw)

    # ---- snapshots ----------------------------------------------------------------------
    def snapshots(self, run_id: str) -> list[int]:
        """Committed snapshot ids of a run, oldest first (each is one Delta version)."""
        dt = self.delta.table()
        return sorted(self.delta.run_commits(dt, run_id)) if dt is not None else []

    def snapshot_docs(self, run_id: str) -> dict[int, dict]:
        """snapshot id -> the commit document (``meta``, ``summary``, ``version``...) of each snapshot
        of a run, read from the Delta log without listing files (reconciliation after a crash)."""
        dt = self.delta.table()
        if dt is None:
            return {}
        return {sid: {**doc, "version": v} for sid, (v, doc) in self.delta.run_commits(dt, run_id).items()}

    def _manifest(self, dt: DeltaTable, run_id: str, sid: int, version: int, doc: dict, files_dt: DeltaTable) -> dict:
        files = entries_of(files_dt, run_id)
        return {
            "snapshot_id": sid,
            "parent_id": sid - 1 if sid > 1 else None,
            "version": version,
            "run_id": run_id,
            "operation": doc.get("operation", "append"),
            "created_at": doc.get("created_at"),
            "created_at_s": doc.get("created_at_s"),
            "schema": doc.get("schema"),
            "meta": doc.get("meta") or {},
            "summary": {
                **(doc.get("summary") or {}),
                "rows": sum(int(f["rows"] or 0) for f in files),  # the run's live rows at this version
                "files": len(files),
                "bytes": sum(int(f["bytes"]) for f in files),
            },
            "added_files": [f for f in files if f["snapshot_id"] == sid],
            "files": files,
            "delete_files": [],
        }

    def manifest(self, run_id: str, snapshot_id: int) -> dict:
        """Snapshot ``snapshot_id`` of a run: its commit document and the run's files at its version."""
        dt = self.delta.table()
        commits = self.delta.run_commits(dt, run_id) if dt is not None else {}
        if int(snapshot_id) not in commits:
            raise LakeError(f"run {run_id!r} of lake {self.url} has no snapshot {snapshot_id}")
        version, doc = commits[int(snapshot_id)]
        latest = dt.transaction_version(app_id(run_id))
        files_dt = dt if latest == int(snapshot_id) else self.delta.table(version)
        return self._manifest(dt, run_id, int(snapshot_id), version, doc, files_dt)

    def latest_manifest(self, run_id: str) -> dict | None:
        """The newest snapshot of ``run_id`` with the run's files as of the latest version (the same
        rows; compaction may have rewritten the files since), or None when the run has none."""
        dt = self.delta.table()
        if dt is None:
            return None
        sid = dt.transaction_version(app_id(run_id))
        if sid is None:
            return None
        commits = self.delta.run_commits(dt, run_id)
        version, doc = commits.get(int(sid), (None, {}))
        return self._manifest(dt, run_id, int(sid), version, doc, dt)

    def runs(self) -> list[str]:
        """Runs with at least one committed snapshot, sorted."""
        dt = self.delta.table()
        if dt is None:
            return []
        runs = {d["run_id"] for d in self.delta.docs(dt).values() if d.get("operation") == "append"}
        runs |= {e["run_id"] for e in entries_of(dt)}
        return sorted(runs)

    def _selected(self, run_id: str | None, snapshot_id: int | None) -> tuple[list[dict], dict[str, dict]]:
        """(live files, run -> commit doc of its latest snapshot) of one run or all runs."""
        dt = self.delta.table()
        if dt is None:
            return [], {}
        if run_id is None:
            if snapshot_id is not None:
                raise ValueError("snapshot_id needs a run_id")
            docs: dict[str, dict] = {}
            for _, d in sorted(self.delta.docs(dt).items()):
                if d.get("operation") == "append":
                    docs[d["run_id"]] = d
            return entries_of(dt), docs
        check_run_id(run_id)
        if snapshot_id is None:
            m = self.latest_manifest(run_id)
        else:
            m = self.manifest(run_id, snapshot_id)
        if m is None:
            return [], {}
        return m["files"], {run_id: m}

    # ---- read side ----------------------------------------------------------------------
    def files(self, run_id: str | None = None, *, snapshot_id: int | None = None) -> list[str]:
        """URLs (local: absolute paths) of the live data files, all runs if ``run_id`` is None: exactly
        ``DeltaTable.file_uris()`` (Delta deletes rewrite files, so no row of them is deleted)."""
        return [self.store.url_of(f["path"]) for f in self._selected(run_id, snapshot_id)[0]]

    def deleted_keys(self, run_id: str | None = None, *, snapshot_id: int | None = None) -> pa.Array:
        """Always empty: deletes rewrite the files that held the keys (Delta copy-on-write)."""
        return EMPTY_KEYS

    def schema(self, run_id: str | None = None) -> pa.Schema:
        """Row schema of the lake (unified over runs), with the ``run_id`` and ``policy_bucket`` columns."""
        return self._dataset_schema(self._selected(run_id, None)[1])

    def _dataset_schema(self, docs: dict[str, dict], schema: pa.Schema | None = None) -> pa.Schema:
        if schema is None:
            schemas = [schema_from_b64(m["schema"]) for m in docs.values() if m.get("schema")]
            if not schemas:
                schema = ROLLOUT_SCHEMA
            elif len(schemas) == 1:
                schema = schemas[0]
            else:
                try:
                    schema = pa.unify_schemas(schemas)
                except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
                    raise SchemaError(f"runs of lake {self.url} have incompatible schemas: {e}") from e
        schema = with_run_id(schema)
        if "policy_bucket" not in schema.names:
            schema = schema.append(PARTITION_FIELDS[1])
        return schema

    def _fragment(self, entry: dict, filesystem: pafs.FileSystem, store: LakeFS | None = None) -> ds.Fragment:
        expr = (ds.field("run_id") == entry["run_id"]) & (ds.field("policy_bucket") == int(entry["policy_bucket"]))
        if entry.get("min_policy_version") is not None and entry.get("max_policy_version") is not None:
            expr = expr & (ds.field("policy_version") >= int(entry["min_policy_version"]))
            expr = expr & (ds.field("policy_version") <= int(entry["max_policy_version"]))
        return self._format.make_fragment(
            (store or self.store).abs(entry["path"]), filesystem=filesystem, partition_expression=expr,
            file_size=int(entry["bytes"])
        )

    def dataset(
        self,
        run_id: str | None = None,
        schema: pa.Schema | None = None,
        *,
        snapshot_id: int | None = None,
        apply_deletes: bool = True,
        verify: bool | None = None,
    ) -> ds.Dataset:
        """A pyarrow dataset over the table's live files (pinned to the version read now), partition
        columns ``run_id`` (string) and ``policy_bucket`` (int64); the same rows as
        ``DeltaTable(url).to_pyarrow_dataset()``.

        Each fragment carries ``run_id``, ``policy_bucket`` and the file's ``policy_version`` range as
        its partition expression, so filters on any of them skip other files without opening them.
        Unless ``verify=False`` (default: ``verify_reads``), each file not yet checked by this process
        is checked against the sha256 in its name first (``lake/verified.py``); pages are verified by
        their checksums as they are decoded. ``apply_deletes`` is accepted for compatibility: Delta
        deletes leave nothing to filter.
        """
        entries, docs = self._selected(run_id, snapshot_id)
        full = self._dataset_schema(docs, schema)
        verify = self.options.verify_reads if verify is None else verify
        fs = self.store.pafs
        if verify:
            verify_entries(self.store, entries)
        return ds.FileSystemDataset([self._fragment(f, fs) for f in entries], full, self._format, fs)

    def dataset_of(self, entries: list[dict], schema: pa.Schema, *, verify: bool | None = None,
                   store: LakeFS | None = None) -> ds.Dataset:
        """A pyarrow dataset over these committed file entries only (the buffer's cold tier: the files
        that hold its cold-only rows), verified like ``dataset``; from ``store`` when given (a local
        mirror of the files, ``tiers/mirror.py``)."""
        store = store or self.store
        verify = self.options.verify_reads if verify is None else verify
        if verify:
            verify_entries(store, entries)
        fs = store.pafs
        return ds.FileSystemDataset([self._fragment(f, fs, store) for f in entries], self._dataset_schema({}, schema),
                                    self._format, fs)

    def register(self, con: Any, view: str = "cold", run_id: str | None = None) -> None:
        """Create or replace the DuckDB view ``view`` over the table's live rows.

        No DuckDB extension is needed: the view reads a pyarrow dataset registered on ``con``, built
        and verified as ``dataset`` says when a query first reads it (binding the view reads no data
        file). The view is pinned to the version read now; call again to refresh.
        """
        self.view_of(view, run_id).apply(con)

    def view_of(self, view: str = "cold", run_id: str | None = None) -> ViewRegistration:
        """What ``register`` puts on a connection, read from the Delta log now (the slow part: a catalog
        reads it before it takes its connection's lock, ``Catalog.register_lake``)."""
        entries, docs = self._selected(run_id, None)  # pinned now, from the Delta log only
        full = self._dataset_schema(docs)
        # verified and built when a query reads the view, not here: an open binds views, reads no data
        dset = DeferredDataset.over(lambda: self.dataset_of(entries, full), full)
        source = f"__lakebuffer_{view}_dataset"
        return ViewRegistration(source, dset, render_sql("lake_view", view=_ident(view), source=_ident(source)))

    def prune_hint(self, where: str) -> str:
        """``where`` with redundant ``policy_bucket`` predicates ANDed for its top-level integer
        comparisons on ``policy_version`` (>=, >, =, <=, <, BETWEEN, IN), so engines that prune only on
        hive columns (DuckDB read_parquet, polars) skip other buckets. Anything else is left as is; a
        predicate with a top-level OR is returned unchanged."""
        return partition_hint(where, "policy_version", "policy_bucket", self.policy_bucket_size)

    def scan_batches(
        self,
        run_id: str,
        columns: list[str] | None = None,
        *,
        snapshot_id: int | None = None,
        verify: bool | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """Restore path: every live row of ``run_id`` as of its latest snapshot (or ``snapshot_id``),
        streamed one row group at a time, with the ``run_id`` column (``policy_bucket`` on request).
        Files are fetched by ``read_concurrency`` threads, up to ``read_ahead_bytes`` ahead of decoding,
        and checked against the sha256 in their names (``CorruptionError`` naming the file) unless
        ``verify=False``."""
        check_run_id(run_id)
        m = self.manifest(run_id, snapshot_id) if snapshot_id is not None else self.latest_manifest(run_id)
        if m is None:
            return
        verify = self.options.verify_reads if verify is None else verify
        row_schema = with_run_id(schema_from_b64(m["schema"])) if m.get("schema") else with_run_id(ROLLOUT_SCHEMA)
        if columns is None:
            out_schema = row_schema
        else:
            fields = []
            for c in columns:
                if c == "policy_bucket":
                    fields.append(PARTITION_FIELDS[1])
                elif c in row_schema.names:
                    fields.append(row_schema.field(c))
                else:
                    raise KeyError(f"column {c!r} is not in run {run_id!r} of lake {self.url}")
            out_schema = pa.schema(fields, metadata=row_schema.metadata)
        physical = [f.name for f in out_schema if f.name not in ("run_id", "policy_bucket")]
        for entry, pf, i in FileReader(self.store, self.options, m["files"], verify).row_groups():
            avail = set(pf.schema_arrow.names)
            t = read_group(self.store, entry, pf, i, [c for c in physical if c in avail])
            n = t.num_rows
            if n == 0:
                continue
            arrays = []
            for f in out_schema:
                if f.name == "run_id":
                    arrays.append(pa.repeat(pa.scalar(run_id, f.type), n))
                elif f.name == "policy_bucket":
                    arrays.append(pa.repeat(pa.scalar(int(entry["policy_bucket"]), pa.int64()), n))
                elif f.name in avail:
                    col = t.column(f.name)
                    arrays.append(col if col.type.equals(f.type) else col.cast(f.type))
                else:
                    arrays.append(pa.nulls(n, f.type))
            yield from pa.Table.from_arrays(arrays, schema=out_schema).to_batches()

    def verify(self, run_id: str | None = None) -> dict:
        """Check size and sha256 of every live file; ``CorruptionError`` naming every bad or missing
        file, else a summary."""
        return maintenance.verify(self, run_id)

    def stats(self, run_id: str | None = None) -> dict:
        """Sizes from the Delta log (no data read)."""
        entries, docs = self._selected(run_id, None)
        dt = self.delta.table()
        last: dict[str, int] = {}
        if dt is not None:
            for r in ([run_id] if run_id is not None else self.runs()):
                sid = dt.transaction_version(app_id(r))
                if sid is not None:
                    last[r] = int(sid)
        rows = sum(int(f["rows"] or 0) for f in entries)
        return {
            "runs": len(last),
            "files": len(entries),
            "rows": rows,
            "file_rows": rows,
            "deleted_keys": 0,
            "bytes": sum(int(f["bytes"]) for f in entries),
            "delete_files": 0,
            "last_snapshot_id": last,
            "version": dt.version() if dt is not None else None,
        }

    # ---- write side ---------------------------------------------------------------------
    def commit_snapshot(
        self,
        run_id: str,
        batches: Iterable[pa.Table | pa.RecordBatch],
        deleted_keys: Sequence[str] | pa.Array = (),
        *,
        meta: dict | None = None,
        force: bool = False,
    ) -> dict | None:
        """Append ``batches`` (streamed) and delete ``deleted_keys`` as one Delta commit = one snapshot
        of ``run_id``; return its manifest, or None for an empty snapshot unless ``force``. The protocol
        (copy-on-write deletes, the snapshot id as an app transaction, a lost reply) is ``lake/commit.py``."""
        self._check_writable()
        done = commit.commit_snapshot(self, run_id, batches, deleted_keys, meta=meta, force=force)
        if done is None:
            return None
        new_dt, sid, doc = done
        return self._manifest(new_dt, run_id, sid, new_dt.version(), doc, new_dt)

    # ---- compaction & gc ----------------------------------------------------------------
    def compact(
        self,
        run_id: str | None = None,
        target_file_bytes: int = 256 * 2**20,
        progress: Callable[[int, int], None] | None = None,
        *,
        small_file_fraction: float = 0.75,
    ) -> dict:
        """Delta compaction: per partition, rewrite files smaller than ``small_file_fraction *
        target_file_bytes`` (when there are two or more) into files of about ``target_file_bytes`` and
        commit them with ``dataChange=false`` (content unchanged, no snapshot id). Nothing is deleted:
        readers of older versions keep reading them; ``gc`` (vacuum) removes replaced files after its
        grace period. ``progress(bytes_done, bytes_total)`` is called as input bytes are rewritten."""
        self._check_writable()
        return maintenance.compact(self, run_id, target_file_bytes, progress, small_file_fraction)

    def gc(self, older_than_s: float = 3600) -> int:
        """Delta vacuum (``full=True``): remove files no version younger than ``older_than_s`` needs and
        files no commit lists (a crashed writer's) older than that; on S3 also abort multipart uploads a
        crashed writer left behind. Returns the number of files removed and uploads aborted."""
        self._check_writable()
        return maintenance.gc(self, older_than_s)

    def __repr__(self) -> str:
        return f"Lake({self.url!r}{', read_only=True' if self.read_only else ''})"

