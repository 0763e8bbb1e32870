"""``Lake``: the cold store of the buffer, composed of a ``LakeFS`` (storage), a ``ManifestLog``
(commits), ``Tombstones`` (deletes), the snapshot ``Writer`` and the verified ``BlockReader``.

It implements ``lakebuffer.lake.ColdStore``; its public methods and their signatures are the ones the
rest of the package, the CLI and users call (see the package docstring for the on-disk layout).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from ..errors import LakeBufferError, LakeError, ReadOnlyError, SchemaError
from ..predicate import partition_hint
from ..resources import render_sql
from ..schema import PARTITIONING, ROLLOUT_SCHEMA, cast_to, key_array, unique_keys
from . import maintenance
from .claims import WriterClaims
from .fs import LakeFS
from .layout import PARTITION_FIELDS, MiB, check_run_id
from .manifest import ManifestLog, ensure_settings, read_settings
from .options import LakeOptions
from .reader import BlockReader, copy_rows, files_with_keys
from .rows import iter_input, schema_from_b64, with_run_id, without, without_columns
from .tombstones import Tombstones
from .verified import mark_verified, verify_entries
from .writer import Writer


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _option(name: str) -> property:
    """A ``Lake`` attribute backed by its frozen ``LakeOptions`` (assigning replaces the options)."""

    def get(self: Lake) -> Any:
        return getattr(self.options, name)

    def set_(self: Lake, value: Any) -> None:
        self.options = replace(self.options, **{name: value})

    return property(get, set_, doc=f"``LakeOptions.{name}``")


class Lake:
    """Cold tier of the buffer: committed snapshots of hive-partitioned Parquet (see package doc).

    ``policy_bucket_size`` (``None``: the lake's stored value, else 1) is fixed per lake at the first
    commit and stored in ``_lakebuffer.json``; opening with a different explicit value raises
    ``LakeError``. ``filesystem`` replaces the fsspec filesystem built from ``url`` (e.g. a wrapped
    one). The other keyword arguments are ``LakeOptions`` (sizes, threads, read behaviour); each is
    also readable and assignable as an attribute of the lake.
    """

    row_group_bytes = _option("row_group_bytes")
    row_group_rows = _option("row_group_rows")
    target_file_bytes = _option("target_file_bytes")
    encode_threads = _option("encode_threads")
    upload_chunk_bytes = _option("upload_chunk_bytes")
    upload_part_bytes = _option("upload_part_bytes")
    upload_concurrency = _option("upload_concurrency")
    block_bytes = _option("block_bytes")
    read_concurrency = _option("read_concurrency")
    read_ahead_bytes = _option("read_ahead_bytes")
    ranged_reads = _option("ranged_reads")
    verify_reads = _option("verify_reads")

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
        target_file_bytes: int = 48 * MiB,
        encode_threads: int | None = None,
        upload_chunk_bytes: int = 8 * MiB,
        upload_part_bytes: int = 8 * MiB,
        upload_concurrency: int = 3,
        block_bytes: int = 8 * MiB,
        read_concurrency: int = 3,
        read_ahead_bytes: int = 128 * MiB,
        ranged_reads: bool = False,
        verify_reads: bool = True,
    ) -> None:
        self.read_only = read_only
        self.options = LakeOptions.build(
            row_group_bytes=row_group_bytes,
            row_group_rows=row_group_rows,
            target_file_bytes=target_file_bytes,
            encode_threads=encode_threads,
            upload_chunk_bytes=upload_chunk_bytes,
            upload_part_bytes=upload_part_bytes,
            upload_concurrency=upload_concurrency,
            block_bytes=block_bytes,
            read_concurrency=read_concurrency,
            read_ahead_bytes=read_ahead_bytes,
            ranged_reads=ranged_reads,
            verify_reads=verify_reads,
        )
        self.store = LakeFS(url, storage_options, filesystem)
        self.log = ManifestLog(self.store)
        self.tombstones = Tombstones(self.store)
        self.claims = WriterClaims(self.store)
        self._format = ds.ParquetFileFormat(default_fragment_scan_options=ds.ParquetFragmentScanOptions(pre_buffer=True))
        self.store.probe()
        stored = read_settings(self.store)
        default = int(PARTITIONING.get("policy_bucket_size", 1))
        self._settings_written = stored is not None
        if stored is not None:
            size = int(stored.get("policy_bucket_size", default))
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

    # ---- where the lake is --------------------------------------------------------------
    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        """The fsspec filesystem of the lake."""
        return self.store.fs

    @property
    def url(self) -> str:
        """The lake's URL (an absolute path for a local lake)."""
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

    def _check_writable(self) -> None:
        if self.read_only:
            raise ReadOnlyError(f"lake {self.url} is opened read-only")

    def _writer(self, run_id: str, snapshot_id: int, schema: pa.Schema, target: int, **kw: Any) -> Writer:
        return Writer(self.store, self.options, self.policy_bucket_size, run_id, snapshot_id, schema, target, **kw)

    # ---- manifests ----------------------------------------------------------------------
    def snapshots(self, run_id: str) -> list[int]:
        """Committed snapshot ids of a run (oldest first; ``gc`` removes expired ones)."""
        return self.log.snapshots(run_id)

    def manifest(self, run_id: str, snapshot_id: int) -> dict:
        """One committed manifest (immutable, cached)."""
        return self.log.get(run_id, snapshot_id)

    def latest_manifest(self, run_id: str) -> dict | None:
        """The newest committed manifest of ``run_id``, or None when the run has none."""
        return self.log.latest(run_id)

    def runs(self) -> list[str]:
        """Runs with at least one committed snapshot, sorted."""
        return sorted(self.log.listing())

    # ---- read side ----------------------------------------------------------------------
    def files(self, run_id: str | None = None, *, snapshot_id: int | None = None) -> list[str]:
        """URLs (local: absolute paths) of the committed live data files, all runs if ``run_id`` is None."""
        return [self.store.url_of(f["path"]) for m in self.log.select(run_id, snapshot_id).values() for f in m["files"]]

    def deleted_keys(self, run_id: str | None = None, *, snapshot_id: int | None = None) -> pa.Array:
        """The tombstoned keys (string array, unique) of one run or of all runs."""
        return unique_keys([self.tombstones.of(m) for m in self.log.select(run_id, snapshot_id).values()])

    def schema(self, run_id: str | None = None) -> pa.Schema:
        """Row schema of the lake (unified over runs), with the ``run_id`` and ``policy_bucket`` columns."""
        return self._dataset_schema(self.log.select(run_id))

    def _dataset_schema(self, manifests: dict[str, dict], schema: pa.Schema | None = None) -> pa.Schema:
        if schema is None:
            schemas = [schema_from_b64(m["schema"]) for m in manifests.values() if m.get("schema")]
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

    def _fragment(self, run_id: str, entry: dict, filesystem: pafs.FileSystem) -> ds.Fragment:
        expr = (ds.field("run_id") == run_id) & (ds.field("policy_bucket") == int(entry["policy_bucket"]))
        if entry.get("min_policy_version") is not None:
            expr = expr & (ds.field("policy_version") >= int(entry["min_policy_version"]))
            expr = expr & (ds.field("policy_version") <= int(entry["max_policy_version"]))
        return self._format.make_fragment(
            self.store.abs(entry["path"]), filesystem=filesystem, partition_expression=expr, file_size=int(entry["bytes"])
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
        """A pyarrow dataset over the committed files (pinned to the manifests read now), hive partition
        columns ``run_id`` (string) and ``policy_bucket`` (int64), tombstoned keys filtered out.

        Each fragment carries ``run_id``, ``policy_bucket`` and the file's ``policy_version`` range as
        its partition expression, so filters on any of them skip other files without opening them.
        Unless ``verify=False`` (default: ``verify_reads``), each file not yet checked by this process
        is checked against the manifest's checksums first (``lake/verified.py``).
        """
        manifests = self.log.select(run_id, snapshot_id)
        full = self._dataset_schema(manifests, schema)
        verify = self.options.verify_reads if verify is None else verify
        fs = self.store.pafs
        if verify:
            verify_entries(self.store, [f for m in manifests.values() for f in m["files"]])
        frags = [self._fragment(r, f, fs) for r, m in manifests.items() for f in m["files"]]
        dset = ds.FileSystemDataset(frags, full, self._format, fs)
        if apply_deletes:
            expr = None
            for r, m in manifests.items():
                keys = self.tombstones.of(m)
                if len(keys) == 0:
                    continue
                hide = pc.is_in(ds.field("key"), value_set=keys)
                if len(manifests) > 1:
                    hide = (ds.field("run_id") == r) & hide
                expr = ~hide if expr is None else expr & ~hide
            if expr is not None:
                dset = dset.filter(expr)
        return dset

    def register(self, con: Any, view: str = "cold", run_id: str | None = None) -> None:
        """Create or replace the DuckDB view ``view`` over the committed files minus tombstones.

        No DuckDB extension is needed: the view reads a pyarrow dataset registered on ``con``
        (S3 through s3fs). The view is pinned to the snapshots committed now; call again to refresh.
        """
        dset = self.dataset(run_id)
        source = f"__lakebuffer_{view}_dataset"
        con.register(source, dset)
        con.execute(render_sql("lake_view", view=_ident(view), source=_ident(source)))

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
        """Restore path: every live row of ``run_id`` as of its latest committed snapshot (or
        ``snapshot_id``), minus tombstones, streamed one row group at a time, with the ``run_id``
        column (``policy_bucket`` on request). Files are fetched by ``read_concurrency`` threads, up to
        ``read_ahead_bytes`` ahead of decoding (so decoding one file overlaps fetching the next) and
        checked against the manifest's checksums (``CorruptionError`` naming the file) unless
        ``verify=False``."""
        check_run_id(run_id)
        m = self.log.get(run_id, snapshot_id) if snapshot_id is not None else self.log.latest(run_id)
        if m is None:
            return
        verify = self.options.verify_reads if verify is None else verify
        keys = self.tombstones.of(m)
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
        need_key = len(keys) > 0 and "key" not in physical
        read_cols = physical + (["key"] if need_key else [])
        entries = sorted(m["files"], key=lambda f: (int(f.get("snapshot_id", 0)), f["path"]))
        for entry, pf, i in BlockReader(self.store, self.options, entries, verify).row_groups():
            avail = set(pf.schema_arrow.names)
            t = pf.read_row_group(i, columns=[c for c in read_cols if c in avail], use_threads=False)
            if len(keys):
                t = t.filter(pc.invert(pc.is_in(t.column("key"), value_set=keys)))
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
        """Check size and sha256 of every live data and delete file of the latest snapshots;
        ``CorruptionError`` naming every bad or missing file, else a summary."""
        return maintenance.verify(self, run_id)

    def stats(self, run_id: str | None = None) -> dict:
        """Sizes from the latest manifests (no data read). ``rows`` are the live rows: file rows minus
        tombstoned keys (a key is tombstoned once, and only if a file holds it); ``file_rows`` both."""
        ms = self.log.select(run_id)
        files = [f for m in ms.values() for f in m["files"]]
        file_rows = sum(int(f["rows"]) for f in files)
        deleted = sum(int(d["rows"]) for m in ms.values() for d in m.get("delete_files", []))
        return {
            "runs": len(ms),
            "files": len(files),
            "rows": file_rows - deleted,
            "file_rows": file_rows,
            "deleted_keys": deleted,
            "bytes": sum(int(f["bytes"]) for f in files),
            "delete_files": sum(len(m.get("delete_files", [])) for m in ms.values()),
            "last_snapshot_id": {r: m["snapshot_id"] for r, m in ms.items()},
        }

    # ---- write side ---------------------------------------------------------------------
    def _ensure_settings(self) -> None:
        if not self._settings_written:
            ensure_settings(self.store, self.policy_bucket_size)
            self._settings_written = True

    def commit_snapshot(
        self,
        run_id: str,
        batches: Iterable[pa.Table | pa.RecordBatch],
        deleted_keys: Sequence[str] | pa.Array = (),
        *,
        meta: dict | None = None,
        force: bool = False,
    ) -> dict | None:
        """Append ``batches`` (streamed, never concatenated) and tombstone ``deleted_keys`` (hidden from
        all earlier files of the run) as one atomic snapshot; return its manifest, or None for an empty
        snapshot (no rows, no deletes) unless ``force``. Rows must belong to ``run_id`` (their
        ``run_id`` column, if any, is checked and dropped: the path carries it). Any storage error
        raises LakeError and leaves the committed state as it was."""
        self._check_writable()
        check_run_id(run_id)
        parent = self.log.latest(run_id)
        self._ensure_settings()
        sid = (parent["snapshot_id"] if parent else 0) + 1
        dkeys = key_array(deleted_keys)
        tomb = self.tombstones.of(parent)
        watch = unique_keys([tomb, dkeys])
        hits: list[pa.Array] = []
        writer: Writer | None = None
        rewriter: Writer | None = None
        delete_entry: dict | None = None
        row_schema: pa.Schema | None = None
        file_schema: pa.Schema | None = None
        user_error: BaseException | None = None
        committing = False
        it = iter_input(batches)
        try:
            while True:
                try:
                    batch = next(it)
                except StopIteration:
                    break
                except BaseException as e:
                    user_error = e
                    raise
                if batch.num_rows == 0:
                    continue
                if "run_id" in batch.schema.names:
                    col = batch.column("run_id")
                    if not pa.types.is_string(col.type):
                        col = col.cast(pa.string())
                    if col.null_count or pc.any(pc.not_equal(col, pa.scalar(run_id))).as_py():
                        raise SchemaError(f"batch holds rows of another run than {run_id!r}")
                if row_schema is None:
                    row_schema = with_run_id(without(batch.schema, ["policy_bucket"]))
                    file_schema = without(batch.schema, ["run_id", "policy_bucket"])
                    if "policy_version" not in file_schema.names:
                        raise SchemaError("batches need a 'policy_version' column (the lake partitions by it)")
                    if parent and parent.get("schema"):
                        try:
                            pa.unify_schemas([schema_from_b64(parent["schema"]), row_schema])
                        except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
                            raise SchemaError(f"snapshot schema does not fit run {run_id!r}: {e}") from e
                    writer = self._writer(run_id, sid, file_schema, self.options.target_file_bytes)
                batch = without_columns(batch, ("run_id", "policy_bucket"))
                if not batch.schema.equals(file_schema, check_metadata=False):
                    if set(batch.schema.names) != set(file_schema.names):
                        raise SchemaError(
                            f"batches of one snapshot must have the same columns: {batch.schema.names} vs {file_schema.names}"
                        )
                    try:
                        batch = cast_to(batch, file_schema)
                    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
                        raise SchemaError(f"batch does not fit the snapshot schema: {e}") from e
                if len(watch) and "key" in file_schema.names:
                    k = batch.column("key")
                    hit = k.filter(pc.is_in(k, value_set=watch))
                    if len(hit):
                        hits.append(hit)
                writer.add(batch)
            entries = writer.finish() if writer is not None else []
            nrows = sum(int(e["rows"]) for e in entries)
            if nrows == 0 and len(dkeys) == 0 and not force:
                return None
            resurrected = unique_keys(hits)
            remove_files: set[str] = set()
            remove_deletes: set[str] = set()
            rewritten: list[dict] = []
            if len(resurrected):
                # keys deleted earlier (or in this very snapshot) come back with this snapshot: drop
                # their old rows physically and take them out of the tombstone set
                hidden = watch
                wide = row_schema
                if parent and parent.get("schema"):
                    wide = pa.unify_schemas([schema_from_b64(parent["schema"]), row_schema])
                rewriter = self._writer(run_id, sid, without(wide, ["run_id", "policy_bucket"]), self.options.target_file_bytes, tag="r", max_lanes=1)
                affected = files_with_keys(self.store, parent, resurrected)
                remove_files.update(f["path"] for f in affected)
                copy_rows(self.store, self.options, affected, rewriter, hidden, rewriter.schema)
                rewritten = rewriter.finish()
                remaining = pc.filter(watch, pc.invert(pc.is_in(watch, value_set=resurrected)))
                remove_deletes = {d["path"] for d in (parent or {}).get("delete_files", [])}
                if len(remaining):
                    delete_entry = self.tombstones.write(run_id, sid, remaining)
            elif len(dkeys):
                delete_entry = self.tombstones.write(run_id, sid, dkeys)
            schema_for_manifest = row_schema or (schema_from_b64(parent["schema"]) if parent and parent.get("schema") else with_run_id(ROLLOUT_SCHEMA))
            committing = True  # from here on a failure may leave a manifest that landed: keep the files
            manifest = self.log.commit(
                run_id,
                parent,
                policy_bucket_size=self.policy_bucket_size,
                operation="append",
                add_files=entries + rewritten,
                remove_files=remove_files,
                add_deletes=[delete_entry] if delete_entry else [],
                remove_deletes=remove_deletes,
                schema=schema_for_manifest,
                meta=meta,
                extra={"added_rows": nrows, "deleted_keys_added": len(dkeys), "resurrected_keys": len(resurrected)},
            )
            mark_verified(self.store, entries + rewritten)  # checksummed from the bytes written
            return manifest
        except BaseException as e:
            if not committing:  # nothing references these files: try to remove them (gc gets the rest)
                for w in (writer, rewriter):
                    if w is not None:
                        w.abort()
                if delete_entry is not None:
                    self.store.remove_quietly([delete_entry["path"]])
            if e is user_error or isinstance(e, (LakeBufferError, KeyboardInterrupt)):
                raise
            raise LakeError(
                f"snapshot of run {run_id!r} to lake {self.url} failed, nothing was committed: {type(e).__name__}: {e}"
            ) from e

    # ---- compaction & gc ----------------------------------------------------------------
    def compact(
        self,
        run_id: str | None = None,
        target_file_bytes: int = 256 * 2**20,
        progress: Callable[[int, int], None] | None = None,
        *,
        small_file_fraction: float = 0.75,
    ) -> dict:
        """Per partition, rewrite files smaller than ``small_file_fraction * target_file_bytes`` (when
        there are two or more) and every file holding tombstoned rows into files of about
        ``target_file_bytes``, then commit a manifest listing the new files instead of the replaced
        ones and without the applied delete files. Nothing is deleted: readers pinned to the older
        manifest keep reading it; ``gc`` removes replaced files after its grace period.
        ``progress(bytes_done, bytes_total)`` is called as input bytes are rewritten."""
        self._check_writable()
        return maintenance.compact(self, run_id, target_file_bytes, progress, small_file_fraction)

    def gc(self, older_than_s: float = 3600) -> int:
        """Remove files no live snapshot needs: data and delete files referenced neither by the latest
        manifest of their run nor by a manifest superseded less than ``older_than_s`` ago (readers may
        still be pinned to it), and older than ``older_than_s`` themselves (so uploads in progress are
        safe); also the expired manifests and, on S3, multipart uploads a crashed writer left behind.
        Returns the number of objects removed (and uploads aborted)."""
        self._check_writable()
        return maintenance.gc(self, older_than_s)

    def __repr__(self) -> str:
        return f"Lake({self.url!r}{', read_only=True' if self.read_only else ''})"
