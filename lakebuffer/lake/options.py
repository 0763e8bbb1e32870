"""Tuning of one open lake (sizes, threads, read behaviour), as a frozen dataclass.

Frozen so that a writer or reader started with one set of options keeps it for its whole life; a
change (``Lake.ranged_reads = True``) builds a new ``LakeOptions`` and applies to the next operation.
The partitioning (``policy_bucket_size``) is not here: it is a property of the stored lake, kept in
the Delta table's description.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .layout import MiB


def default_encode_threads() -> int:
    """Half the CPUs, at most 4: the other half is left to the upload."""
    return max(1, min(4, (os.cpu_count() or 2) // 2))


@dataclass(frozen=True)
class LakeOptions:
    """``row_group_bytes`` (uncompressed Arrow bytes) / ``row_group_rows`` bound Parquet row groups
    (whichever comes first); ``target_file_bytes`` rotates snapshot files (on an object store a file is
    held in memory until it is named by its sha256 and uploaded, so this also bounds that memory);
    ``encode_threads`` encode row groups of one partition into that many files in parallel. Reads:
    ``read_concurrency`` fetch threads, ``read_ahead_bytes`` ahead, ``ranged_reads`` (see
    ``reader.FileReader``), ``verify_reads``."""

    row_group_bytes: int = 32 * MiB
    row_group_rows: int = 64 * 1024
    target_file_bytes: int = 32 * MiB
    encode_threads: int = 1
    read_concurrency: int = 3
    read_ahead_bytes: int = 128 * MiB
    ranged_reads: bool = False
    verify_reads: bool = True
    memory_bytes: int = 128 * MiB
    spill_dir: str | None = None

    @property
    def group_bytes(self) -> int:
        """Row group size in Arrow bytes: ``row_group_bytes``, at most a quarter of ``memory_bytes``."""
        return max(1 * MiB, min(self.row_group_bytes, self.memory_bytes // 4))

    @property
    def ahead_bytes(self) -> int:
        """File bytes a reader fetches ahead: ``read_ahead_bytes``, at most half of ``memory_bytes``."""
        return min(self.read_ahead_bytes, self.memory_bytes // 2)

    @property
    def whole_file_bytes(self) -> int:
        """Files up to this size are fetched whole and hashed in memory; larger ones are streamed."""
        return max(self.target_file_bytes, self.memory_bytes // 2)

    def spill_path(self) -> str:
        """The folder (created) where files for an object store are encoded before upload."""
        import tempfile

        d = self.spill_dir or os.path.join(tempfile.gettempdir(), "lakebuffer-spill")
        os.makedirs(d, exist_ok=True)
        return d

    @classmethod
    def build(
        cls, *, encode_threads: int | None = None, ranged_reads: bool = False, verify_reads: bool = True,
        spill_dir: str | os.PathLike | None = None, **sizes: int
    ) -> LakeOptions:
        """Options from ``Lake``'s keyword arguments: sizes as int, ``encode_threads`` defaulted."""
        threads = int(encode_threads) if encode_threads else default_encode_threads()
        ints = {k: int(v) for k, v in sizes.items()}
        return cls(encode_threads=threads, ranged_reads=bool(ranged_reads), verify_reads=verify_reads,
                   spill_dir=os.fspath(spill_dir) if spill_dir is not None else None, **ints)
