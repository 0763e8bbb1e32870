"""Check every file of a lake (or of one run) and report, never raise and never delete: what
``lakebuffer fsck LAKE_URL`` and ``fsck DIR --lake L`` print.

lakebuffer's files are checked against the sha256 in their names (``reader.stream_problem``, in
chunks: memory does not grow with the file); a file another Delta writer added (no sha256 in its
name) is decoded whole, row group by row group, with Parquet page checksums verified where it has
them, so a damaged footer or page is still found. A file the Delta log lists that is missing is
damaged too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import LakeBufferError
from .checksums import stream_problem
from .entries import entries_of
from .layout import sha256_of
from .reader import STREAM_BLOCK_BYTES

if TYPE_CHECKING:
    from .parts import LakeParts


def _parquet_problem(lake: LakeParts, entry: dict) -> str | None:
    """Decode a file lakebuffer did not write (no sha256 to check it by); what fails, or None."""
    try:
        with lake.store.fs.open(lake.store.abs(entry["path"]), "rb", block_size=STREAM_BLOCK_BYTES, cache_type="none") as f:
            pf = pq.ParquetFile(f, page_checksum_verification=True)
            for i in range(pf.metadata.num_row_groups):
                pf.read_row_group(i, use_threads=False)
    except (pa.ArrowException, OSError, ValueError) as e:
        return f"not readable Parquet: {type(e).__name__}: {e}"
    return None


def check_files(lake: LakeParts, run_id: str | None = None, strict: bool = False) -> dict[str, Any]:
    """``{"files", "bytes" (as the log lists them), "version", "damaged": [{"path", "run_id", "problem"}],
    "unverifiable"}`` over
    the live files of the table (or of ``run_id``); ``unverifiable`` counts files without a sha256 in
    their names (decoded instead). ``strict``: a file the store does not serve (``LakeBufferError``,
    e.g. the store is down) raises instead of being reported damaged (``Lake.verify``)."""
    dt = lake.delta.table()
    out: dict[str, Any] = {"files": 0, "bytes": 0, "version": dt.version() if dt is not None else None,
                           "damaged": [], "unverifiable": 0}
    for entry in entries_of(dt, run_id):
        out["files"] += 1
        url = lake.store.url_of(entry["path"])
        try:
            problem = stream_problem(lake.store, entry)
        except FileNotFoundError:
            problem = f"missing (listed by version {out['version']} of the Delta log)"
        except LakeBufferError as e:
            if strict:
                raise
            problem = f"unreadable: {e}"
        if problem is None and not sha256_of(entry["path"]):
            out["unverifiable"] += 1
            problem = _parquet_problem(lake, entry)
        out["bytes"] += int(entry["bytes"])
        if problem is not None:
            out["damaged"].append({"path": url, "run_id": entry["run_id"], "problem": problem})
    return out
