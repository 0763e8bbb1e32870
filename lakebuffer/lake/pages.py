"""Rows of lake files by key at page granularity, each row checked against its recorded digests.

Since the row reader (``lake/rowpages.py``), a take that knows its rows' positions (every cold ``get``)
is served by it first; the DataFusion query below reads only the files it leaves (a column kind it does
not decode, a page that fails its CRC, a row that fails its digest), and says what is wrong with them.

Why DataFusion (arrow-rs): it reads a ``key IN (...)`` with the filter pushed into the Parquet scan
(late materialisation): the key pages the page index leaves are decoded, the matching rows become a
row selection, and of every other asked column only the pages holding those rows are fetched and
decoded (the offset index), by ranged reads, locally or from S3. pyarrow 26 decodes whole column
chunks of the row groups it reads; the probe of each candidate is in BENCHMARKS.md ("#23 cold get").

Why the digests: DataFusion does not verify Parquet page CRCs (a flipped byte came back as wrong
values). Every file written since #23 carries ``_lb_hash`` (``lake/rowhash.py``); ``take`` reads it
with the rows and checks the digest of the key and of every returned column of every returned row:
a mismatch or a page that does not decode is a ``CorruptionError`` naming the file, and the whole-file
sha256 is never read on this path. A file without the column (written before: ``hashed`` is False),
and a lake on a store DataFusion is not set up for here (``supports``: a local directory and S3 are),
are read the older, verified way by the caller.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import CorruptionError, LakeBufferError, LakeError
from .fs import LakeFS
from .pagedecode import PageDamaged
from .prefetch import prefetch
from .rowhash import HASH_COLUMN, file_digest_columns, mismatches
from .rowpages import RowPages, Unreadable
from .runtime import native_call, s3_settings

#: files registered with the reader at a time (a footer and page index each in DataFusion's cache)
MAX_TABLES = 256
#: DataFusion's cache of Parquet footers and page indexes when the owner gives no budget share
METADATA_CACHE_BYTES = 16 << 20
#: ... and its bounds when sized from a RAM budget (``cache_bytes_for``)
METADATA_CACHE_MIN, METADATA_CACHE_MAX, METADATA_CACHE_SHARE = 2 << 20, 64 << 20, 16
#: bytes read from a file's end to get its footer (more if the footer says so)
METADATA_HINT = 64 * 1024
PREPARE_THREADS = 8  # footers fetched at once by ``prepare``
FILE_COLUMN = "_lb_file"  # which item of a ``take_many`` a row came from


class MissingRows(Exception):
    """Keys the file does not hold (a compaction or delete moved them, or its key pages are damaged)."""

    def __init__(self, keys: list[str]) -> None:
        super().__init__(f"{len(keys)} keys not in the file")
        self.keys = keys


def storage_failed(e: BaseException) -> bool:
    """Whether a DataFusion error came from the object store (network, credentials, throttling) rather
    than from the bytes it read (DataFusion raises plain Exceptions; its message says which)."""
    text = str(e).lower()
    return any(m in text for m in ("object store error", "generic s3 error", "error sending request",
                                   "connection refused", "timed out", "credential"))


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(value: str) -> str:
    """A SQL string literal (DataFusion's standard strings: only ``'`` is special)."""
    return "'" + value.replace("'", "''") + "'"


def cache_bytes_for(memory_limit_bytes: int) -> int:
    """The footer / page-index cache for a RAM budget: 1/``METADATA_CACHE_SHARE`` of it, within bounds
    (a footer and page index of a 32 MiB lake file take ~50-100 KB decoded)."""
    return int(min(METADATA_CACHE_MAX, max(METADATA_CACHE_MIN, memory_limit_bytes // METADATA_CACHE_SHARE)))


class PageReader:
    """Keyed, page-granular reads of one lake's files (thread-safe; one DataFusion session per lake)."""

    @staticmethod
    def supports(store: LakeFS) -> bool:
        """Whether the page path can read this lake: a plain local directory, or S3."""
        return store.native_local or (not store.local and store.protocol in ("s3", "s3a"))

    def __init__(self, store: LakeFS, storage_options: dict | None = None, cache_bytes: int = METADATA_CACHE_BYTES) -> None:
        self.store = store
        #: RAM DataFusion may keep for footers and page indexes (the owner counts it in its budget)
        self.cache_bytes = int(cache_bytes)
        self.storage_options = dict(storage_options if storage_options is not None else store.storage_options)
        self._lock = threading.Lock()
        self._ctx: Any = None
        self._tables: OrderedDict[str, tuple[str, list[str] | None, list[str]]] = OrderedDict()
        self._count = 0
        #: the first reader of rows whose positions are known: 3/4 of the cache (its layouts: a get of
        #: an 8 GB lake touches ~100 files, and a layout read again costs a footer read); DataFusion,
        #: which reads only the files it leaves, the rest
        self.rows = RowPages(store, self.cache_bytes * 3 // 4)

    def _url(self, rel: str) -> str:
        return self.store.abs(rel) if self.store.local else f"s3://{self.store.abs(rel)}"

    def _context(self) -> Any:
        if self._ctx is None:
            from datafusion import SessionConfig, SessionContext

            cfg = (SessionConfig()
                   .set("datafusion.execution.parquet.pushdown_filters", "true")
                   .set("datafusion.execution.parquet.reorder_filters", "true")
                   .set("datafusion.execution.parquet.schema_force_view_types", "false")
                   .set("datafusion.execution.parquet.enable_page_index", "true")
                   # lake files carry no bloom filters: asking for them cost ~0.3 ms a file
                   .set("datafusion.execution.parquet.bloom_filter_on_read", "false")
                   # no planner statistics: one scan per file needs none, and they are a cache of their own
                   .set("datafusion.execution.collect_statistics", "false")
                   # one read for the footer and page index of a 32 MiB file, not its last 512 KiB
                   .set("datafusion.execution.parquet.metadata_size_hint", str(METADATA_HINT))
                   # one partition, small batches: a keyed take needs no parallel scan, and each partition
                   # holds its own decode buffers (RssAnon the RAM budget pays for)
                   .with_target_partitions(1)
                   .with_batch_size(1024))
            ctx = SessionContext(cfg)
            ctx.sql(f"SET datafusion.runtime.metadata_cache_limit = '{max(1, (self.cache_bytes - self.rows.cache_bytes) >> 10)}K'").collect()
            if not self.store.local:
                from datafusion.object_store import AmazonS3

                opts = s3_settings(self.storage_options)
                endpoint = opts.get("endpoint")
                bucket = self.store.root.split("/", 1)[0]
                s3 = AmazonS3(bucket_name=bucket, region=opts.get("region") or "us-east-1",
                              access_key_id=opts.get("access_key"), secret_access_key=opts.get("secret_key"),
                              session_token=opts.get("session_token"), endpoint=endpoint,
                              allow_http=bool(endpoint and str(endpoint).startswith("http://")))
                ctx.register_object_store("s3://", s3, bucket)
            self._ctx = ctx
        return self._ctx

    def _table(self, entry: dict) -> tuple[str, list[str] | None, list[str]]:
        """(table name, the columns its digests cover or None, the file's columns) of a registered file."""
        rel = entry["path"]
        with self._lock:
            got = self._tables.get(rel)
            if got is not None:
                self._tables.move_to_end(rel)
                return got
            with native_call("starting the page reader"):
                ctx = self._context()
            self._count += 1
            name = f"f{self._count}"
        with native_call("reading a lake file's footer"):
            ctx.register_parquet(name, self._url(rel))
            schema = ctx.table(name).schema()
        names = [n for n in schema.names if n != HASH_COLUMN]
        hashed = file_digest_columns(schema)
        got = (name, hashed, names)
        with self._lock:
            self._tables[rel] = got
            while len(self._tables) > MAX_TABLES:
                _, (old, _h, _n) = self._tables.popitem(last=False)
                with native_call("forgetting a lake file"):
                    ctx.deregister_table(old)
        return got

    def prepare(self, entries: list[dict]) -> None:
        """Register the files not registered yet, ``PREPARE_THREADS`` at a time: each costs a footer
        read (on S3 a request or two), and a first get touching tens of files paid them one by one.
        Errors are left for the caller's own ``hashed``/``take`` of that file to report. The row
        reader's layouts are read first; only files it cannot read are registered with DataFusion."""
        self.rows.prepare(entries)
        entries = [e for e in entries if not self._by_rows(e)]
        with self._lock:
            todo = [e for e in entries if e["path"] not in self._tables]
        prefetch(todo, self._table, PREPARE_THREADS, "lakebuffer-footers", (Exception,))

    def read_ahead(self, entries: list[dict], stop: Callable[[], bool], decode: bool = False) -> int:
        """Read the row reader's layouts of ``entries`` before any take asks (``RowPages.read_ahead``)."""
        return self.rows.read_ahead(entries, stop=stop, decode=decode)

    def _by_rows(self, entry: dict) -> bool:
        try:
            return self.rows.layout(entry).hashed is not None
        except Unreadable:
            return False

    def forget(self, rel: str) -> None:
        """A file replaced or removed: drop its registration (and cached footer)."""
        self.rows.forget(rel)
        with self._lock:
            got = self._tables.pop(rel, None)
            if got is not None and self._ctx is not None:
                with native_call("forgetting a lake file"):
                    self._ctx.deregister_table(got[0])

    def hashed(self, entry: dict) -> bool:
        """Whether the file carries ``_lb_hash`` (else: read it the older verified way); from the row
        reader's layout when it reads the file, else DataFusion's registration (which names errors)."""
        return self._by_rows(entry) or self._table(entry)[1] is not None

    def _frame(self, entry: dict, keys: list[str], columns: list[str]) -> tuple[Any, list[str], list[str]]:
        """(DataFusion frame of the rows of ``keys`` with the asked columns the file has, + ``key`` and
        ``_lb_hash``; those columns; the columns the digests cover)."""
        from datafusion import col, lit
        from datafusion import functions as F

        name, hashed, names = self._table(entry)
        assert hashed is not None, "take of a file without digests"
        cols = [c for c in dict.fromkeys(["key", *columns]) if c in names]
        df = (self._context().table(name)
              .filter(F.in_list(col("key"), [lit(k) for k in dict.fromkeys(keys)]))
              .select(*[col(_quote(c)) for c in [*cols, HASH_COLUMN]]))
        return df, cols, hashed

    def _undecodable(self, entry: dict, e: BaseException) -> LakeBufferError:
        """What a failed DataFusion read means: the storage did not answer (``LakeError``), or the
        file's bytes do not decode (``CorruptionError``), naming the file either way."""
        url = self.store.url_of(entry["path"])
        if storage_failed(e):
            return LakeError(f"reading lake file {url} failed: the lake's storage did not answer ({e}); "
                             "retry once it is reachable")
        return CorruptionError(f"lake file {url} cannot be decoded ({e}); restore it from a copy of the lake "
                               "(`lakebuffer fsck` lists every damaged file)")

    def _checked(self, entry: dict, got: pa.Table, keys: list[str], cols: list[str], hashed: list[str]) -> pa.Table:
        """``got`` verified against its digests and put in the order of ``keys``."""
        url = self.store.url_of(entry["path"])
        missing = [c for c in cols if c not in hashed]
        if missing:
            raise CorruptionError(f"lake file {url}: its row digests do not cover columns {missing}; "
                                  "restore it from a copy of the lake")
        bad = mismatches(got, cols, hashed)
        if len(bad):
            raise CorruptionError(f"lake file {url}: {len(bad)} row(s) fail their content digest (key "
                                  f"{got.column('key')[int(bad[0])].as_py()!r}); nothing was returned from it. "
                                  "Restore the file from a copy of the lake (`lakebuffer fsck` lists every damaged file)")
        at = pc.index_in(pa.array(keys, pa.string()), value_set=got.column("key").cast(pa.string()))
        if at.null_count:
            lost = np.flatnonzero(~at.is_valid().to_numpy(zero_copy_only=False)).tolist()
            raise MissingRows([keys[i] for i in lost])
        return got.select(cols).take(at)

    def take(self, entry: dict, keys: list[str], columns: list[str]) -> pa.Table:
        """The rows of ``keys`` (in that order) with those of ``columns`` the file has, plus ``key``,
        each checked against its digests; ``MissingRows`` for keys the file does not hold."""
        try:
            # every DataFusion call inside the bracket, building the plan too: it blocks on its runtime
            # with the GIL released, and a thread returning from there after exit began aborts the process
            with native_call("reading lake pages"):
                df, cols, hashed = self._frame(entry, keys, columns)
                got = df.to_arrow_table()
        except Exception as e:  # noqa: BLE001 - a page that does not decode (DataFusion raises plain Exceptions)
            raise self._undecodable(entry, e) from e
        return self._checked(entry, got, keys, cols, hashed)

    def take_grouped(self, items: list[tuple[dict, list[str]]], columns: list[str],
                     rows: list[np.ndarray] | None = None
                     ) -> tuple[list[tuple[list[int], pa.Table, np.ndarray]], dict[int, Exception]]:
        """``take`` of several files in one DataFusion query per set of columns (one SQL text: building
        the plan per key in Python cost more than the read), checked in one pass: ``([(item numbers,
        rows read, row of each asked key: each item's keys in order, items in order)], {item number:
        the error ``take`` would raise for that file})``. The rows are left as DataFusion returned them
        (a ``take`` of list columns over its many small chunks cost more than the checks): the caller
        gathers them. Callers raise for any error; rows of failed items are not to be used.

        With ``rows`` (each item's keys' row numbers in its file), items the row reader serves are
        read by it (``lake/rowpages.py``); the others, and any it could not verify, by DataFusion."""
        fast: list[tuple[list[int], pa.Table, np.ndarray]] = []
        damaged: dict[int, Exception] = {}
        if rows is not None:
            fast, left, damaged = self._by_row_reader(items, columns, rows)
            if not left:
                return fast, damaged
        else:
            left = list(range(len(items)))
        groups_out, errors = self._take_datafusion([items[i] for i in left], columns)
        for members, table, pos in groups_out:
            fast.append(([left[i] for i in members], table, pos))
        return fast, {**damaged, **{left[i]: e for i, e in errors.items()}}

    def _by_row_reader(self, items: list[tuple[dict, list[str]]], columns: list[str], rows: list[np.ndarray]
                       ) -> tuple[list[tuple[list[int], pa.Table, np.ndarray]], list[int], dict[int, Exception]]:
        """(groups the row reader read: one per set of columns, items it left to DataFusion, items whose
        pages fail their CRC: damaged, with the error, not read again by a reader that checks no CRC)."""
        groups, errors = self.rows.take_grouped([(e, k, rows[i]) for i, (e, k) in enumerate(items)], columns)
        damaged: dict[int, Exception] = {i: e for i, e in errors.items() if isinstance(e, PageDamaged)}
        left = sorted(i for i in errors if i not in damaged)
        out = []
        for members, table, hashed in groups:
            # one digest pass over every file's rows; a file with a failing row goes to DataFusion
            cols = [c for c in table.column_names if c != HASH_COLUMN]
            bad = mismatches(table, cols, hashed)
            if len(bad):
                ends = np.cumsum([len(items[i][1]) for i in members])
                failed = set(np.searchsorted(ends, bad, side="right").tolist())
                left.extend(members[j] for j in sorted(failed))
                keep = np.concatenate([np.arange(a, b) for j, (a, b) in enumerate(zip(np.concatenate([[0], ends[:-1]]), ends))
                                       if j not in failed] or [np.zeros(0, np.int64)])
                members = [m for j, m in enumerate(members) if j not in failed]
                if not members:
                    continue
                table = table.take(pa.array(keep))
            out.append((members, table.select(cols), np.arange(len(table), dtype=np.int64)))
        self.rows.count(sum(len(t) for _m, t, _p in out), len(left))
        return out, sorted(left), damaged

    def _take_datafusion(self, items: list[tuple[dict, list[str]]], columns: list[str]
                         ) -> tuple[list[tuple[list[int], pa.Table, np.ndarray]], dict[int, Exception]]:
        """``take_grouped`` by DataFusion queries."""
        groups: dict[tuple, list[int]] = {}
        tables: list[tuple[str, list[str], list[str]]] = []
        out: list[tuple[list[int], pa.Table, np.ndarray]] = []
        errors: dict[int, Exception] = {}
        with native_call("planning a read of lake pages"):  # see ``take``
            for i, (entry, _keys) in enumerate(items):
                try:  # registered here when the row reader served it before (its footer is read now)
                    name, hashed, names = self._table(entry)
                except Exception as e:  # noqa: BLE001 - DataFusion raises plain Exceptions
                    errors[i] = self._undecodable(entry, e)
                    tables.append(("", [], []))
                    continue
                assert hashed is not None, "take of a file without digests"
                cols = [c for c in dict.fromkeys(["key", *columns]) if c in names]
                tables.append((name, cols, hashed))
                groups.setdefault((tuple(cols), tuple(hashed)), []).append(i)
        for (cols_t, hashed_t), members in groups.items():
            cols, hashed = list(cols_t), list(hashed_t)
            select = ", ".join(_quote(c) for c in [*cols, HASH_COLUMN])
            sql = " UNION ALL ".join(
                f"SELECT {i} AS {FILE_COLUMN}, {select} FROM {tables[i][0]} WHERE \"key\" IN "
                f"({', '.join(_literal(k) for k in dict.fromkeys(items[i][1]))})" for i in members)
            try:
                with native_call("reading lake pages"):
                    got = self._context().sql(sql).to_arrow_table()
            except Exception:  # noqa: BLE001 - which file? read each alone to name it
                for i in members:
                    try:
                        t = self.take(items[i][0], items[i][1], columns)
                        out.append(([i], t, np.arange(len(t), dtype=np.int64)))
                    except Exception as e:  # noqa: BLE001 - handed to the caller per file
                        errors[i] = e
                continue
            out.append(self._checked_many(items, members, got, cols, hashed, errors))
        return out, errors

    def _checked_many(self, items: list[tuple[dict, list[str]]], members: list[int], got: pa.Table,
                      cols: list[str], hashed: list[str], errors: dict[int, Exception]
                      ) -> tuple[list[int], pa.Table, np.ndarray]:
        """One query's rows verified against their digests in one pass and put in the order asked
        (``_checked`` of each file, vectorised); failures go to ``errors`` per file."""
        fid = got.column(FILE_COLUMN).to_numpy()
        bad = mismatches(got, cols, hashed)
        for j in np.unique(fid[bad]).tolist():
            rows = bad[fid[bad] == j]
            url = self.store.url_of(items[j][0]["path"])
            errors[j] = CorruptionError(f"lake file {url}: {len(rows)} row(s) fail their content digest (key "
                                        f"{got.column('key')[int(rows[0])].as_py()!r}); nothing was returned from it. "
                                        "Restore the file from a copy of the lake (`lakebuffer fsck` lists every "
                                        "damaged file)")
        asked = [k for i in members for k in items[i][1]]
        asked_fid = np.repeat(np.array(members, np.int64), [len(items[i][1]) for i in members])
        at = pc.index_in(pa.array(asked, pa.string()), value_set=got.column("key").cast(pa.string()))
        pos = at.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        ok = at.is_valid().to_numpy(zero_copy_only=False)
        if len(got):
            ok &= fid[pos] == asked_fid  # a key is asked of one file: a row of another is not it
        if not ok.all():
            for j in np.unique(asked_fid[~ok]).tolist():
                if j not in errors:
                    errors[j] = MissingRows([asked[n] for n in np.flatnonzero(~ok & (asked_fid == j)).tolist()])
        return members, got.select(cols), pos

    def take_many(self, items: list[tuple[dict, list[str]]], columns: list[str]) -> list[pa.Table | Exception]:
        """``take`` of several files (see ``take_grouped``); per item the table, or the error ``take``
        would raise for that file."""
        groups, errors = self.take_grouped(items, columns)
        out: list[pa.Table | Exception] = [Exception("not read")] * len(items)
        for members, table, pos in groups:
            at = 0
            for i in members:
                n = len(items[i][1])
                out[i] = errors.get(i) or table.take(pa.array(pos[at:at + n]))
                at += n
        return out
