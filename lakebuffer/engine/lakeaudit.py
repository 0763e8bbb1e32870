"""Rows a run committed that are gone from the lake: noticed before each snapshot, put back from local
copies, and reported (``stats()["cold"]``, ``fsck --lake``); never silent.

Another Delta writer can remove a run's rows (``write_deltalake(mode="overwrite")``, a ``DELETE``, a
``remove`` action): the Delta log allows it and nothing in lakebuffer's own commits would notice. Before
each snapshot the audit looks, cheaply, for a reason to suspect it: a commit without lakebuffer's
commit document (another writer's) since the version it last looked at, or fewer live rows of the run in
the log's stats than the index says were committed. Only then does it read the run's key column from
the lake (keys only, no payload, no whole-file hashing) and compare it with the keys of the index's
committed batches. Missing rows whose batch is still hot or warm are uploaded again by the same
snapshot commit; so are rows only the lake held (cold batches) while the files the other writer
removed are still there (until a vacuum), read and verified like any cold read; the rest are lost and
reported with their keys. The
totals and the last audited Delta version persist in the index (setting ``lake_audit``), so a reopen
neither forgets what was lost nor repeats the comparison.

Memory: the comparison holds the run's keys once (as the catalog's ``meta`` does), never payload.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import CorruptionError, LakeBufferError
from ..index import BatchInfo, KeyIndex
from ..lake import Lake
from ..lake.entries import entries_of
from .reads import get, read_batch
from .state import BufferState

log = logging.getLogger("lakebuffer")

AUDIT = "lake_audit"  # index setting: JSON of the audit's totals and last version
LOST_KEYS_KEPT = 10_000  # lost keys remembered by name (the count is exact beyond it)
KEY_SCHEMA = pa.schema([pa.field("key", pa.string())])


@dataclass
class Missing:
    """What the lake lacks of a run's committed rows."""

    rows: int = 0
    local: dict[int, pa.Array] = field(default_factory=dict)  # batch id -> keys a local tier still holds
    lost: list[str] = field(default_factory=list)  # keys only the lake held
    removed_by: list[dict] = field(default_factory=list)  # the run's files other writers' commits removed
    version: int = -1  # the Delta version compared

    @property
    def local_rows(self) -> int:
        return sum(len(k) for k in self.local.values())


def committed_keys(index: KeyIndex, batches: dict[int, BatchInfo]) -> tuple[pa.Array, np.ndarray]:
    """(keys, batch id per key) of every batch a snapshot committed, as the index holds them now."""
    keys: list[pa.Array] = []
    bids: list[np.ndarray] = []
    for bid, info in sorted(batches.items()):
        if info.snapshot is None:
            continue
        meta = index.batch_meta(bid)
        if meta is None or meta.num_rows == 0:
            continue
        col = meta.column("key").combine_chunks()
        keys.append(col if col.type == pa.string() else col.cast(pa.string()))
        bids.append(np.full(len(col), bid, np.int64))
    if not keys:
        return pa.array([], pa.string()), np.zeros(0, np.int64)
    return pa.concat_arrays(keys), np.concatenate(bids)


def lake_keys(lake: Lake, run_id: str) -> pa.Array:
    """Every key of the run's live lake files (the key column only; pages checked by their CRCs)."""
    entries = entries_of(lake.table(), run_id)
    if not entries:
        return pa.array([], pa.string())
    t = lake.dataset_of(entries, KEY_SCHEMA, verify=False).to_table(columns=["key"])
    col = t.column("key").combine_chunks()
    return col if col.type == pa.string() else col.cast(pa.string())


def foreign_versions(lake: Lake, after: int | None, dt: Any = None) -> list[int]:
    """Versions after ``after`` up to ``dt``'s (default: the latest) committed without lakebuffer's
    document: another writer's (the documents are cached per process: no log read in steady state)."""
    dt = lake.table() if dt is None else dt
    if dt is None:
        return []
    ours = lake.delta.docs(dt)
    start = -1 if after is None else after
    return [v for v in range(start + 1, dt.version() + 1) if v not in ours]


def removals(lake: Lake, versions: list[int], run_id: str) -> list[dict]:
    """The run's files that the commits ``versions`` removed with ``dataChange``: ``{version, path,
    operation}`` (from their log files; a commit that cannot be read names no file)."""
    from ..lake.layout import DELTA_LOG, run_dir

    prefix = run_dir(run_id) + "/"
    out: list[dict] = []
    for v in versions:
        try:
            text = lake.store.cat(f"{DELTA_LOG}/{v:020d}.json").decode()
        except Exception:  # noqa: BLE001 - only names the culprit; the key comparison is the evidence
            continue
        op = "?"
        found = []
        for line in text.splitlines():
            try:
                action = json.loads(line)
            except ValueError:
                continue
            if "commitInfo" in action:
                ci = action["commitInfo"]
                mode = (ci.get("operationParameters") or {}).get("mode")
                op = f"{ci.get('operation', '?')}{f' mode={mode}' if mode else ''}"
            rm = action.get("remove")
            if rm and rm.get("dataChange", True):
                path = rm.get("path", "")
                run = (rm.get("partitionValues") or {}).get("run_id")
                if run == run_id or (run is None and path.startswith(prefix)):
                    found.append(path)
        out += [{"version": v, "path": lake.store.url_of(p), "operation": op} for p in found]
    return out


def find_missing(index: KeyIndex, batches: dict[int, BatchInfo], lake: Lake, run_id: str,
                 known_lost: set[str] = frozenset()) -> Missing:
    """Compare the lake's keys of ``run_id`` with the index's committed keys (``known_lost`` excluded)."""
    have = lake_keys(lake, run_id)  # the lake first: a row the index drops meanwhile is no false alarm
    keys, bids = committed_keys(index, batches)
    out = Missing()
    if len(keys) == 0:
        return out
    gone = pc.invert(pc.is_in(keys, value_set=have)).to_numpy(zero_copy_only=False)
    if known_lost:
        gone &= ~pc.is_in(keys, value_set=pa.array(sorted(known_lost), pa.string())).to_numpy(zero_copy_only=False)
    idx = np.flatnonzero(gone)
    if not len(idx):
        return out
    out.rows = len(idx)
    gone_keys, gone_bids = keys.take(pa.array(idx)), bids[idx]
    for bid in np.unique(gone_bids):
        sel = gone_keys.filter(pa.array(gone_bids == bid))
        info = batches.get(int(bid))
        if info is not None and info.tier in ("hot", "warm"):
            out.local[int(bid)] = sel
        else:
            out.lost += sel.to_pylist()
    return out


class LakeAudit:
    """The buffer's side: ``check`` before a snapshot, ``committed``/``settle`` after it, ``stats``."""

    def __init__(self, state: BufferState) -> None:
        self.s = state
        raw = state.index.get_setting(AUDIT)
        saved: dict[str, Any] = json.loads(raw.decode()) if raw else {}
        self.version: int | None = saved.get("version")
        self.totals = {k: int(saved.get(k, 0)) for k in ("missing_rows", "missing_files", "reuploaded_rows", "lost_rows")}
        self.lost_keys: list[str] = list(saved.get("lost_keys", []))
        self.removed_by: list[dict] = list(saved.get("removed_by", []))
        # a shortfall of the log's row count that a key comparison found harmless (files another writer
        # added without row counts): not a reason to compare again until it grows
        self._accepted_shortfall = 0

    def check(self, lake: Lake) -> Missing | None:
        """What the lake lost of this run since the last look (None: no reason to suspect anything)."""
        s = self.s
        dt = lake.table()
        if dt is None:
            return None
        version = dt.version()
        with s.lock:
            batches = dict(s.batches)
        expected = sum(i.rows for i in batches.values() if i.snapshot is not None)
        if expected == 0:
            self._seen(version)
            return None
        in_lake = sum(int(e["rows"] or 0) for e in entries_of(dt, s.run_id))
        shortfall = expected - self.totals["lost_rows"] - in_lake
        foreign = foreign_versions(lake, self.version, dt)
        if not foreign and shortfall <= self._accepted_shortfall:
            self._seen(version)
            return None
        found = find_missing(s.index, batches, lake, s.run_id, set(self.lost_keys))
        found.removed_by = removals(lake, foreign, s.run_id)
        found.version = version
        if not found.rows:
            self._accepted_shortfall = max(0, shortfall)
            self._seen(version)
            return None
        log.error("lake %s lost %d committed rows of run %r (removed by another writer: %s); %d are still held "
                  "locally and %d only the lake held (read back from the removed files while they exist): this "
                  "snapshot uploads them again", lake.url, found.rows, s.run_id,
                  _culprits(found.removed_by) or "unknown commit", found.local_rows, len(found.lost))
        return found

    def committed(self, found: Missing | None, version: int, reuploaded: int = 0, lost: list[str] | None = None) -> None:
        """A snapshot commit landed (at ``version``), carrying ``reuploaded`` rows of ``found``; ``lost``:
        its keys that could not be read anywhere (default: every key only the lake held)."""
        if found is not None:
            lost = found.lost if lost is None else lost
            self.totals["missing_rows"] += found.rows
            self.totals["missing_files"] += len(found.removed_by)
            self.totals["reuploaded_rows"] += reuploaded
            self.totals["lost_rows"] += len(lost)
            self.lost_keys = (self.lost_keys + lost)[:LOST_KEYS_KEPT]
            self.removed_by = (self.removed_by + found.removed_by)[-100:]
        self.version = None  # forces the write below
        self._seen(version)

    def settle(self, found: Missing) -> None:
        """Nothing could be uploaded again: record the finding without a commit."""
        self.committed(found, found.version, 0)

    def _seen(self, version: int) -> None:
        if self.version == version:
            return
        self.version = version
        doc = {"version": version, **self.totals, "lost_keys": self.lost_keys, "removed_by": self.removed_by}
        self.s.index.put_setting(AUDIT, json.dumps(doc).encode())

    def stats(self) -> dict[str, Any]:
        return {**self.totals, "lost_keys": self.lost_keys[:20], "removed_by": self.removed_by[-5:]}


class Reupload:
    """The rows of ``found`` one snapshot uploads again, as tables for ``commit_snapshot``: first those a
    local tier holds, then those only the lake held, read through the buffer's cold path from the files
    the other writer removed (verified against their sha256; gone after a vacuum: then they are lost).
    Keys deleted meanwhile are skipped. ``rows``, ``lost`` and ``damage`` (a local copy failing its
    check, raised as the local tier's error) are read after the commit."""

    CHUNK = 1024  # keys per cold read: a read holds their payload once

    def __init__(self, s: BufferState, found: Missing) -> None:
        self.s = s
        self.found = found
        self.rows = 0
        self.lost: list[str] = []
        self.damage: CorruptionError | None = None

    @property
    def wanted(self) -> bool:
        return bool(self.found.local or self.found.lost)

    def tables(self) -> Iterator[pa.Table]:
        for bid, keys in self.found.local.items():
            try:
                t = read_batch(self.s, bid)
            except CorruptionError as e:
                self.damage = e
                raise
            if t is None:
                continue
            t = t.filter(pc.is_in(t.column("key"), value_set=keys))
            if t.num_rows:
                self.rows += t.num_rows
                yield t
        lake_only = self.found.lost
        for i in range(0, len(lake_only), self.CHUNK):
            chunk = lake_only[i : i + self.CHUNK]
            _, _, known = self.s.index.lookup(chunk)
            chunk = [k for k, ok in zip(chunk, known.tolist()) if ok]
            if not chunk:
                continue
            try:
                t = get(self.s, chunk, None)
            except LakeBufferError as e:
                log.error("%d rows of run %r only the lake held cannot be read any more (%s): they are lost",
                          len(chunk), self.s.run_id, e)
                self.lost += chunk
                continue
            self.rows += t.num_rows
            yield t


def _culprits(removed: list[dict]) -> str:
    seen: dict[int, str] = {}
    for r in removed:
        seen.setdefault(r["version"], r["operation"])
    return ", ".join(f"version {v} ({op})" for v, op in sorted(seen.items()))
