"""One writer per (lake, run_id): a claim file per run, created with an exclusive create.

Two buffers in different directories (or machines) writing the same run would generate the same
keys and batch ids, and the second's snapshots would be taken for the first's. The lake is the only
place they share, so the writer of a run is recorded there: ``_writers/run_id=<run>.json`` holds
the writer id a buffer keeps in its index. ``claim`` creates it (``put_exclusive``: a create-only
PUT on S3, a hard link locally) or accepts it when it is the caller's; every commit checks it again;
``close`` removes it. After a writer died without closing, its claim stays until a new writer takes
over explicitly (``takeover=True``), which replaces it.
"""

from __future__ import annotations

import json
import socket
import time

from ..errors import CorruptionError, LockedError
from .fs import LakeFS
from .layout import run_dir

CLAIM_DIR = "_writers"


def claim_rel(run_id: str) -> str:
    return f"{CLAIM_DIR}/{run_dir(run_id)}.json"


class WriterClaims:
    """The writer claims of one lake."""

    def __init__(self, store: LakeFS) -> None:
        self.store = store

    def holder(self, run_id: str) -> dict | None:
        """The claim of ``run_id`` ({"writer", "host", "path", "at"}), or None when unclaimed."""
        rel = claim_rel(run_id)
        try:
            data = self.store.cat(rel)
        except FileNotFoundError:
            return None
        try:
            return json.loads(data)
        except ValueError as e:
            raise CorruptionError(
                f"writer claim {self.store.url_of(rel)} of run {run_id!r} is not valid JSON: {e}; "
                "reopen with takeover=True to replace it"
            ) from e

    def _refuse(self, run_id: str, other: dict) -> LockedError:
        return LockedError(
            f"run {run_id!r} of lake {self.store.url} is written by another buffer ({other.get('path')} on "
            f"{other.get('host')}, writer {other.get('writer')}); use a different run_id, close that buffer, "
            "or, if it is gone for good (crashed), reopen with takeover=True"
        )

    def claim(self, run_id: str, writer_id: str, path: str, *, takeover: bool = False) -> None:
        """Make ``writer_id`` the writer of ``run_id`` or raise ``LockedError`` naming the holder."""
        doc = json.dumps({"writer": writer_id, "host": socket.gethostname(), "path": path, "at": time.time()}).encode()
        rel = claim_rel(run_id)
        for _ in range(3):
            if self.store.io("claiming the run's writer", self.store.put_exclusive, rel, doc):
                return
            try:
                other = self.holder(run_id)
            except CorruptionError:
                if not takeover:
                    raise
                other = {}
            if other is None:
                continue  # released between the create and the read: try again
            if other.get("writer") == writer_id:
                return
            if not takeover:
                raise self._refuse(run_id, other)
            self.store.remove_quietly([rel])
        raise LockedError(f"run {run_id!r} of lake {self.store.url}: another buffer claimed it at the same time; retry")

    def check(self, run_id: str, writer_id: str) -> None:
        """Before a commit: ``LockedError`` unless ``writer_id`` still holds the claim."""
        other = self.holder(run_id)
        if other is None or other.get("writer") != writer_id:
            raise self._refuse(run_id, other or {"writer": None, "path": "(claim released)", "host": "?"})

    def release(self, run_id: str, writer_id: str) -> None:
        """Remove the claim if it is still ``writer_id``'s (best effort: the lake may be down)."""
        try:
            other = self.holder(run_id)
        except Exception:  # noqa: BLE001 - closing must not fail on the lake
            return
        if other is not None and other.get("writer") == writer_id:
            self.store.remove_quietly([claim_rel(run_id)])
