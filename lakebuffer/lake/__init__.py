"""The cold tier: one Delta Lake table at the lake URL, hive-partitioned by ``run_id`` and policy bucket.

``deltalake.DeltaTable(lake_url)`` opens it; so do ``polars.scan_delta``, DuckDB's ``delta_scan``,
Spark, Trino and every other Delta reader, and all of them see exactly the committed, undeleted rows.
Layout under the lake URL (``s3://bucket/prefix``, ``file:///abs/path`` or a plain path)::

    _delta_log/<version, 20 digits>.json               Delta commits (+ checkpoints), one per snapshot
    run_id=<r>/policy_bucket=<b>/part-<sid>-<n>-<tok>-<sha256>.parquet   data files (no run_id column)
    _writers/run_id=<r>.json                            the run's one writer (``claims``)

Table columns are the rows' columns plus the partition columns ``run_id`` (string) and
``policy_bucket`` (``policy_version // policy_bucket_size``, long). ``<r>`` is the run id
percent-encoded for the directory (Delta keeps the exact value in each file's ``partitionValues``),
``<sid>`` the run's snapshot id the file was written for, ``<tok>`` ``<unix seconds>-<random>`` and
``<sha256>`` the checksum of the file's bytes. ``policy_bucket_size`` is stored in the table's
description (JSON), fixed at the first commit.

* **Commit protocol.** ``commit_snapshot`` streams Parquet files with pyarrow (zstd, page checksums,
  bounded row groups; ``writer``), then commits their ``add`` actions (with Delta stats from the
  footers) and the ``remove``/``add`` actions of its deletes as ONE Delta version through deltalake's
  transaction API (``delta``), carrying the run's app transaction ``lakebuffer:<run>`` = the snapshot id
  and a ``lakebuffer`` document in ``commitInfo`` (snapshot id, schema, the buffer's meta). A snapshot
  is visible completely or not at all; files of a failed or crashed upload are in no commit, no Delta
  reader sees them, and ``gc`` (vacuum ``full=True``) removes them. Two writers of one run cannot both
  take a snapshot id: their commits carry the same app id and delta-rs rejects the second.
* **Deletes** are Delta copy-on-write deletes inside the snapshot's commit: files of the run that hold a
  deleted key (key min/max stats, then the key column) are replaced by a copy without those rows.
  Rows appended by the same snapshot are never deleted by it (a key deleted and pushed again keeps
  its new row).
* **Integrity.** Delta has no per-file checksum, so the sha256 is in the file name; every lakebuffer
  read path checks it before decoding (restore and rewrites per read, datasets once per process and
  file: ``verified``), ``CorruptionError`` naming the file otherwise.
* **Compaction** rewrites small files and commits them with ``dataChange=false``; ``gc`` is Delta vacuum
  (+ aborting stale S3 multipart uploads). Readers pinned to an older version keep it until vacuum.
* **Time travel.** Each snapshot is a Delta version (``manifest(run, sid)["version"]``):
  ``DeltaTable(url, version=v)``. The table is created with ``delta.enableExpiredLogCleanup=false`` so
  the log (the record of snapshots and their meta) is never cleaned up.

Lakes of lakebuffer's earlier format (``_lakebuffer.json`` / ``_manifests/`` without ``_delta_log/``) are
refused with ``OldLakeFormatError``. Empty snapshots (no rows and no deleted keys) are skipped unless
``force=True``. A missing S3 bucket is reported when the lake is opened (``LakeError``); a missing local
directory is created at the first write.

Package layout (one job per module; ``ColdStore`` below is the interface the rest of lakebuffer uses):

* ``table``       ``Lake``: composes the parts below and implements ``ColdStore``.
* ``commit``      the snapshot commit (write, copy-on-write delete, one Delta version, a lost reply).
* ``entries``     live files of the Delta log as entries; the add/remove actions (below table, commit, maintenance).
* ``parts``       ``LakeParts``: the lake's parts the functions of ``commit`` and ``maintenance`` use.
* ``delta``       the Delta log: open, commit (app transactions, commit documents), storage options.
* ``fs``          fsspec plumbing: URL -> filesystem, root-relative paths, error mapping, exclusive put.
* ``s3``          raw S3 calls (bucket probe, stale multipart uploads).
* ``options``     ``LakeOptions``: frozen tuning (sizes, threads, read behaviour).
* ``layout``      partition columns, file-name patterns (sha256 in the name), run-id encoding.
* ``rows``        Arrow helpers (schema b64, column juggling, input batches).
* ``claims``      the one writer of a run.
* ``writer``      streaming Parquet writer of a snapshot (lanes, sha256 names, Delta stats, upload).
* ``reader``      verified read-ahead reader (``FileReader``) and key lookups of deletes.
* ``verified``    verify-once cache of the dataset paths.
* ``maintenance`` verify, compact, gc (vacuum), aborting stale multipart uploads.

Prune hints (``Lake.prune_hint``) come from ``lakebuffer.predicate.partition_hint``, the one predicate model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa
import pyarrow.dataset as ds

from .layout import LAKE_FORMAT
from .options import LakeOptions
from .table import Lake

__all__ = ["ColdStore", "Lake", "LakeOptions", "LAKE_FORMAT"]


@runtime_checkable
class ColdStore(Protocol):
    """The cold tier as the buffer, lake views, fsck and the CLI use it: snapshots are committed
    atomically per run, read back as a stream or a dataset, and maintained (compact, gc, verify).

    A manifest is one committed snapshot of a run (a dict with at least ``snapshot_id``, ``version`` (the
    Delta version), ``meta`` and ``files``: the run's live files at that version). Implementation: ``Lake``
    (a Delta Lake table).
    """

    @property
    def url(self) -> str: ...

    @property
    def read_only(self) -> bool: ...

    def commit_snapshot(
        self,
        run_id: str,
        batches: Iterable[pa.Table | pa.RecordBatch],
        deleted_keys: Sequence[str] | pa.Array = (),
        *,
        meta: dict | None = None,
        force: bool = False,
    ) -> dict | None:
        """Append rows and delete keys as one atomic snapshot (one Delta version) of ``run_id``; None when empty."""
        ...

    def snapshots(self, run_id: str) -> list[int]:
        """Committed snapshot ids of a run, oldest first."""
        ...

    def manifest(self, run_id: str, snapshot_id: int) -> dict:
        """One committed snapshot of a run."""
        ...

    def latest_manifest(self, run_id: str) -> dict | None:
        """The newest committed snapshot of a run, or None."""
        ...

    def runs(self) -> list[str]:
        """Runs with at least one committed snapshot."""
        ...

    def schema(self, run_id: str | None = None) -> pa.Schema:
        """Row schema (unified over runs) with the partition columns."""
        ...

    def files(self, run_id: str | None = None, *, snapshot_id: int | None = None) -> list[str]:
        """URLs of the committed live data files (for external readers)."""
        ...

    def deleted_keys(self, run_id: str | None = None, *, snapshot_id: int | None = None) -> pa.Array:
        """Keys deleted but still in files (always empty for Delta: deletes rewrite files)."""
        ...

    def scan_batches(
        self, run_id: str, columns: list[str] | None = None, *, snapshot_id: int | None = None, verify: bool | None = None
    ) -> Iterator[pa.RecordBatch]:
        """Every live row of a run, streamed and verified (the restore path)."""
        ...

    def dataset(
        self, run_id: str | None = None, schema: pa.Schema | None = None, *, snapshot_id: int | None = None, apply_deletes: bool = True
    ) -> ds.Dataset:
        """A pyarrow dataset over the committed rows, pinned to the snapshots read now."""
        ...

    def register(self, con: Any, view: str = "cold", run_id: str | None = None) -> None:
        """Create or replace a DuckDB view over the committed rows."""
        ...

    def view_of(self, view: str = "cold", run_id: str | None = None) -> Any:
        """``register``'s view, read from the log now and put on a connection later (``.apply(con)``):
        a catalog reads it before it takes its connection's lock."""
        ...

    def prune_hint(self, where: str) -> str:
        """``where`` with redundant partition predicates for engines that prune on hive columns only."""
        ...

    def stats(self, run_id: str | None = None) -> dict:
        """Sizes from the latest snapshots, no data read."""
        ...

    def verify(self, run_id: str | None = None) -> dict:
        """Check every live file against its checksum; ``CorruptionError`` naming the bad ones."""
        ...

    def compact(
        self,
        run_id: str | None = None,
        target_file_bytes: int = 256 * 2**20,
        progress: Callable[[int, int], None] | None = None,
        *,
        small_file_fraction: float = 0.75,
    ) -> dict:
        """Rewrite small files (``dataChange=false``); content unchanged."""
        ...

    def gc(self, older_than_s: float = 3600) -> int:
        """Vacuum files no version younger than ``older_than_s`` needs (never a live file); return how many."""
        ...
