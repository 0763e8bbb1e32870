"""Where things live in a lake: directory names, file-name patterns and the run-id encoding.

One module so that the writer, the manifest log, the tombstones and gc agree on every path (see the
layout in ``lakebuffer.lake``'s docstring). The Delta Lake issue replaces this naming wholesale.
"""

from __future__ import annotations

import re
import time
import uuid
from datetime import datetime, timezone
from urllib.parse import quote

import pyarrow as pa

MANIFEST_FORMAT = "lakebuffer.manifest/1"
LAKE_FORMAT = "lakebuffer.lake/1"
MANIFEST_DIR = "_manifests"
DELETE_DIR = "_deletes"
LAKE_META = "_lakebuffer.json"
PARTITION_FIELDS = [pa.field("run_id", pa.string(), nullable=False), pa.field("policy_bucket", pa.int64(), nullable=False)]
MiB = 2**20

MANIFEST_NAME = re.compile(r"^(\d{20})\.json$")
DATA_FILE = re.compile(r"^run_id=[^/]+/policy_bucket=-?\d+/part-[^/]+\.parquet$")
DELETE_FILE = re.compile(r"^" + DELETE_DIR + r"/run_id=[^/]+/del-[^/]+\.arrow$")
TOKEN_TIME = re.compile(r"-(\d{9,11})-[0-9a-f]{8}[a-z]*\.(?:parquet|arrow)$")


def now() -> tuple[str, float]:
    """(ISO-8601 UTC text, unix seconds) of the same instant."""
    t = time.time()
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z"), t


def enc(run_id: str) -> str:
    """The run id as a path segment (percent-encoded, no ``/`` left)."""
    return quote(run_id, safe="")


def file_token(tag: str = "") -> str:
    """``<unix seconds>-<random>``: unique per writer, and it dates the file for ``gc`` even where the
    store's own timestamps are not trustworthy (moto reports every multipart upload as from 2010)."""
    return f"{int(time.time())}-{uuid.uuid4().hex[:8]}{tag}"


def check_run_id(run_id: str) -> str:
    if not isinstance(run_id, str) or not run_id or run_id in (".", ".."):
        raise ValueError(f"run_id must be a non-empty string, not {run_id!r}")
    return run_id


def run_dir(run_id: str) -> str:
    return f"run_id={enc(run_id)}"


def manifest_rel(run_id: str, snapshot_id: int) -> str:
    return f"{MANIFEST_DIR}/{run_dir(run_id)}/{snapshot_id:020d}.json"


def delete_rel(run_id: str, snapshot_id: int) -> str:
    return f"{DELETE_DIR}/{run_dir(run_id)}/del-{snapshot_id:08d}-{file_token()}.arrow"
