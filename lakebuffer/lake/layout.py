"""Where things live in a lake: the Delta table's partition columns, data-file names, run-id encoding.

One module so that the writer, the reader, verification and gc agree on every name (see the layout in
``lakebuffer.lake``'s docstring). A data file's name carries the sha256 of its bytes: Delta records size,
row count and min/max per file but no checksum, and a name survives checkpoints, log compaction and every
engine (they all ignore it), so the checksum cannot be lost or drift from the file it describes.
"""

from __future__ import annotations

import re
import time
import uuid
from datetime import datetime, timezone
from urllib.parse import quote

import pyarrow as pa

LAKE_FORMAT = "lakebuffer.delta/1"
DELTA_LOG = "_delta_log"
OLD_FORMAT_MARKERS = ("_lakebuffer.json", "_manifests")  # lakebuffer's format before Delta Lake
PARTITION_FIELDS = [pa.field("run_id", pa.string(), nullable=False), pa.field("policy_bucket", pa.int64(), nullable=False)]
PARTITION_COLUMNS = [f.name for f in PARTITION_FIELDS]
MiB = 2**20

# part-<sid 8>-<n 4>-<unix seconds>-<random 8><tag>-<sha256 64>.parquet
DATA_NAME = re.compile(r"part-(\d{8})-\d{4,}-(\d{9,11})-[0-9a-f]{8}[a-z]*-([0-9a-f]{64})\.parquet$")
TOKEN_TIME = re.compile(r"-(\d{9,11})-[0-9a-f]{8}[a-z]*(?:-[0-9a-f]{64})?\.parquet(?:\.tmp-[0-9a-f]+)?$")


def now() -> tuple[str, float]:
    """(ISO-8601 UTC text, unix seconds) of the same instant."""
    t = time.time()
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z"), t


def enc(run_id: str) -> str:
    """The run id as a path segment (percent-encoded, no ``/`` left). Delta keeps the exact value in
    each file's ``partitionValues``; the directory name is for humans and hive-style tools."""
    return quote(run_id, safe="")


def file_token(tag: str = "") -> str:
    """``<unix seconds>-<random>``: unique per writer, and it dates the file for the stale-upload sweep
    where the store's own timestamps are not trustworthy (moto dates every multipart upload 2010)."""
    return f"{int(time.time())}-{uuid.uuid4().hex[:8]}{tag}"


def check_run_id(run_id: str) -> str:
    if not isinstance(run_id, str) or not run_id or run_id in (".", ".."):
        raise ValueError(f"run_id must be a non-empty string, not {run_id!r}")
    return run_id


def run_dir(run_id: str) -> str:
    return f"run_id={enc(run_id)}"


def data_name(snapshot_id: int, n: int, token: str, sha256: str) -> str:
    return f"part-{snapshot_id:08d}-{n:04d}-{token}-{sha256}.parquet"


def sha256_of(path: str) -> str | None:
    """The sha256 a data file's name promises, or None for a file lakebuffer did not write."""
    m = DATA_NAME.search(path)
    return m.group(3) if m else None


def snapshot_of(path: str) -> int:
    m = DATA_NAME.search(path)
    return int(m.group(1)) if m else 0
