"""Rows of a lake file by position, read page by page: the cold ``get`` path's first reader.

Why: the key index holds each cold key's (file, row). With the file's offset index (which the writer
stores: ``write_page_index``) the page holding a row of a column is known without reading anything
else, so a get reads, per asked column, exactly the pages of its rows (one ranged read each, adjacent
ones merged) and decodes them (``lake/pagedecode.py``; where a file's pages are: ``lake/pagelayout.py``).
DataFusion reads the same pages, but plans and opens a scan per file (~0.6 ms a file) and first decodes
the ``key`` pages to find the rows (BENCHMARKS.md, "#23"): a 256-key get touches ~100 files of an 8 GB
lake.

What it verifies: the CRC of every page it reads (the writer writes page checksums), and each row's
content digest (``_lb_hash``, ``lake/rowhash.py``) against the asked key and every returned column: a
row is returned only when both hold. Where the file stores ``_lb_hash`` uncompressed and PLAIN (the
writer does, ``parquet_options``), a row's digest bytes are read alone, at the offset the offset index
gives (a page's values are its last bytes), not its page: the digests are what is checked, so a
damaged one fails its row as a damaged page would, and nothing returned goes unverified.

It does not diagnose: a file it cannot read or decode, a row that fails its digest, and column chunks
it does not decode (dictionary pages, nesting deeper than one list level, data pages v2, strings) make
the caller read that file the older way (``PageReader``'s DataFusion query), which reports exactly what
is wrong. A page that fails its CRC (or is cut short) is ``PageDamaged``: the file is damaged, and the
caller says so without asking DataFusion, which checks no page CRC and could return a row the damage
missed.
"""


from __future__ import annotations

import bisect
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa

from ..pagecache import NOWAIT, in_page_cache, will_need
from . import runtime
from .fs import LakeFS
from .pagedecode import Unreadable
from .pagelayout import TAIL_BYTES, Layout, parse_layout
from .prefetch import prefetch
from .rowhash import HASH_COLUMN, mismatches
from .rowplan import RAW, TakePlan, direct_starts, finish_together, page_bodies

#: two page ranges of one file this close are read as one (a gap costs less than a request)
MERGE_GAP = 16 * 1024
#: ... on an object store, where a request costs what ~1 MiB of transfer does (object_store's default)
OBJECT_MERGE_GAP = 1 << 20
#: open object-store files kept by path (pyarrow's open is a HEAD request; lake files never change
#: under their name, which holds their sha256): the least recently used are dropped first
OBJECT_HANDLES = 256
LAYOUT_THREADS = 8  # files whose footers are read at once
#: layouts read ahead at open (``read_ahead``) fill at most this share of the cache, this many files a step
READ_AHEAD_SHARE = 0.75
READ_AHEAD_FILES = 32
#: compressed page bytes one part of a take reads and decompresses at once (RAM: ~3x this while it runs)
PART_BYTES = 16 << 20
FETCH_THREADS = 8  # files whose pages are read at once (an object store's, or local ones not in the page cache)
#: local files not in the page cache: every page range of a take is announced to the kernel first
#: (``POSIX_FADV_WILLNEED``) and the take goes on in parts of about this many bytes of pages, each
#: decoded while the kernel reads the next ones (the disk and the CPU overlap, no thread in between)
OVERLAP_BYTES = 2 << 20
ANNOUNCE_AHEAD = 64 << 20  # ... announced at most this many bytes of pages ahead of the part being read


def merged_ranges(spans: Iterable[tuple[int, int]], gap: int) -> list[list[int]]:
    """``(offset, size)`` spans as ``[start, end)`` ranges in file order, those closer than ``gap`` joined:
    what one read (one request, on an object store) covers."""
    merged: list[list[int]] = []
    for off, size in sorted(spans):
        if merged and off <= merged[-1][1] + gap:
            merged[-1][1] = max(merged[-1][1], off + size)
        else:
            merged.append([off, off + size])
    return merged


class WouldBlock(Exception):
    """A read ``RWF_NOWAIT`` refused: the bytes are not in the page cache."""


def _read_cached(fd: int, a: int, b: int) -> bytearray:
    """Bytes ``a:b`` of ``fd`` if the page cache holds all of them, else ``WouldBlock``."""
    buf = bytearray(b - a)
    try:
        n = os.preadv(fd, [buf], a, NOWAIT)
    except OSError:  # EAGAIN (BlockingIOError), or a filesystem without RWF_NOWAIT: read it the usual way
        raise WouldBlock from None
    if n != b - a:
        if n < b - a and os.fstat(fd).st_size >= b:
            raise WouldBlock  # part of it cached
        return buf[:n]
    return buf


class RowPages:
    """Rows of one lake's files by (file, row), page by page, every row checked (thread-safe)."""

    def __init__(self, store: LakeFS, cache_bytes: int) -> None:
        self.store = store
        self.cache_bytes = int(cache_bytes)
        self._lock = threading.Lock()
        self._layouts: OrderedDict[str, Layout] = OrderedDict()
        self._loading: dict[str, threading.Event] = {}  # path -> set when the thread reading its layout is done
        self._handles: OrderedDict[str, Any] = OrderedDict()  # object store: path -> open input file
        self._held = 0
        #: rows this reader returned, and files' reads it left to the caller (it could not verify them)
        self.counts = {"rows": 0, "left": 0}

    # file access
    def _read_ranges(self, rel: str, ranges: list[tuple[int, int]], cached_only: bool = False) -> list[Any]:
        """The bytes of each (start, end) range of the file. ``cached_only`` (local files): only what
        the page cache holds, else ``WouldBlock`` (``RWF_NOWAIT``: nothing waits for the disk)."""
        path = self.store.abs(rel)
        if self.store.native_local:
            fd = os.open(path, os.O_RDONLY)
            try:
                out: list[Any] = []
                for a, b in ranges:
                    if cached_only:
                        got = _read_cached(fd, a, b)
                    else:
                        got = os.pread(fd, b - a, a)
                    if len(got) != b - a:
                        raise Unreadable("file shorter than its footer says")
                    out.append(got)
                return out
            finally:
                os.close(fd)
        # an object store: Arrow's native filesystem (no Python filesystem under the read: exit safety,
        # ``lake/runtime.py``), one open per file and a read per range
        from .runtime import native_call

        out = []
        with native_call("reading lake pages"):
            f = self._object_file(path)
            for a, b in ranges:
                got = f.read_at(b - a, a)
                if len(got) != b - a:
                    raise Unreadable("file shorter than its footer says")
                out.append(got)
        return out

    def _object_file(self, path: str) -> Any:
        """An open object-store file, kept (``OBJECT_HANDLES``): each open costs a HEAD request.
        ``read_at`` is positional, so threads share one; a dropped one closes when its last reader ends."""
        with self._lock:
            f = self._handles.get(path)
            if f is not None:
                self._handles.move_to_end(path)
                return f
        f = self.store.pafs.open_input_file(path)
        if OBJECT_HANDLES:
            with self._lock:
                self._handles[path] = f
                while len(self._handles) > OBJECT_HANDLES:
                    self._handles.popitem(last=False)
        return f

    def layout(self, entry: dict) -> Layout:
        """The file's layout (read once, kept within ``cache_bytes``); ``Unreadable`` if it cannot be."""
        rel = entry["path"]
        with self._lock:
            got = self._held_layout(rel)
            if got is not None:
                return got
            busy = self._loading.get(rel)
            if busy is None:
                done = self._loading[rel] = threading.Event()
        if busy is not None:  # another thread (a take, the read-ahead) is reading it: waited for, not read twice
            busy.wait()
            with self._lock:
                got = self._held_layout(rel)
            # (None: it failed there, or left the cache at once: read it here)
            return got if got is not None else self._read_layout(entry, rel)
        try:
            return self._read_layout(entry, rel)
        finally:
            with self._lock:
                del self._loading[rel]
            done.set()

    def _held_layout(self, rel: str) -> Layout | None:
        """The cached layout (marked recently used), or None; the caller holds the lock."""
        got = self._layouts.get(rel)
        if got is not None:
            self._layouts.move_to_end(rel)
        return got

    def _read_layout(self, entry: dict, rel: str) -> Layout:
        size = int(entry.get("bytes") or 0)
        try:
            if size <= 0:
                size = int(self.store.fs.size(self.store.abs(rel)))
            start = max(0, size - TAIL_BYTES)
            tail = self._read_ranges(rel, [(start, size)])[0]
            got = parse_layout(tail, size, lambda a, b: self._read_ranges(rel, [(a, b)])[0])
        except Unreadable:
            raise
        except Exception as e:  # noqa: BLE001 - missing, damaged, unreachable: the older path says which
            raise Unreadable(f"{type(e).__name__}: {e}") from e
        with self._lock:
            if rel not in self._layouts:
                self._layouts[rel] = got
                self._held += got.nbytes
                while self._held > self.cache_bytes and len(self._layouts) > 1:
                    _, old = self._layouts.popitem(last=False)
                    self._held -= old.nbytes
        return got

    def prepare(self, entries: list[dict]) -> None:
        """Read the layouts not held yet, ``LAYOUT_THREADS`` at a time (errors are left for ``take``)."""
        with self._lock:
            todo = [e for e in entries if e["path"] not in self._layouts]
        prefetch(todo, self.layout, LAYOUT_THREADS, "lakebuffer-layouts", (Unreadable,))

    def read_ahead(self, entries: list[dict], share: float = READ_AHEAD_SHARE,
                   stop: Callable[[], bool] = lambda: False, decode: bool = False) -> int:
        """Read the layouts of ``entries`` (in that order) ahead of any take, until they fill ``share``
        of the cache; how many were read. Why: a resumed or reopened buffer's first cold call read
        ~70 footers and offset indexes from disk (8 GB lake: 63 of its 128 ms). ``decode``: their
        offset indexes parsed too (not in the background: that took the GIL from the first take)."""
        done = 0
        for a in range(0, len(entries), READ_AHEAD_FILES):
            held = self.held_bytes()
            if held >= share * self.cache_bytes or stop():
                break
            chunk = entries[a:a + READ_AHEAD_FILES]
            if len(chunk) == 1:  # (``prepare`` leaves a single file to its take)
                try:
                    self.layout(chunk[0])
                except Unreadable:
                    pass
            else:
                self.prepare(chunk)
            if decode:
                for entry in chunk:
                    with self._lock:
                        lay = self._layouts.get(entry["path"])
                    if lay is not None:
                        lay.decode_pages()
            done += len(chunk)
            if self.held_bytes() == held:  # nothing of a whole step could be read (the lake is down?): stop
                break
        return done

    def forget(self, rel: str) -> None:
        with self._lock:
            self._handles.pop(self.store.abs(rel), None)
            old = self._layouts.pop(rel, None)
            if old is not None:
                self._held -= old.nbytes

    def held_bytes(self) -> int:
        with self._lock:
            return self._held

    def serves(self, entry: dict, columns: list[str]) -> bool:
        """Whether ``take`` can read ``columns`` of this file (its layout read if need be)."""
        try:
            lay = self.layout(entry)
        except Unreadable:
            return False
        if lay.hashed is None:
            return False
        want = [c for c in columns if c != "key" and c in lay.names]
        return all(c in g for g in lay.chunks for c in [*want, HASH_COLUMN])

    def take(self, entry: dict, keys: list[str], rows: np.ndarray, columns: list[str], check: bool = True) -> pa.Table:
        """Rows ``rows`` of the file, which hold ``keys``: ``key`` and those of ``columns`` the file
        has, each row checked against its digests; ``Unreadable`` when any of that does not hold.
        ``check=False``: the rows with their ``_lb_hash``, unchecked (the caller checks many files'
        rows at once with ``mismatches`` against ``self.layout(entry).hashed``)."""
        got = self.take_many([(entry, keys, rows)], columns)[0]
        if isinstance(got, Unreadable):
            raise got
        if not check:
            return got
        lay = self.layout(entry)
        cols = [c for c in got.column_names if c != HASH_COLUMN]
        if len(mismatches(got, cols, lay.hashed or [])):
            raise Unreadable("a row fails its digest")
        self.count(len(got), 0)
        return got.select(cols)

    def take_many(self, items: list[tuple[dict, list[str], np.ndarray]], columns: list[str]
                  ) -> list[pa.Table | Unreadable]:
        """``take(..., check=False)`` of several files: per item its rows with ``_lb_hash`` (unchecked),
        or why it cannot be served."""
        plans, errors = self._plans(items, columns)
        out: list[pa.Table | Unreadable] = [Unreadable("not read")] * len(items)
        for part in self._read_parts(items, plans, errors):
            bodies = self._bodies_of(items, plans, part, errors)
            for i in part:
                if i not in errors:
                    try:
                        out[i] = plans[i].finish(bodies.get(i, {}), items[i][1])  # type: ignore[union-attr]
                    except Unreadable as e:
                        errors[i] = e
        for i, e in errors.items():
            out[i] = e
        return out

    def take_grouped(self, items: list[tuple[dict, list[str], np.ndarray]], columns: list[str]
                     ) -> tuple[list[tuple[list[int], pa.Table, list[str]]], dict[int, Unreadable]]:
        """``take_many`` with the rows of all files that share columns, types and digest layout
        assembled at once (a get touches ~100 files of an 8 GB lake: per-file assembly cost more than
        decoding): ``([(items, their rows in item order with _lb_hash (unchecked), the columns the
        digests cover)], {item: why it was not served})``. Files are read in parts of at most
        ``PART_BYTES`` of pages (memory: a part's pages are held compressed and decompressed at once)."""
        plans, errors = self._plans(items, columns)
        out: list[tuple[list[int], pa.Table, list[str]]] = []
        for part in self._read_parts(items, plans, errors):
            bodies = self._bodies_of(items, plans, part, errors)
            groups: dict[tuple, list[int]] = {}
            for i in part:
                plan = plans[i]
                if plan is not None and i not in errors:
                    sig = (tuple(plan.read), tuple(plan.lay.hashed or ()), plan.direct,
                           tuple(plan.lay.leaves[c] for c in plan.read))
                    groups.setdefault(sig, []).append(i)
            for members in groups.values():
                try:
                    table = finish_together([plans[i] for i in members], [bodies.get(i, {}) for i in members],  # type: ignore[misc]
                                             [items[i][1] for i in members])
                    out.append((members, table, list(plans[members[0]].lay.hashed or [])))  # type: ignore[union-attr]
                    continue
                except Unreadable:
                    pass
                for i in members:  # a page of one of them does not decode: which? one by one
                    try:
                        t = plans[i].finish(bodies.get(i, {}), items[i][1])  # type: ignore[union-attr]
                        out.append(([i], t, list(plans[i].lay.hashed or [])))  # type: ignore[union-attr]
                    except Unreadable as e:
                        errors[i] = e
            del bodies
        return out, errors

    def _plans(self, items: list[tuple[dict, list[str], np.ndarray]], columns: list[str]
               ) -> tuple[list[TakePlan | None], dict[int, Unreadable]]:
        errors: dict[int, Unreadable] = {}
        plans: list[TakePlan | None] = []
        for i, (entry, keys, rows) in enumerate(items):
            try:
                plans.append(self._plan(entry, keys, rows, columns))
            except Unreadable as e:
                plans.append(None)
                errors[i] = e
        return plans, errors

    @staticmethod
    def _parts(plans: list[TakePlan | None], errors: dict[int, Unreadable], limit: int | None = None) -> list[list[int]]:
        """The planned items in runs of at most ``limit`` (``PART_BYTES``) bytes of pages (one item may
        exceed it alone)."""
        limit = PART_BYTES if limit is None else limit
        parts: list[list[int]] = [[]]
        held = 0
        for i, plan in enumerate(plans):
            if plan is None or i in errors:
                continue
            size = sum(n for _o, n in plan.wanted)
            if parts[-1] and held + size > limit:
                parts.append([])
                held = 0
            parts[-1].append(i)
            held += size
        return [p for p in parts if p]

    def _read_parts(self, items: list[tuple[dict, list[str], np.ndarray]], plans: list[TakePlan | None],
                    errors: dict[int, Unreadable]) -> Iterator[list[int]]:
        """The parts a take reads one after another: of ``PART_BYTES`` (memory), or, when local files'
        pages are not in the page cache, of ``OVERLAP_BYTES``, each announced ``ANNOUNCE_AHEAD`` bytes
        before it is read (a huge take does not ask the page cache for all of itself at once)."""
        parts = self._parts(plans, errors)
        if not (OVERLAP_BYTES and self.store.native_local and NOWAIT) or sum(map(len, parts)) < 2:
            yield from parts
            return
        first = next(i for p in parts for i in p)
        if self._in_page_cache(items[first][0], plans[first]):  # type: ignore[arg-type]
            yield from parts  # (one probe: a take's files are cached alike, or the disk serves them)
            return
        small = self._parts(plans, errors, min(OVERLAP_BYTES, PART_BYTES))
        ahead = max(1, ANNOUNCE_AHEAD // max(1, min(OVERLAP_BYTES, PART_BYTES)))
        told = 0
        for k, part in enumerate(small):
            while told < min(len(small), k + ahead):
                for i in small[told]:
                    self._announce(items[i][0], plans[i])  # type: ignore[arg-type]
                told += 1
            yield part

    def _bodies_of(self, items: list[tuple[dict, list[str], np.ndarray]], plans: list[TakePlan | None],
                   part: list[int], errors: dict[int, Unreadable]) -> dict[int, dict]:
        """Read and decompress the pages of the items of ``part``: {item: {page: (header, body)}}.
        Pages are read file by file (on an object store ``FETCH_THREADS`` files at once), then
        CRC-checked and decompressed on ``BODY_THREADS`` threads (native work, without the GIL)."""
        def fetch(i: int, cached_only: bool = False) -> list[memoryview] | Unreadable | None:
            try:
                return self._fetch(items[i][0], plans[i], cached_only)  # type: ignore[arg-type]
            except WouldBlock:
                return None
            except Unreadable as e:
                return e

        # a local file whose pages are in the page cache is read at once, in this thread (a thread pool
        # costs more than such reads); the files that would wait for the disk, or an object store's,
        # are read FETCH_THREADS at a time so their waits overlap (measured: benchmarks/notes/coldget_disk.md)
        raws: list[list[memoryview] | Unreadable | None] = [None] * len(part)
        if self.store.native_local and NOWAIT:
            raws = [fetch(i, cached_only=True) for i in part]
        waiting = [k for k, r in enumerate(raws) if r is None]
        if len(waiting) < 2:
            for k in waiting:
                raws[k] = fetch(part[k])
        else:
            with ThreadPoolExecutor(min(FETCH_THREADS, len(waiting)), thread_name_prefix="lakebuffer-pages") as pool:
                for k, got in zip(waiting, runtime.pool_map(pool, fetch, [part[k] for k in waiting])):
                    raws[k] = got
        jobs = []
        for i, raw in zip(part, raws):
            if isinstance(raw, Unreadable):
                errors[i] = raw
            else:
                jobs.extend((i, n, r) for n, r in enumerate(raw))
        return page_bodies(jobs, plans)

    def _plan(self, entry: dict, keys: list[str], rows: np.ndarray, columns: list[str]) -> TakePlan:
        lay = self.layout(entry)
        if lay.hashed is None:
            raise Unreadable("no row digests")
        cols = [c for c in dict.fromkeys(["key", *columns]) if c == "key" or c in lay.names]
        read = [c for c in cols if c != "key"] + [HASH_COLUMN]
        rows = np.asarray(rows, np.int64)
        listed = rows.tolist()  # (a file holds a few of a get's rows: Python's min/max cost less here)
        if listed and (min(listed) < 0 or max(listed) >= lay.row_starts[-1]):
            raise Unreadable("row beyond the file")
        rg = lay.row_starts.searchsorted(rows, "right") - 1
        in_rg = rows - lay.row_starts[rg]
        plan = TakePlan(lay, cols, read)
        groups = sorted(set(rg.tolist()))
        direct = direct_starts(lay, groups)
        plan.direct = direct is not None
        # which page of each column holds each row; one read per distinct page (adjacent ones merged)
        for c in read:
            page_ids = np.empty(len(rows), np.int64)
            local = np.empty(len(rows), np.int64)
            for g in groups:
                ch = lay.chunks[g].get(c)
                if ch is None:
                    raise Unreadable(f"column {c} is not decoded here")
                sel = slice(None) if len(groups) == 1 else rg == g
                at_rows = in_rg[sel]
                first_rows, offsets, sizes = ch.pages()
                p = first_rows.searchsorted(at_rows, "right") - 1
                if c == HASH_COLUMN and direct is not None:  # each row's digest bytes alone
                    width = lay.leaves[c].width
                    at = (direct[g][p] + (at_rows - first_rows[p]) * width).tolist()
                    page_ids[sel] = plan.numbers([(a, width) for a in at], RAW)
                    local[sel] = 0
                    continue
                if ch.dictionary is None:
                    ids = plan.numbers(zip(offsets[p].tolist(), sizes[p].tolist()), ch.codec)
                else:
                    ids = [plan.page(span, ch.codec, ch.dictionary) for span in zip(offsets[p].tolist(), sizes[p].tolist())]
                page_ids[sel] = ids
                local[sel] = at_rows - first_rows[p]
            plan.rows[c] = (page_ids, local)
        return plan

    def _merged(self, plan: TakePlan) -> list[list[int]]:
        """The plan's page ranges in file order, those closer than the merge gap joined."""
        return merged_ranges(plan.wanted, MERGE_GAP if self.store.native_local else OBJECT_MERGE_GAP)

    def _in_page_cache(self, entry: dict, plan: TakePlan) -> bool:
        """Whether the first byte of the plan's first page is in the page cache (an unreadable file: as
        if it were; its read says what is wrong)."""
        try:
            fd = os.open(self.store.abs(entry["path"]), os.O_RDONLY)
        except OSError:
            return True
        try:
            return in_page_cache(fd, min(plan.wanted)[0])
        finally:
            os.close(fd)

    def _announce(self, entry: dict, plan: TakePlan) -> None:
        """Ask the kernel to start reading the plan's ranges now (a hint: errors are the read's to say)."""
        try:
            fd = os.open(self.store.abs(entry["path"]), os.O_RDONLY)
        except OSError:
            return
        try:
            will_need((fd, a, b - a) for a, b in self._merged(plan))
        finally:
            os.close(fd)

    def _fetch(self, entry: dict, plan: TakePlan, cached_only: bool = False) -> list[memoryview]:
        """The raw bytes of the plan's pages, in page-number order (adjacent ranges read as one);
        ``cached_only``: ``WouldBlock`` unless the page cache holds them all."""
        merged = self._merged(plan)
        try:
            blobs = self._read_ranges(entry["path"], [(a, b) for a, b in merged], cached_only)
        except (Unreadable, WouldBlock):
            raise
        except Exception as e:  # noqa: BLE001 - the older path says what it means
            raise Unreadable(f"{type(e).__name__}: {e}") from e
        starts = [a for a, _ in merged]
        views = [memoryview(b) for b in blobs]
        raw: list[memoryview] = [memoryview(b"")] * len(plan.wanted)
        for (off, size), n in plan.wanted.items():
            m = bisect.bisect_right(starts, off) - 1
            at = off - starts[m]
            raw[n] = views[m][at:at + size]
        return raw

    def count(self, rows: int, left: int) -> None:
        with self._lock:
            self.counts["rows"] += rows
            self.counts["left"] += left
