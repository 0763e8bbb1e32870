"""The lake's metadata files: the settings file (``_lakebuffer.json``) and the manifest log of each
run (list, read with a cache, commit the next one with an exclusive create and rebase on a race).

Manifests stay plain dicts (the JSON documents as stored): the Delta Lake issue replaces this format
wholesale, so it is moved as it was rather than reworked into dataclasses.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import OrderedDict
from urllib.parse import unquote

import pyarrow as pa

from ..errors import CorruptionError, LakeError, SchemaError
from .fs import LakeFS
from .layout import (
    LAKE_FORMAT,
    LAKE_META,
    MANIFEST_DIR,
    MANIFEST_FORMAT,
    MANIFEST_NAME,
    check_run_id,
    enc,
    manifest_rel,
    now,
)
from .rows import schema_from_b64, schema_to_b64

CACHE_SIZE = 64


def read_settings(store: LakeFS) -> dict | None:
    """The stored lake settings, or None for a lake that has none yet."""
    try:
        return json.loads(store.cat(LAKE_META))
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as e:
        raise CorruptionError(f"lake settings {store.url_of(LAKE_META)} are not valid JSON: {e}") from e


def ensure_settings(store: LakeFS, policy_bucket_size: int) -> None:
    """Write the settings file once (exclusive create); a concurrent creator must agree with us."""
    created_at, _ = now()
    doc = {"format": LAKE_FORMAT, "policy_bucket_size": policy_bucket_size, "created_at": created_at}
    try:
        created = store.io("writing lake settings", store.put_exclusive, LAKE_META, json.dumps(doc, indent=1).encode())
    except LakeError:
        if read_settings(store) is None:  # not a lost reply: it really failed
            raise
        created = False
    if not created:
        stored = read_settings(store) or {}
        if int(stored.get("policy_bucket_size", policy_bucket_size)) != policy_bucket_size:
            raise LakeError(f"lake {store.url} was created concurrently with policy_bucket_size={stored.get('policy_bucket_size')}")


class ManifestLog:
    """Committed manifests of every run: listing, an LRU cache of the immutable documents, commits."""

    def __init__(self, store: LakeFS) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, int], dict] = OrderedDict()

    # ---- reading ------------------------------------------------------------------------
    def listing(self, run_id: str | None = None) -> dict[str, list[int]]:
        """{run_id: sorted committed snapshot ids}, from one listing."""
        store = self.store
        paths = store.find(MANIFEST_DIR if run_id is None else f"{MANIFEST_DIR}/run_id={enc(run_id)}", what="listing manifests")
        prefix = store.abs(MANIFEST_DIR) + "/"
        out: dict[str, list[int]] = {}
        for p in paths:
            p = store.strip(p)
            if not p.startswith(prefix):
                continue
            parts = p[len(prefix) :].split("/")
            if len(parts) != 2 or not parts[0].startswith("run_id="):
                continue
            m = MANIFEST_NAME.match(parts[1])
            if m:
                out.setdefault(unquote(parts[0][len("run_id=") :]), []).append(int(m.group(1)))
        for v in out.values():
            v.sort()
        return out

    def snapshots(self, run_id: str) -> list[int]:
        return self.listing(check_run_id(run_id)).get(run_id, [])

    def get(self, run_id: str, snapshot_id: int) -> dict:
        """One committed manifest (immutable, cached)."""
        key = (run_id, int(snapshot_id))
        with self._lock:
            m = self._cache.get(key)
            if m is not None:
                self._cache.move_to_end(key)
                return m
        rel = manifest_rel(run_id, snapshot_id)
        try:
            m = json.loads(self.store.cat(rel))
        except FileNotFoundError:
            raise LakeError(f"snapshot {snapshot_id} of run {run_id!r} is not in lake {self.store.url}") from None
        except json.JSONDecodeError as e:
            raise CorruptionError(f"manifest {self.store.url_of(rel)} is not valid JSON: {e}") from e
        self.remember(key, m)
        return m

    def remember(self, key: tuple[str, int], manifest: dict) -> None:
        with self._lock:
            self._cache[key] = manifest
            self._cache.move_to_end(key)
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)

    def forget(self, key: tuple[str, int]) -> None:
        with self._lock:
            self._cache.pop(key, None)

    def latest(self, run_id: str) -> dict | None:
        sids = self.snapshots(run_id)
        return self.get(run_id, sids[-1]) if sids else None

    def select(self, run_id: str | None, snapshot_id: int | None = None) -> dict[str, dict]:
        """{run: manifest}: one snapshot of one run, or the latest of one run / of every run."""
        if snapshot_id is not None:
            if run_id is None:
                raise ValueError("snapshot_id needs a run_id")
            return {run_id: self.get(run_id, snapshot_id)}
        listing = self.listing(None if run_id is None else check_run_id(run_id))
        return {r: self.get(r, sids[-1]) for r, sids in sorted(listing.items()) if sids}

    # ---- committing ---------------------------------------------------------------------
    def commit(
        self,
        run_id: str,
        parent: dict | None,
        *,
        policy_bucket_size: int,
        operation: str,
        add_files: list[dict],
        remove_files: set[str],
        add_deletes: list[dict],
        remove_deletes: set[str],
        schema: pa.Schema,
        meta: dict | None,
        extra: dict | None = None,
    ) -> dict:
        """Write the next manifest with an exclusive create; rebase on a concurrent commit when what
        this commit removes is still live there, else raise LakeError."""
        token = uuid.uuid4().hex
        for _ in range(16):
            parent_files = parent["files"] if parent else []
            parent_deletes = parent.get("delete_files", []) if parent else []
            live = {f["path"] for f in parent_files}
            live_del = {d["path"] for d in parent_deletes}
            if not remove_files <= live or not remove_deletes <= live_del:
                raise LakeError(
                    f"{operation} of run {run_id!r} conflicts with a concurrent commit (snapshot "
                    f"{parent['snapshot_id'] if parent else None}) that replaced the same files; nothing was committed"
                )
            sid = (parent["snapshot_id"] if parent else 0) + 1
            unified = schema
            if parent and parent.get("schema"):
                try:
                    unified = pa.unify_schemas([schema_from_b64(parent["schema"]), schema])
                except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
                    raise SchemaError(f"snapshot schema does not fit run {run_id!r}: {e}") from e
            files = [f for f in parent_files if f["path"] not in remove_files] + add_files
            deletes = [d for d in parent_deletes if d["path"] not in remove_deletes] + add_deletes
            created_at, ts = now()
            manifest = {
                "format": MANIFEST_FORMAT,
                "run_id": run_id,
                "snapshot_id": sid,
                "parent_id": parent["snapshot_id"] if parent else None,
                "created_at": created_at,
                "created_at_s": ts,
                "operation": operation,
                "policy_bucket_size": policy_bucket_size,
                "schema": schema_to_b64(unified),
                "columns": [{"name": f.name, "type": str(f.type)} for f in unified],
                "files": files,
                "delete_files": deletes,
                "added_files": [f["path"] for f in add_files] + [d["path"] for d in add_deletes],
                "removed_files": sorted(remove_files | remove_deletes),
                "summary": {
                    "files": len(files),
                    "rows": sum(int(f["rows"]) for f in files),
                    "bytes": sum(int(f["bytes"]) for f in files),
                    "delete_files": len(deletes),
                    "deleted_keys": sum(int(d["rows"]) for d in deletes),
                },
                "meta": meta or {},
                "commit_token": token,
                **(extra or {}),
            }
            rel = manifest_rel(run_id, sid)
            data = json.dumps(manifest, separators=(",", ":")).encode()
            try:
                created = self.store.put_exclusive(rel, data)
            except Exception as e:
                created = self._outcome(run_id, sid, token, e)
            if created:
                self.remember((run_id, sid), manifest)
                return manifest
            self.forget((run_id, sid))
            other = self.get(run_id, sid)
            if other.get("commit_token") == token:  # our own write, retried after a lost reply
                return other
            parent = self.latest(run_id)
        raise LakeError(f"could not commit to run {run_id!r} of lake {self.store.url}: too many concurrent commits")

    def _outcome(self, run_id: str, sid: int, token: str, error: Exception) -> bool:
        """After a failed manifest write: True if it landed anyway (a lost reply), else raise."""
        what = f"committing snapshot {sid} of run {run_id!r} to lake {self.store.url} failed ({type(error).__name__}: {error})"
        try:
            other = json.loads(self.store.cat(manifest_rel(run_id, sid)))
        except FileNotFoundError:
            raise LakeError(f"{what}; nothing was committed") from error
        except Exception:
            raise LakeError(
                f"{what} and the store did not answer the check: the snapshot is either fully visible or not at all; "
                "look at latest_manifest() (e.g. a token in meta) before retrying"
            ) from error
        return other.get("commit_token") == token  # else someone else's commit: rebase


def manifest_paths(manifest: dict) -> set[str]:
    """Every data and delete file a manifest references."""
    return {f["path"] for f in manifest["files"]} | {d["path"] for d in manifest.get("delete_files", [])}


__all__ = ["ManifestLog", "manifest_paths", "read_settings", "ensure_settings"]
