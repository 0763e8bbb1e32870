"""A cold take's plan of one lake file and the rows it assembles: which pages each asked row is in,
their bodies checked and decompressed, the rows rebuilt from them (``lake/rowpages.py`` reads the pages).

Why its own module: the reader decides how bytes arrive (page cache, disk parts, object-store ranges);
this part is the same for every source and is what the page benchmarks (``page_bodies.py``,
``digest_reads.py``) exercise alone.
"""

from __future__ import annotations

import bisect
import threading
from typing import Any

import numpy as np
import pyarrow as pa

from .pagedecode import Unreadable, assemble, decompress, dictionary_of, page_header, page_of, simple_list_rows
from .pagelayout import Layout
from .rowhash import HASH_COLUMN

#: threads that CRC-check and decompress the pages of one get (native code without the GIL)
BODY_THREADS = 2
#: the codec mark of a plan's "page" that is one row's digest bytes, read raw (no header, no CRC)
RAW = "raw"
#: longest page header a direct digest read accepts (a page header of a data page v1/v2 with CRC and
#: no statistics is ~20-40 bytes; more means the layout is not the one assumed: read the pages)
MAX_HEADER = 512


class TakePlan:
    """Which pages of one file a take reads, and how each asked row is found in them."""

    def __init__(self, lay: Layout, cols: list[str], read: list[str]) -> None:
        self.lay, self.cols, self.read = lay, cols, read
        self.wanted: dict[tuple[int, int], int] = {}  # (offset, size) -> page number
        self.codecs: dict[int, str | None] = {}
        self.dict_of: dict[int, int] = {}  # page number -> the page number of its chunk's dictionary
        self.rows: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # column -> (page of each row, row in it)
        self.direct = False  # each row's ``_lb_hash`` is read as its own bytes (``RAW`` spans)

    def numbers(self, spans: Any, codec: str | None) -> list[int]:
        """The page number of each (offset, size) span, new ones numbered in order (pages without a
        dictionary, and ``RAW`` digest spans: one call per column and row group)."""
        wanted, codecs = self.wanted, self.codecs
        out = []
        for span in spans:
            n = wanted.setdefault(span, len(wanted))
            codecs[n] = codec
            out.append(n)
        return out

    def page(self, span: tuple[int, int], codec: str | None, dictionary: tuple[int, int] | None) -> int:
        n = self.wanted.setdefault(span, len(self.wanted))
        self.codecs[n] = codec
        if dictionary is not None:
            a, b = dictionary
            d = self.dict_of[n] = self.wanted.setdefault((a, b - a), len(self.wanted))
            self.codecs[d] = codec
        return n

    def finish(self, bodies: dict[int, tuple[Any, np.ndarray] | Unreadable], keys: list[str]) -> pa.Table:
        """The rows (``key`` + columns + ``_lb_hash``, unchecked) from the pages' bodies."""
        return finish_together([self], [bodies], [keys])


def finish_together(plans: list[TakePlan], bodies: list[dict], keys: list[list[str]]) -> pa.Table:
    """``TakePlan.finish`` of several files' plans with the same columns and kinds, as one table: each
    column's pages decoded once and its rows assembled in one pass (items in order)."""
    base = np.cumsum([0] + [len(p.wanted) for p in plans])  # global page number = base[item] + page
    bases = base.tolist()  # (bisect on a list: numpy's searchsorted per page cost ~5 ms a get)

    def body(g: int) -> tuple[Any, np.ndarray]:
        i = bisect.bisect_right(bases, g) - 1
        got = bodies[i].get(g - bases[i])
        if got is None or isinstance(got, Unreadable):
            raise got or Unreadable("page not read")
        return got

    first = plans[0]
    arrays = {}
    for c in first.read:
        leaf = first.lay.leaves[c]
        page_ids = np.concatenate([p.rows[c][0] + base[i] for i, p in enumerate(plans)])
        if c == HASH_COLUMN and first.direct:
            arrays[c] = _raw_values(leaf.width, [body(g)[1] for g in page_ids.tolist()])
            continue
        local = np.concatenate([p.rows[c][1] for p in plans])
        uniq, inv = np.unique(page_ids, return_inverse=True)
        try:
            if leaf.is_list:  # token ids, log-probs: all pages at once (others: None, page by page below)
                got = simple_list_rows(leaf, [body(g) for g in uniq.tolist()], inv, local)
                if got is not None:
                    arrays[c] = got
                    continue
            dicts: dict[int, pa.Array] = {}
            pages = []
            for g in uniq.tolist():
                i = bisect.bisect_right(bases, g) - 1
                d = plans[i].dict_of.get(g - bases[i])
                if d is not None and d + bases[i] not in dicts:
                    dicts[d + bases[i]] = dictionary_of(*body(d + bases[i]))
                pages.append(page_of(*body(g), leaf, None if d is None else dicts[d + bases[i]]))
            sizes = np.array([len(pg.start) for pg in pages], np.int64)
            if (local >= sizes[inv]).any():
                raise Unreadable("row beyond its page")
            arrays[c] = assemble(leaf, pages, inv, local)
        except Unreadable:
            raise
        except Exception as e:  # noqa: BLE001 - bytes that do not decode
            raise Unreadable(f"column {c}: {type(e).__name__}: {e}") from e
    arrays["key"] = pa.array([k for ks in keys for k in ks], pa.string())
    return pa.table({c: arrays[c] for c in [*first.cols, HASH_COLUMN]})


def _raw_values(width: int, spans: list[memoryview]) -> pa.Array:
    """The ``fixed_size_binary(width)`` array of rows' raw value bytes, in order."""
    data = b"".join(spans)
    if len(data) != width * len(spans):
        raise Unreadable("digest bytes cut short")
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), len(spans), [None, pa.py_buffer(data)])


def direct_starts(lay: Layout, groups: list[int]) -> dict[int, np.ndarray] | None:
    """Per row group, where each ``_lb_hash`` page's values start, when the file stores them so that a
    row's digest is at a computed offset (uncompressed, PLAIN, required fixed-width values: a page is
    its header then rows x width bytes); else None (read the pages)."""
    leaf = lay.leaves.get(HASH_COLUMN)
    if leaf is None or leaf.field_optional or leaf.is_list or leaf.width <= 0:
        return None
    out = {}
    for g in groups:
        ch = lay.chunks[g].get(HASH_COLUMN)
        starts = None if ch is None else ch.plain_value_starts(
            int(lay.row_starts[g + 1] - lay.row_starts[g]), leaf.width, MAX_HEADER)
        if starts is None:
            return None
        out[g] = starts
    return out


def page_bodies(jobs: list[tuple[int, int, memoryview]], plans: list) -> dict[int, dict]:
    """(header, uncompressed body) of every (item, page number, raw bytes): {item: {page number:
    (header, body) or Unreadable}}. Headers and CRCs in this thread, then the compressed bodies decompressed on
    ``BODY_THREADS`` threads split by bytes, with nothing but the native call in their loop (a page's
    Python under the GIL between two threads' native calls cost more than it did alone:
    ``benchmarks/page_bodies.py``, 0.71x the time). The digest spans, ``RAW``, are passed through."""
    from .runtime import native_call

    out: dict[int, dict] = {i: {} for i, _n, _r in jobs}
    packed = []
    for i, n, raw in jobs:
        codec = plans[i].codecs[n]
        if codec == RAW:
            out[i][n] = (None, raw)
            continue
        try:
            ph, comp = page_header(raw)
        except Unreadable as e:
            out[i][n] = e
            continue
        except Exception as e:  # noqa: BLE001 - a header that does not decode
            out[i][n] = Unreadable(f"{type(e).__name__}: {e}")
            continue
        if codec is None:
            out[i][n] = (ph, comp)
        else:
            packed.append((i, n, ph, comp, codec))

    def run(part: list[tuple[int, int, Any, np.ndarray, str]]) -> None:
        with native_call("decompressing lake pages"):
            for i, n, ph, comp, codec in part:
                try:
                    out[i][n] = (ph, decompress(ph, comp, codec))
                except Exception as e:  # noqa: BLE001 - a body that does not decompress
                    out[i][n] = Unreadable(f"{type(e).__name__}: {e}")

    threads = BODY_THREADS
    if len(packed) < 8 or threads < 2:
        run(packed)
        return out
    # largest first, each to the least loaded thread
    parts: list[list[tuple[int, int, Any, np.ndarray, str]]] = [[] for _ in range(threads)]
    loads = [0] * threads
    for job in sorted(packed, key=lambda j: -len(j[3])):
        k = loads.index(min(loads))
        parts[k].append(job)
        loads[k] += len(job[3])
    workers = [threading.Thread(target=run, args=(p,), name="lakebuffer-pages", daemon=True) for p in parts[1:]]
    for w in workers:
        w.start()
    run(parts[0])
    for w in workers:
        w.join()
    return out
