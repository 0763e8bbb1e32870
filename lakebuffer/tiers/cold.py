"""The cold tier as a tier: rows that left local disk and live only in the lake, read in place.

A warm fragment whose rows are all committed to the lake may leave local disk (``engine/diskbudget``);
its batches' index entries then say *where in the lake* each row is: a lake file (path and size, from
the Delta log) and the row inside it (``KeyIndex.set_cold``). A ``Location`` here is (file number, row
in file); file numbers are this process's, handed out by ``number``.

``take_checked`` (every ``get``) reads a file written since #23 by key through ``lake/pages.PageReader``:
DataFusion with ``key IN (...)`` pushed into the Parquet scan reads only the pages (32 KiB) that hold
the asked rows, of the asked columns, by ranged reads (local or S3), all files of a call in one plan;
every returned row is checked against its digests (``_lb_hash``, ``lake/rowhash.py``), so the cost of
verification follows the bytes read and the whole-file sha256 is never paid here. A file without
digests (written before), and ``take`` without keys, read only the row groups that hold the asked rows:
one ranged read per column chunk through Arrow's filesystem, the file checked whole against the sha256
in its name once per process (``lake/verified.py``; again on a local lake when its mtime changed) and
every page against its CRC (``page_checksum_verification``). Either way a read never returns bytes
failing a check (``CorruptionError`` naming the file).

Locations can go stale: compaction and lake deletes rewrite files (other rows, other positions) and gc
removes the replaced ones later. ``take_checked`` therefore reads each row's ``key`` too and raises
``StaleLocation`` when a row is not the one asked for, or its file is no longer in the lake; the caller
finds the keys again with ``locate`` (key column reads, pruned by the files' key ranges) and records the
new locations.

SQL sees cold-only rows through ``sources``: a pyarrow dataset over the lake files that hold them
(``Lake.dataset_of``) and the ids of the cold batches; the catalog's ``cold_rows`` view keeps the rows
of those batches only (``sql/tier_views.sql``), so a row also held locally is never seen twice.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds
import pyarrow.parquet as pq

from ..errors import CorruptionError, LakeBufferError, LakeError
from ..lake import rowhash
from ..lake.pages import METADATA_CACHE_BYTES, MissingRows, PageReader, storage_failed
from .base import Location, ScannedDataset, Staged, gather
from .mirror import LocalMirror

#: Parquet footers kept (one per lake file read; a footer is a few KB per row group)
MAX_FOOTERS = 256


class StaleLocation(Exception):
    """A cold location no longer holds its row (a compaction or delete rewrote the file): locate again."""


class _ColdDataset(ScannedDataset):
    """The lake files of the cold rows as DuckDB sees them: built, and each file verified against its
    sha256, only when a query actually reads them (DuckDB calls ``scanner`` then, not to bind a view),
    so a damaged lake file fails the queries that read it, not every query of the buffer."""

    _make: Any = None

    @classmethod
    def over(cls, make: Callable[[], pds.Dataset], schema: pa.Schema) -> _ColdDataset:
        out = cls(schema.empty_table())
        out._make = make
        return out

    def scanner(self, *args: Any, **kwargs: Any) -> Any:
        # one file and two batches ahead, not pyarrow's 4 x 16: a lake row group decodes to up to
        # 32 MiB, and the cold rows' scan must stay within the RAM budget at any lake size
        kwargs.setdefault("fragment_readahead", 1)
        kwargs.setdefault("batch_readahead", 2)
        # decoded row groups come from the system allocator: Arrow's default (mimalloc) keeps the freed
        # pages, and a sum over one column of 400 MB of cold rows grew RssAnon 143 MB instead of 50
        kwargs.setdefault("memory_pool", pa.system_memory_pool())
        return self._make().scanner(*args, **kwargs)


class _Mirrored:
    """The local mirror in the place of the lake for ``ColdTier._read_in`` (``tiers/mirror.py``)."""

    def __init__(self, mirror: LocalMirror) -> None:
        self.mirror = mirror
        self.store = mirror.store


class ColdTier:
    """Cold-only rows, read from the lake by (file, row) (implements ``Tier``; rows enter by ``KeyIndex.set_cold``)."""

    name = "cold"

    def __init__(self, lake: Callable[[], Any], run_id: str, schema: pa.Schema,
                 cache_bytes: int = METADATA_CACHE_BYTES) -> None:
        self._lake = lake  # the buffer's Lake (reopened when it was damaged at open); LakeError if none
        self.run_id = run_id
        self.schema = schema
        self._lock = threading.Lock()
        self._files: list[dict] = []
        self._numbers: dict[str, int] = {}
        self._batches: dict[int, int] = {}  # cold batch id -> rows (stats, the SQL view's filter)
        self._bytes: dict[int, int] = {}
        self._referenced: dict[str, dict] = {}  # lake path -> entry, of the files cold batches point at
        self._sql_entries: list[dict] | None = None  # None: exactly the referenced files
        self._footers: dict[str, pq.FileMetaData] = {}  # lake path -> Parquet footer (bounded, oldest dropped)
        self._page_readers: dict[int, PageReader] = {}  # id(store) -> keyed page reads of files with row digests
        self.cache_bytes = int(cache_bytes)  # each page reader's footer / page-index cache (RAM budget)
        self._batch_paths: dict[int, tuple[str, ...]] = {}  # cold batch id -> the lake paths of its rows
        self.mirror: LocalMirror | None = None  # local verified copies of lake files, read first (restore="eager")
        self._manifest: dict | None = None  # the run's latest manifest, until the lake changes (``invalidate``)
        self._version = 0

    @property
    def version(self) -> int:
        return self._version

    # bookkeeping (the engine calls these under its lock) ------------------------------------
    def number(self, entry: dict) -> int:
        """This process's number for a lake file entry (``{path, bytes, ...}``)."""
        with self._lock:
            n = self._numbers.get(entry["path"])
            if n is None:
                n = self._numbers[entry["path"]] = len(self._files)
                self._files.append(dict(entry))
            return n

    def admit(self, batch_id: int, rows: int, nbytes: int, files: Sequence[dict]) -> None:
        """Batch ``batch_id`` is cold now (its index entries say so); ``files`` hold its rows."""
        with self._lock:
            self._batches[batch_id] = rows
            self._bytes[batch_id] = nbytes
            self._batch_paths[batch_id] = tuple(e["path"] for e in files)
            for e in files:
                self._referenced.setdefault(e["path"], dict(e))
            self._version += 1

    def forget(self, batch_id: int, rows: int | None = None) -> None:
        """A cold batch lost rows (``rows`` left) or all of them (``None``) to a delete."""
        with self._lock:
            if rows:
                self._batches[batch_id] = rows
            else:
                self._batches.pop(batch_id, None)
                self._bytes.pop(batch_id, None)
                self._batch_paths.pop(batch_id, None)
            self._version += 1

    def touch(self) -> None:
        """Something the SQL sources depend on changed (a mirror copy left): register them again."""
        with self._lock:
            self._version += 1

    def unreferenced_mirror(self, paths: Sequence[str]) -> list[str]:
        """Those of ``paths`` that are mirrored and that no cold batch reads any more (promoted)."""
        if self.mirror is None:
            return []
        with self._lock:
            used = {p for ps in self._batch_paths.values() for p in ps}
        return [p for p in paths if p not in used and self.mirror.has(p)]

    def refresh(self, live: list[dict]) -> None:
        """The run's live lake files now: serve SQL from the referenced ones, or from all of them when
        a referenced file was rewritten (compaction, deletes) and its rows moved to files we do not know."""
        with self._lock:
            paths = {e["path"] for e in live}
            self._sql_entries = None if set(self._referenced) <= paths else list(live)
            self._version += 1

    def invalidate(self) -> None:
        """The lake changed (a snapshot, a compaction): read its file list again when needed."""
        with self._lock:
            self._manifest = None

    def _latest(self, lake: Any) -> dict | None:
        with self._lock:
            m = self._manifest
        if m is None:
            m = lake.latest_manifest(self.run_id)
            with self._lock:
                self._manifest = m
        return m

    def batch_ids(self) -> list[int]:
        with self._lock:
            return sorted(self._batches)

    # Tier protocol ---------------------------------------------------------------------------
    def stage(self, table: pa.Table, part: int | None = None) -> Staged:
        raise NotImplementedError("rows enter the cold tier by a snapshot, then leave local disk (engine/diskbudget)")

    def publish(self, staged: Staged) -> None:
        raise NotImplementedError("rows enter the cold tier by a snapshot, then leave local disk (engine/diskbudget)")

    def delete(self, keys: Sequence[str]) -> None:
        """Nothing to do here: the index forgets the keys and the next snapshot deletes them from the lake."""

    def take(self, where: Location, columns: Sequence[str]) -> pa.Table:
        """Rows by (file number, row in file), in order, with only ``columns`` (see the module)."""
        return self._read(where, list(columns), None)

    def take_checked(self, where: Location, columns: Sequence[str], keys: Sequence[str]) -> pa.Table:
        """``take``, raising ``StaleLocation`` unless row i is the one with ``keys[i]``."""
        return self._read(where, list(columns), list(keys))

    def arrow_source(self) -> Any:
        return self.sources()["cold_data"]

    def sources(self) -> dict[str, Any]:
        """What the catalog registers: the lake files holding cold-only rows, and the cold batch ids."""
        with self._lock:
            batches = pa.table({"_batch": pa.array(sorted(self._batches), pa.int64())})
            entries = list(self._referenced.values()) if self._sql_entries is None else list(self._sql_entries)
        if not batches.num_rows or not entries:
            return {"cold_data": self.schema.empty_table(), "cold_batches": batches}
        lake = self._lake()
        mirror = self.mirror

        def make() -> pds.Dataset:  # when a query reads it: the mirror as it is then
            local = [e for e in entries if mirror is not None and mirror.has(e["path"])]
            remote = [e for e in entries if not (mirror is not None and mirror.has(e["path"]))]
            parts = [lake.dataset_of(remote, self.schema)] if remote else []
            if local:
                assert mirror is not None
                parts.append(lake.dataset_of(local, self.schema, store=mirror.store))
            return parts[0] if len(parts) == 1 else pds.dataset(parts)

        return {"cold_data": _ColdDataset.over(make, lake.dataset_of([], self.schema).schema),
                "cold_batches": batches}

    def stats(self) -> dict[str, int]:
        """Cold-only rows (also held nowhere else), the bytes they took locally, lake files they are in."""
        with self._lock:
            out = {"rows": sum(self._batches.values()), "bytes": sum(self._bytes.values()),
                   "batches": len(self._batches), "files": len(self._referenced)}
            mirror = self.mirror
            if mirror is not None:
                out["local_rows"] = sum(r for b, r in self._batches.items()
                                        if self._batch_paths.get(b) and all(mirror.has(p) for p in self._batch_paths[b]))
        if mirror is not None:
            out["mirror_files"] = len(mirror.paths())
            out["mirror_bytes"] = mirror.nbytes()
        return out

    def memory_bytes(self) -> int:
        """RAM the page reader may hold for footers and page indexes (its cache's limit, which it fills
        as files are read), once a cold read started it; the buffer counts it in ``memory_limit_mb``."""
        with self._lock:
            return self.cache_bytes * len(self._page_readers)

    # reading -------------------------------------------------------------------------------
    def _read(self, where: Location, columns: list[str], keys: list[str] | None) -> pa.Table:
        """Rows of mirrored files from the local copies (the lake is not touched for them), the rest
        from the lake; a copy removed meanwhile (disk relief) is read from the lake instead."""
        mirror = self.mirror
        if mirror is None or len(where) == 0:
            return self._read_in(None, where, columns, keys)
        uniq, inv = np.unique(where.part, return_inverse=True)
        with self._lock:
            paths = [self._files[f]["path"] for f in uniq.tolist()]
        local = np.array([mirror.has(p) for p in paths], bool)[inv]
        if not local.any():
            return self._read_in(None, where, columns, keys)
        parts, order = [], []
        for mask, src in ((local, _Mirrored(mirror)), (~local, None)):
            idx = np.flatnonzero(mask)
            if not len(idx):
                continue
            sub = Location(where.part[idx], where.row[idx])
            sub_keys = [keys[i] for i in idx.tolist()] if keys is not None else None
            try:
                parts.append(self._read_in(src, sub, columns, sub_keys))
            except (CorruptionError, StaleLocation):
                if src is None or all(mirror.has(paths[j]) for j in np.unique(inv[idx]).tolist()):
                    raise
                parts.append(self._read_in(None, sub, columns, sub_keys))  # a copy left local disk meanwhile
            order.append(idx)
        if len(parts) == 1:
            return parts[0]
        return pa.concat_tables(parts).take(pa.array(np.argsort(np.concatenate(order), kind="stable")))

    def _read_in(self, src: _Mirrored | None, where: Location, columns: list[str], keys: list[str] | None) -> pa.Table:
        """``_read`` from the lake (``src`` None) or from the local mirror."""
        schema = pa.schema([self.schema.field(c) for c in columns])
        if len(where) == 0:
            return schema.empty_table()
        want = list(dict.fromkeys(columns + (["key"] if keys is not None else [])))
        lake = self._lake() if src is None else src
        uniq, inv = np.unique(where.part, return_inverse=True)
        rows = where.row.astype(np.int64)
        tables: list[pa.Table] = []
        which = np.empty(len(rows), np.int64)
        local = np.empty(len(rows), np.int64)
        pages = self._pages(lake) if keys is not None and PageReader.supports(lake.store) else None
        paged: list[tuple[dict, np.ndarray]] = []
        if pages is not None:
            with self._lock:
                entries = [self._files[f] for f in uniq.tolist()]
            pages.prepare(entries)
        for i, f in enumerate(uniq.tolist()):
            with self._lock:
                entry = self._files[f]
            sel = np.flatnonzero(inv == i)
            if pages is not None and self._has_digests(lake, pages, entry):
                paged.append((entry, sel))  # the page path, for all such files at once below
                continue
            pf = self._open(lake, entry)
            starts = np.cumsum([0] + [pf.metadata.row_group(g).num_rows for g in range(pf.metadata.num_row_groups)])
            if (rows[sel] >= starts[-1]).any():
                raise StaleLocation(entry["path"])
            group = np.searchsorted(starts, rows[sel], side="right") - 1
            for g in np.unique(group).tolist():
                hit = sel[group == g]
                # copy out the asked rows at once, so one decoded row group at a time is held (memory)
                picked = self._group(lake, entry, pf, g, want).take(pa.array(rows[hit] - starts[g]))
                which[hit] = len(tables)
                local[hit] = np.arange(len(hit), dtype=np.int64)
                tables.append(picked)
                del picked
                # hand the decoded row group's pages back now: Arrow's allocator (mimalloc) keeps freed
                # pages otherwise, and a get touching many row groups grew RssAnon 167 MB instead of 65
                pa.default_memory_pool().release_unused()
        if paged:
            # only the pages holding these keys, every row checked by its digests; one query for all files
            assert pages is not None and keys is not None
            groups, errors = pages.take_grouped([(e, [keys[j] for j in sel.tolist()]) for e, sel in paged], want,
                                                rows=[rows[sel] for _e, sel in paged])
            for i in sorted(errors):
                self._paged(lake, pages, paged[i][0], errors[i], want)  # raises what the error means
            for members, got, pos in groups:
                sel = np.concatenate([paged[i][1] for i in members])
                which[sel] = len(tables)
                local[sel] = pos
                tables.append(self._conform(got, want))
        out = gather(tables, which, local, want)
        if keys is not None and not pc.all(pc.equal(out.column("key"), pa.array(keys, pa.string()))).as_py():
            raise StaleLocation("a row is not the one its location named")
        return out.select(columns).cast(schema)

    def read_layouts_ahead(self, stop: Callable[[], bool] = lambda: False, decode: bool = False) -> int:
        """Read the page layouts (footer, offset indexes) of the lake files cold rows are in, newest
        first, into the page reader's cache (up to ``READ_AHEAD_SHARE`` of it), before a take asks
        (``decode``: the offset indexes parsed too). How many files' layouts were read."""
        with self._lock:
            entries = list(self._referenced.values())[::-1]
            mirror = self.mirror
        if mirror is not None:  # mirrored files are read from their local copies, through another reader
            entries = [e for e in entries if not mirror.has(e["path"])]
        if not entries:
            return 0
        lake = self._lake()
        if not PageReader.supports(lake.store):
            return 0
        rowhash.prepare()  # the digests every cold take checks: their tables at full size, once per process
        return self._pages(lake).read_ahead(entries, stop=stop, decode=decode)

    def _pages(self, lake: Any) -> PageReader:
        """The page reader of the lake now served (one per lake store; a reopened lake gets a new one)."""
        with self._lock:
            got = self._page_readers.get(id(lake.store))
            if got is None or got.store is not lake.store:
                for k in [k for k, r in self._page_readers.items() if r.store is not lake.store and k != id(lake.store)
                          and not (self.mirror is not None and r.store is self.mirror.store)]:
                    del self._page_readers[k]  # a reopened lake: its old reader goes
                got = self._page_readers[id(lake.store)] = PageReader(lake.store, cache_bytes=self.cache_bytes)
            return got

    def _has_digests(self, lake: Any, pages: PageReader, entry: dict) -> bool:
        """Whether the file carries row digests (written since #23); its footer is read once."""
        try:
            return pages.hashed(entry)
        except Exception as e:  # noqa: BLE001 - DataFusion raises plain Exceptions for missing/damaged files
            pages.forget(entry["path"])
            self._unreadable(lake, entry, e)
            raise AssertionError("unreachable") from e

    def _unreadable(self, lake: Any, entry: dict, e: BaseException) -> None:
        """Raise what a file that could not be opened means: ``StaleLocation`` when the lake no longer
        lists it (its rows live elsewhere), else ``CorruptionError`` naming it (missing or damaged)."""
        url = lake.store.url_of(entry["path"])
        if not self._live(lake, entry["path"]):
            raise StaleLocation(entry["path"]) from None
        if storage_failed(e):
            raise LakeError(f"reading lake file {url} failed: the lake's storage did not answer ({e}); "
                            "retry once it is reachable") from e
        if not lake.store.fs.exists(lake.store.abs(entry["path"])):
            raise CorruptionError(f"lake file {url} listed in the Delta log is missing; restore it from a copy "
                                  "of the lake (`lakebuffer fsck` lists every damaged file)") from None
        raise CorruptionError(f"lake file {url} is not readable Parquet: {e}; restore it from a copy of the "
                              "lake (`lakebuffer fsck` lists every damaged file)") from e

    def _paged(self, lake: Any, pages: PageReader, entry: dict, res: pa.Table | Exception, columns: list[str]) -> pa.Table:
        """One file's result of the page path, in the buffer's types, or what its error means."""
        from ..lake.verified import verify_entry

        if isinstance(res, pa.Table):
            return self._conform(res, columns)
        pages.forget(entry["path"])
        if isinstance(res, MissingRows):
            # moved by a compaction or delete (the file is gone from the lake), or its key pages are
            # damaged: then the whole file fails its sha256 (``CorruptionError`` naming it)
            if self._live(lake, entry["path"]):
                verify_entry(lake.store, entry)
            raise StaleLocation(entry["path"]) from None
        if not self._live(lake, entry["path"]):
            raise StaleLocation(entry["path"]) from None  # replaced and vacuumed: its rows live elsewhere
        if isinstance(res, LakeBufferError):
            raise res
        self._unreadable(lake, entry, res)
        raise AssertionError("unreachable")

    def _open(self, lake: Any, entry: dict, whole: bool = True) -> pq.ParquetFile:
        """The file, checked whole once per process (``verify_entry``; not with ``whole=False``: then
        only the page checksums of what is read are), opened for ranged reads."""
        from ..lake.verified import verify_entry

        store = lake.store
        try:
            if whole:
                verify_entry(store, entry)
            md = self._footers.get(entry["path"])  # a file never changes under its name: its footer is read once
            pf = pq.ParquetFile(store.pafs.open_input_file(store.abs(entry["path"])), metadata=md,
                                page_checksum_verification=True)
            if md is None:
                with self._lock:
                    self._footers[entry["path"]] = pf.metadata
                    while len(self._footers) > MAX_FOOTERS:
                        self._footers.pop(next(iter(self._footers)))
            return pf
        except CorruptionError:
            if not self._live(lake, entry["path"]):
                raise StaleLocation(entry["path"]) from None  # replaced and vacuumed: its rows live elsewhere
            raise
        except FileNotFoundError:
            if not self._live(lake, entry["path"]):
                raise StaleLocation(entry["path"]) from None
            raise CorruptionError(f"lake file {store.url_of(entry['path'])} listed in the Delta log is missing; "
                                  "restore it from a copy of the lake (`lakebuffer fsck` lists every damaged file)") from None
        except (pa.ArrowInvalid, OSError) as e:
            raise CorruptionError(f"lake file {store.url_of(entry['path'])} is not readable Parquet: {e}") from e

    def _live(self, lake: Any, path: str) -> bool:
        if isinstance(lake, _Mirrored):  # a local copy: present means its rows are there
            return lake.mirror.has(path)
        self.invalidate()
        m = self._latest(lake)
        return m is not None and any(e["path"] == path for e in m["files"])

    def _group(self, lake: Any, entry: dict, pf: pq.ParquetFile, g: int, columns: list[str]) -> pa.Table:
        """Row group ``g`` with ``columns`` in the buffer's types (partition columns filled in)."""
        avail = set(pf.schema_arrow.names)
        try:
            t = pf.read_row_group(g, columns=[c for c in columns if c in avail], use_threads=False)
        except (pa.ArrowInvalid, OSError) as e:
            raise CorruptionError(f"lake file {lake.store.url_of(entry['path'])} cannot be decoded ({e}); "
                                  "restore it from a copy of the lake") from e
        return self._conform(t, columns)

    def _conform(self, t: pa.Table, columns: list[str]) -> pa.Table:
        """``columns`` of rows read from a lake file, in the buffer's types (partition columns and
        columns the file predates filled in)."""
        avail = set(t.column_names)
        n = t.num_rows
        arrays = []
        for c in columns:
            field = self.schema.field(c)
            if c in avail:
                col = t.column(c)
                arrays.append(col if col.type.equals(field.type) else col.cast(field.type))
            elif c == "run_id":
                arrays.append(pa.repeat(pa.scalar(self.run_id, field.type), n))
            else:
                arrays.append(pa.nulls(n, field.type))
        return pa.Table.from_arrays(arrays, schema=pa.schema([self.schema.field(c) for c in columns]))

    # finding rows ----------------------------------------------------------------------------
    def locate(self, keys: Sequence[str]) -> tuple[list[dict], np.ndarray, np.ndarray, np.ndarray]:
        """Where the run's live lake files hold ``keys``: (file entries, file index, row, found), one
        key column read per file whose key range may hold one of them: its pages' checksums checked,
        never the whole file (a damaged key page that still decodes names a wrong row, which the
        digests of the read that follows catch: ``CorruptionError`` naming the file)."""
        from ..lake.reader import key_range_hit

        lake = self._lake()
        m = self._latest(lake)
        n = len(keys)
        file_idx = np.full(n, -1, np.int64)
        row = np.zeros(n, np.int64)
        used: list[dict] = []
        if m is None or not n:
            return used, file_idx, row, file_idx >= 0
        wanted = pa.array(list(keys), pa.string())
        sorted_keys = sorted(set(keys))
        for entry in m["files"]:
            if not key_range_hit(entry, sorted_keys):
                continue
            pf = self._open(lake, entry, whole=False)
            try:
                held = pf.read(columns=["key"], use_threads=False).column("key")
            except (pa.ArrowInvalid, OSError) as e:
                raise CorruptionError(f"lake file {lake.store.url_of(entry['path'])}: its key column cannot be "
                                      f"decoded ({e}); restore it from a copy of the lake") from e
            at = pc.index_in(wanted, value_set=held)
            pos = at.to_numpy(zero_copy_only=False)
            hit = ~np.isnan(pos.astype(np.float64)) & (file_idx < 0)
            if hit.any():
                file_idx[hit] = len(used)
                row[hit] = pos[hit].astype(np.int64)
                used.append({k: entry[k] for k in ("path", "bytes", "run_id", "policy_bucket", "min_key", "max_key",
                                                   "min_policy_version", "max_policy_version") if k in entry})
            if (file_idx >= 0).all():
                break
        return used, file_idx, row, file_idx >= 0
