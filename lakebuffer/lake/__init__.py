"""The cold tier: hive-partitioned Parquet on any fsspec URL, committed snapshot by snapshot.

Layout under the lake URL (``s3://bucket/prefix``, ``file:///abs/path`` or a plain path)::

    _lakebuffer.json                                   lake settings (policy_bucket_size), written once
    run_id=<r>/policy_bucket=<b>/part-<sid>-<n>-<tok>.parquet    data files (zstd; no run_id column)
    _deletes/run_id=<r>/del-<sid>-<tok>.arrow           tombstones: one ``key`` column (Arrow IPC)
    _manifests/run_id=<r>/<sid, 20 digits>.json         one manifest per committed snapshot

``<r>`` is the run id percent-encoded (``urllib.parse.quote(run_id, safe="")``), ``<b>`` is
``policy_version // policy_bucket_size`` (floor division), ``<sid>`` the snapshot id the file was
written for (8 digits), ``<n>`` its number in that write and ``<tok>`` ``<unix seconds>-<random>``
of the writer, so two writers never overwrite each other's files and ``gc`` can date them. Data
files only hold rows; *which* files are live is decided by the manifests alone. A manifest holds
``snapshot_id``, ``parent_id``, ``created_at``, ``operation`` (append / compact), the run's Arrow
schema, every live data file (path, policy_bucket, rows, bytes, sha256 of the whole file, crc32 per
8 MiB block for verified ranged reads, policy_version range), the live delete files, what this commit
added and removed, a summary and the caller's ``meta``.

* **Commit protocol.** ``commit_snapshot`` streams data files, then a delete file, then writes the
  manifest ``<sid>.json`` with an exclusive create (S3 ``If-None-Match: *``; ``os.link`` of a fsynced
  temporary file locally). The manifest lists every live file of the run, so a snapshot is visible
  completely or not at all: files of a failed or crashed upload are in no
  manifest, readers never see them, and ``gc`` removes them later. Two writers racing for the same
  ``sid`` cannot both win; the loser rebases on the new latest manifest and retries.
* **Tombstones.** The live rows of a run are the rows of its live files whose ``key`` is not in the
  run's tombstone set (the union of its live delete files). ``commit_snapshot(deleted_keys=...)`` hides
  keys from all *earlier* files: when a snapshot brings rows whose key is tombstoned (a key deleted and
  pushed again), the older files holding that key are rewritten without it in the same commit and the
  key leaves the tombstone set, so the one simple rule above stays exact.
* **Compaction** writes new files, commits a manifest that lists them instead of the replaced files and
  delete files, and never deletes anything itself: the replaced files stay readable by readers pinned to
  the older manifest until ``gc(older_than_s)`` removes files that no manifest younger than the grace
  period references.
* **External readers** (pyarrow.dataset, polars.scan_parquet, DuckDB read_parquet with hive
  partitioning) can open the lake directory without lakebuffer. A directory scan sees every Parquet
  file, including files of failed uploads and files replaced by compaction that ``gc`` has not removed
  yet, and it does not apply tombstones; pass ``Lake.files()`` (the committed file list) for an exact
  snapshot, and read after ``compact()`` + ``gc()`` for a lake without tombstones.

Empty snapshots (no rows and no deleted keys) are skipped: ``commit_snapshot`` returns ``None`` unless
``force=True``. A missing S3 bucket is reported when the lake is opened (``LakeError``); a missing local
directory is created at the first write.

Package layout (one job per module; ``ColdStore`` below is the interface the rest of lakebuffer uses):

* ``table``       ``Lake``: composes the parts below and implements ``ColdStore``.
* ``fs``          fsspec plumbing: URL -> filesystem, root-relative paths, error mapping, exclusive put.
* ``s3``          the only adapter around s3fs internals (multipart writer, raw S3 calls).
* ``options``     ``LakeOptions``: frozen tuning (sizes, threads, read behaviour).
* ``layout``      path names, file-name patterns, run-id encoding.
* ``rows``        Arrow helpers (schema b64, column juggling, input batches; ``lakebuffer.schema`` owns
                  conforming and key arrays).
* ``manifest``    settings file and the manifest log (list, cache, commit with rebase).
* ``tombstones``  delete files: write, read and cache their keys.
* ``writer``      streaming Parquet writer of a snapshot (lanes, checksums, background upload).
* ``reader``      verified read-ahead reader (``BlockReader``) and row copies.
* ``maintenance`` verify, compact, gc, aborting stale multipart uploads.

Prune hints (``Lake.prune_hint``) come from ``lakebuffer.predicate.partition_hint``, the one predicate model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa
import pyarrow.dataset as ds

from .layout import LAKE_FORMAT, MANIFEST_FORMAT
from .options import LakeOptions
from .table import Lake

__all__ = ["ColdStore", "Lake", "LakeOptions", "MANIFEST_FORMAT", "LAKE_FORMAT"]


@runtime_checkable
class ColdStore(Protocol):
    """The cold tier as the buffer, lake views, fsck and the CLI use it: snapshots are committed
    atomically per run, read back as a stream or a dataset, and maintained (compact, gc, verify).

    A manifest is the committed state of one run (a dict with at least ``snapshot_id`` and ``files``).
    Implementations: ``Lake`` (Parquet + JSON manifests today; Delta Lake next).
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
        """Append rows and tombstone keys as one atomic snapshot of ``run_id``; None when empty."""
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
        """Tombstoned keys."""
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
        """Rewrite small files and files with tombstoned rows; content unchanged."""
        ...

    def gc(self, older_than_s: float = 3600) -> int:
        """Remove files no live snapshot needs (never a live file); return how many."""
        ...
