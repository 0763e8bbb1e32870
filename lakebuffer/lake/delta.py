"""The lake's Delta log: open the table, commit add/remove actions, and map run snapshots to versions.

Every commit goes through deltalake's transaction API (``create_table_with_add_actions`` for the first,
``DeltaTable.create_write_transaction`` after): the data files are written by ``lake/writer.py``, Delta
only records them, so readers of any engine see exactly the committed files. Commits on S3 use
delta-rs' create-only PUT (``If-None-Match``), locally an exclusive create: no locking service.

A run's snapshot ids are Delta *app transactions* (``Transaction(app_id="lakebuffer:<run>",
version=<snapshot id>)``, read with ``DeltaTable.transaction_version``). Two commits that carry the same
app id conflict in delta-rs' conflict checker, so "the run's next snapshot id" is claimed inside the
commit itself: two writers of one run racing for the same id cannot both land (the loser gets
``CommitFailedError`` and nothing of it is visible). Each lakebuffer commit also carries a JSON document
in its ``commitInfo`` (custom metadata ``lakebuffer``): run, snapshot id, operation, the run's Arrow
schema and the buffer's ``meta`` (next key sequence, batch ids, writer id). ``commitInfo`` lives in the
commit's log file only, so the table is created with ``delta.enableExpiredLogCleanup=false``: the log of
commits is the record of snapshots and is never cleaned up (one small JSON per snapshot; checkpoints keep
reads fast). The lake's own settings (``policy_bucket_size``) are the table's description (JSON), which
every checkpoint keeps (delta-rs refuses unknown table properties).
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import CommitFailedError, DeltaError, DeltaProtocolError, TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

from ..errors import CorruptionError, LakeError, LockedError
from .entries import entries_of
from .fs import LakeFS
from .layout import DELTA_LOG, PARTITION_COLUMNS, PARTITION_FIELDS, now

DOC_KEY = "lakebuffer"
TABLE_CONFIG = {"delta.enableExpiredLogCleanup": "false"}
COMMIT_ATTEMPTS = 5  # a commit that lost a race to an unrelated commit of another writer is tried again


def app_id(run_id: str) -> str:
    return f"lakebuffer:{run_id}"


def delta_storage_options(store: LakeFS) -> dict[str, str]:
    """deltalake (object_store) options from the fsspec-style ``storage_options`` of the lake
    (``endpoint_url``, ``key``, ``secret``, ``token``, ``client_kwargs.region_name``,
    ``config_kwargs`` timeouts); upper-case ``AWS_*`` / ``AZURE_*`` / ``GOOGLE_*`` keys pass through."""
    so = {**_from_filesystem(store.fs), **store.storage_options}
    out: dict[str, str] = {}
    if store.protocol in ("s3", "s3a"):
        ep_env = os.environ.get("AWS_ENDPOINT_URL", "")
        if ep_env.startswith("http://"):
            out["AWS_ALLOW_HTTP"] = "true"
        ep = so.get("endpoint_url") or (so.get("client_kwargs") or {}).get("endpoint_url")
        if ep:
            out["AWS_ENDPOINT_URL"] = str(ep)
            if str(ep).startswith("http://"):
                out["AWS_ALLOW_HTTP"] = "true"
        for src, dst in (("key", "AWS_ACCESS_KEY_ID"), ("secret", "AWS_SECRET_ACCESS_KEY"), ("token", "AWS_SESSION_TOKEN")):
            if so.get(src):
                out[dst] = str(so[src])
        region = so.get("region") or so.get("region_name") or (so.get("client_kwargs") or {}).get("region_name")
        if region:
            out["AWS_REGION"] = str(region)
        ck = so.get("config_kwargs") or {}
        if ck.get("connect_timeout") is not None:
            out["connect_timeout"] = f"{float(ck['connect_timeout']):g}s"
        if ck.get("read_timeout") is not None:
            out["timeout"] = f"{float(ck['read_timeout']):g}s"
        attempts = (ck.get("retries") or {}).get("max_attempts")
        if attempts is not None:
            out["max_retries"] = str(max(0, int(attempts) - 1))
    for k, v in so.items():
        if isinstance(k, str) and k.isupper() and isinstance(v, (str, int, float, bool)):
            out[k] = str(v).lower() if isinstance(v, bool) else str(v)
    return out


_IO_WORDS = ("s3 error", "connect", "timed out", "timeout", "error sending request", "http error", "dns", "forbidden",
             "access denied", "permission", "object store", "io error", "broken pipe", "reset by peer")
_DAMAGE_WORDS = ("json", "parse", "invalid", "deserializ", "corrupt", "unexpected end", "eof", "utf-8", "magic")


def _from_filesystem(fs: Any) -> dict:
    """Connection settings of an s3fs filesystem handed to ``Lake(filesystem=...)`` (public attributes)."""
    out: dict = {}
    for name in ("endpoint_url", "key", "secret", "token"):
        v = getattr(fs, name, None)
        if isinstance(v, str) and v:
            out[name] = v
    ck = getattr(fs, "client_kwargs", None)
    if isinstance(ck, dict) and ck:
        out["client_kwargs"] = ck
    return out


def _damaged(e: Exception) -> bool:
    """Whether a deltalake error means a damaged log (rather than an unreachable store): delta-rs
    raises the same exception classes for both, so the message decides."""
    text = str(e).lower()
    if any(w in text for w in _IO_WORDS):
        return False
    return any(w in text for w in _DAMAGE_WORDS)


class DeltaLog:
    """The Delta table at the lake's URL: open (at a version), commit, and the lakebuffer commit docs."""

    def __init__(self, store: LakeFS) -> None:
        self.store = store
        self.uri = store.url
        self.options = delta_storage_options(store)
        self._docs: dict[int, dict | None] = {}  # version -> lakebuffer doc (None: not ours / unknown)
        self._lock = threading.Lock()

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (CommitFailedError, TableNotFoundError, LockedError, LakeError, CorruptionError):
            raise
        except (DeltaError, DeltaProtocolError, OSError) as e:
            if _damaged(e):
                bad = self.damaged_file()
                raise CorruptionError(
                    f"the Delta log of lake {self.uri} is damaged ({what}: {e}){f'; {bad} does not parse' if bad else ''}; "
                    "restore the damaged _delta_log file from a copy of the lake"
                ) from e
            raise LakeError(f"{what} on lake {self.uri} failed: {type(e).__name__}: {e}") from e
        except Exception as e:  # noqa: BLE001 - any dependency error reaches the user as a LakeError
            raise LakeError(f"{what} on lake {self.uri} failed: {type(e).__name__}: {e}") from e

    def damaged_file(self, newest: int = 100) -> str | None:
        """The newest commit file of the log that is not valid JSON lines (checks at most ``newest``), or
        None: delta-rs' parse errors do not name the file."""
        try:
            names = sorted(p for p in self.store.find(DELTA_LOG) if p.endswith(".json"))[-newest:]
            for path in reversed(names):
                rel = self.store.strip(path)[len(self.store.root) + 1 :]
                for line in self.store.cat(rel).splitlines():
                    if line.strip():
                        json.loads(line)
        except ValueError:
            return self.store.url_of(rel)
        except Exception:  # noqa: BLE001 - only a hint for the message
            return None
        return None

    def table(self, version: int | None = None) -> DeltaTable | None:
        """The table (at ``version``), or None when the lake has no Delta table yet."""
        try:
            return self._call("opening the Delta table", DeltaTable, self.uri, version=version, storage_options=self.options)
        except TableNotFoundError:
            if version is not None:
                raise LakeError(f"version {version} of the Delta table at {self.uri} does not exist") from None
            return None

    def settings(self, dt: DeltaTable) -> dict:
        """lakebuffer's settings stored as the table description (empty for a table we did not create)."""
        desc = dt.metadata().description
        try:
            doc = json.loads(desc) if desc else {}
        except ValueError:
            return {}
        return doc.get(DOC_KEY, {}) if isinstance(doc, dict) else {}

    # ---- commit docs ----------------------------------------------------------------------
    def docs(self, dt: DeltaTable) -> dict[int, dict]:
        """version -> lakebuffer doc of every commit up to ``dt``'s version (cached per process:
        commits are immutable; only versions not seen yet are read)."""
        latest = dt.version()
        with self._lock:
            known = max(self._docs, default=-1)
        if latest > known:
            hist = self._call("reading the Delta history", dt.history, latest - known)
            new: dict[int, dict | None] = {}
            for h in hist:
                v = int(h.get("version", -1))
                raw = h.get(DOC_KEY)
                doc = None
                if raw:
                    try:
                        doc = json.loads(raw) if isinstance(raw, str) else dict(raw)
                    except ValueError:
                        doc = None
                new[v] = doc
            with self._lock:
                self._docs.update(new)
        with self._lock:
            return {v: d for v, d in self._docs.items() if d is not None and v <= latest}

    def run_commits(self, dt: DeltaTable, run_id: str) -> dict[int, tuple[int, dict]]:
        """snapshot id -> (version, doc) of the run's snapshot commits up to ``dt``'s version."""
        out: dict[int, tuple[int, dict]] = {}
        for v, d in sorted(self.docs(dt).items()):
            if d.get("run_id") == run_id and d.get("operation") == "append":
                out[int(d["snapshot_id"])] = (v, d)
        return out

    # ---- commit ---------------------------------------------------------------------------
    def commit(
        self,
        dt: DeltaTable | None,
        *,
        adds: list[AddAction],
        removes: list[RemoveAction],
        schema: pa.Schema,
        doc: dict,
        txn: tuple[str, int] | None,
        settings: dict,
    ) -> tuple[DeltaTable, dict]:
        """Commit the actions as one Delta version carrying ``doc`` (and the run's app transaction);
        create the table first when ``dt`` is None. (the committed table, a fresh handle; the doc as
        committed)."""
        doc = {**doc, "created_at": now()[0], "created_at_s": now()[1]}
        props = CommitProperties(
            custom_metadata={DOC_KEY: json.dumps(doc)},
            app_transactions=[Transaction(app_id(txn[0]), txn[1])] if txn else None,
        )
        delta_schema = self._call("converting the schema", DeltaSchema.from_arrow, table_schema(schema))
        if dt is None:
            try:
                self._call(
                    "creating the Delta table",
                    create_table_with_add_actions,
                    self.uri,
                    delta_schema,
                    adds,
                    mode="error",
                    partition_by=PARTITION_COLUMNS,
                    description=json.dumps({DOC_KEY: settings}),
                    configuration=TABLE_CONFIG,
                    storage_options=self.options,
                    commit_properties=props,
                )
                return self.table(), doc
            except (LakeError, CommitFailedError) as e:
                dt = self.table()
                if dt is None or not (isinstance(e, CommitFailedError) or "exist" in str(e).lower()):
                    raise
                # created concurrently by another writer: append to it instead
        for attempt in range(COMMIT_ATTEMPTS):
            self.evolve(dt, schema)
            try:
                self._call(
                    "committing to the Delta table",
                    dt.create_write_transaction,
                    [*adds, *removes],
                    mode="append",
                    schema=dt.schema(),  # the table's (evolved) schema: a run may lack columns
                    partition_by=PARTITION_COLUMNS,
                    commit_properties=props,
                )
                return self.table(), doc
            except CommitFailedError:
                fresh = self.table()
                if attempt + 1 == COMMIT_ATTEMPTS or fresh is None or not still_valid(fresh, removes, txn):
                    raise
                dt = fresh  # a commit of another writer that does not touch ours: commit again on top of it
        raise AssertionError("unreachable")

    def evolve(self, dt: DeltaTable, schema: pa.Schema) -> None:
        """Add the columns of ``schema`` the table does not have yet (a run with extra columns)."""
        have = {f.name for f in dt.schema().fields}
        extra = [f for f in table_schema(schema) if f.name not in have]
        if extra:
            fields = DeltaSchema.from_arrow(pa.schema([f.with_nullable(True) for f in extra])).fields
            self._call("adding columns to the Delta table", dt.alter.add_columns, fields)
            dt.update_incremental()


def still_valid(dt: DeltaTable, removes: list[RemoveAction], txn: tuple[str, int] | None) -> bool:
    """Whether a commit that lost a race can be committed again on top of ``dt`` unchanged: no other
    writer claimed its snapshot id, and every file it removes is still live. delta-rs' conflict checker
    also refuses appends that race a metadata change (a table created or widened by another writer, at
    the same time), which changes nothing for these actions."""
    if txn is not None and (dt.transaction_version(app_id(txn[0])) or 0) >= txn[1]:
        return False
    if not removes:
        return True
    live = {e["path"] for e in entries_of(dt)}
    return all(r.path in live for r in removes)


def table_schema(row_schema: pa.Schema) -> pa.Schema:
    """The Delta table's schema of a run's rows: file columns, then ``run_id`` and ``policy_bucket``."""
    fields = [f for f in row_schema if f.name not in PARTITION_COLUMNS]
    return pa.schema([*fields, *PARTITION_FIELDS])
