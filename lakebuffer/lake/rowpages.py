"""Rows of a lake file by position, read page by page: the cold ``get`` path's first reader.

Why: the key index holds each cold key's (file, row). With the file's offset index (which the writer
stores: ``write_page_index``) the page holding a row of a column is known without reading anything
else, so a get reads, per asked column, exactly the pages of its rows (one ranged read each, adjacent
ones merged) and decodes them with fastparquet's level decoders and numpy. DataFusion reads the same
pages, but plans and opens a scan per file (~0.6 ms a file) and first decodes the ``key`` pages to find
the rows (BENCHMARKS.md, "#23"): a 256-key get touches ~100 files of an 8 GB lake.

What it verifies: the CRC of every page it reads (the writer writes page checksums), and each row's
content digest (``_lb_hash``, ``lake/rowhash.py``) against the asked key and every returned column: a
row is returned only when both hold. It does not diagnose: a file it cannot read or decode, a page
that fails its CRC, a row that fails its digest, and column chunks it does not decode (dictionary
pages, nesting deeper than one list level, data pages v2, strings) make the caller read that file the
older way (``PageReader``'s DataFusion query), which reports exactly what is wrong.
"""

from __future__ import annotations

import base64
import bisect
import os
import struct
import threading
import warnings
import zlib
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from .fs import LakeFS
from .rowhash import HASH_COLUMN, file_digest_columns, mismatches

#: bytes read from a file's end for its footer and page indexes in one request (more if they need it)
TAIL_BYTES = 64 * 1024
#: two page ranges of one file this close are read as one (a gap costs less than a request)
MERGE_GAP = 16 * 1024
LAYOUT_THREADS = 8  # files whose footers are read at once
#: compressed page bytes one part of a take reads and decompresses at once (RAM: ~3x this while it runs)
PART_BYTES = 16 << 20
INDEX_BYTES_FACTOR = 3  # RAM held per byte of a file's offset indexes (``parse_layout``), measured
FETCH_THREADS = 8  # files of an object store whose pages are read at once
_CODECS = {0: None, 1: "snappy", 2: "gzip", 4: "brotli", 6: "zstd"}
_PLAIN, _RLE = 0, 3
_REQUIRED, _OPTIONAL, _REPEATED = 0, 1, 2
_FIXED = {1: np.dtype("<i4"), 2: np.dtype("<i8"), 4: np.dtype("<f4"), 5: np.dtype("<f8")}  # INT32 INT64 FLOAT DOUBLE
_BOOLEAN, _BYTE_ARRAY, _FLBA = 0, 6, 7
_DICT_ENCODINGS = (2, 8)  # PLAIN_DICTIONARY, RLE_DICTIONARY


class Unreadable(Exception):
    """This reader does not serve the file (or these rows of it): the caller reads it the older way."""


@dataclass(frozen=True)
class Leaf:
    """How one top-level column is stored: its Arrow type and the Parquet levels of its leaf."""

    name: str
    arrow: pa.DataType  # the column's type (for a list: the list type)
    physical: int
    width: int  # FIXED_LEN_BYTE_ARRAY width
    field_optional: bool
    is_list: bool
    element_optional: bool
    max_def: int
    max_rep: int


class Chunk:
    """One column chunk: where its pages are (its offset index, parsed on first use: a get reads a few
    of a file's columns) and how they are compressed."""

    __slots__ = ("codec", "dictionary", "_index", "_pages")

    def __init__(self, codec: str | None, dictionary: tuple[int, int] | None, index: bytes) -> None:
        self.codec = codec
        self.dictionary = dictionary  # the byte range of its dictionary page (strings only)
        self._index = index
        self._pages: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def pages(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(first row within the row group, offset, size) of each page."""
        got = self._pages
        if got is None:
            # the raw field dicts (field 1: page_locations; a location's 1 offset, 2 size, 3 first row):
            # 3x faster than attribute access per page
            locs = _thrift(self._index, "OffsetIndex").contents[1]
            a = np.array([(d[1], d[2], d[3]) for d in locs], np.int64).reshape(-1, 3)
            got = self._pages = (a[:, 2].astype(np.int32), a[:, 0].copy(), a[:, 1].astype(np.int32))
        return got


@dataclass
class Layout:
    """What this reader needs of one file, read once from its footer and offset indexes."""

    hashed: list[str] | None  # the columns ``_lb_hash`` covers (None: the file has no digests)
    names: list[str]
    row_starts: np.ndarray  # first row of each row group (and the file's row count last)
    leaves: dict[str, Leaf]
    chunks: list[dict[str, Chunk]]  # per row group: column -> pages (only columns this reader decodes)
    nbytes: int = field(default=0)


_FROM_BUFFER: Any = None


def _thrift(data: bytes, name: str) -> Any:
    global _FROM_BUFFER
    if _FROM_BUFFER is None:
        with warnings.catch_warnings():  # fastparquet's import asks pandas for an option pandas 3 deprecates
            warnings.simplefilter("ignore")
            from fastparquet.cencoding import from_buffer
            from fastparquet.speedups import unpack_byte_array_arrow  # noqa: F401 - imported once, here
        _FROM_BUFFER = from_buffer
    return _FROM_BUFFER(data, name)


def _arrow_schema(fmd: Any) -> pa.Schema:
    for kv in fmd.key_value_metadata or []:
        key = kv.key.decode() if isinstance(kv.key, bytes) else kv.key
        if key == "ARROW:schema":
            raw = kv.value.encode() if isinstance(kv.value, str) else kv.value
            return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(raw)))
    raise Unreadable("no Arrow schema in the footer")


def _decodable(t: pa.DataType) -> bool:
    return (pa.types.is_integer(t) or pa.types.is_float32(t) or pa.types.is_float64(t) or pa.types.is_timestamp(t)
            or pa.types.is_date(t) or pa.types.is_duration(t) or pa.types.is_time(t))


def _leaves(fmd: Any, schema: pa.Schema) -> dict[str, Leaf]:
    """Top-level columns stored as a primitive leaf or a one-level list of one (the others: absent)."""
    out: dict[str, Leaf] = {}
    elems = fmd.schema
    i = 1
    while i < len(elems):
        top = elems[i]
        name = top.name.decode() if isinstance(top.name, bytes) else top.name
        kids = top.num_children or 0
        span = 1
        if kids:  # count the nodes under it (depth first)
            todo = kids
            while todo:
                todo += (elems[i + span].num_children or 0) - 1
                span += 1
        arrow = schema.field(name).type if name in schema.names else None
        opt = top.repetition_type == _OPTIONAL
        if arrow is not None and not kids and top.repetition_type != _REPEATED:
            if (_decodable(arrow) or pa.types.is_fixed_size_binary(arrow) or pa.types.is_boolean(arrow)
                    or ((pa.types.is_string(arrow) or pa.types.is_large_string(arrow)) and top.type == _BYTE_ARRAY)):
                out[name] = Leaf(name, arrow, top.type, top.type_length or 0, opt, False, False, int(opt), 0)
        elif (arrow is not None and kids == 1 and span == 3 and (pa.types.is_list(arrow) or pa.types.is_large_list(arrow))
              and _decodable(arrow.value_type) and top.repetition_type != _REPEATED):
            rep, leaf = elems[i + 1], elems[i + 2]
            if rep.repetition_type == _REPEATED and (rep.num_children or 0) == 1 and not leaf.num_children \
                    and leaf.repetition_type != _REPEATED:
                eopt = leaf.repetition_type == _OPTIONAL
                out[name] = Leaf(name, arrow, leaf.type, leaf.type_length or 0, opt, True, eopt, int(opt) + 1 + int(eopt), 1)
        i += span
    return out


def parse_layout(tail: bytes, size: int, read: Any) -> Layout:
    """A file's ``Layout`` from its last bytes (``tail``), reading more with ``read(start, end)``."""
    if len(tail) < 8 or tail[-4:] != b"PAR1":
        raise Unreadable("not a Parquet file")
    flen = struct.unpack("<i", tail[-8:-4])[0]
    if flen <= 0 or flen + 8 > size:
        raise Unreadable("bad footer length")
    if flen + 8 > len(tail):
        tail = read(size - flen - 8, size)
    fmd = _thrift(tail[len(tail) - 8 - flen:len(tail) - 8], "FileMetaData")
    schema = _arrow_schema(fmd)
    leaves = _leaves(fmd, schema)
    names = [n for n in schema.names if n != HASH_COLUMN]
    starts = [0]
    index_from = size
    for rg in fmd.row_groups:
        starts.append(starts[-1] + rg.num_rows)
        for c in rg.columns:
            if c.offset_index_offset is not None:
                index_from = min(index_from, c.offset_index_offset)
    base = size - len(tail)
    if index_from < base:
        tail, base = read(index_from, size), index_from
    chunks: list[dict[str, Chunk]] = []
    nbytes = 0
    for rg in fmd.row_groups:
        got: dict[str, Chunk] = {}
        for c in rg.columns:
            md = c.meta_data
            name = md.path_in_schema[0]
            name = name.decode() if isinstance(name, bytes) else name
            if name not in leaves or c.offset_index_offset is None or md.codec not in _CODECS:
                continue
            strings = leaves[name].physical == _BYTE_ARRAY
            if any(e not in (_PLAIN, _RLE, 4, *(_DICT_ENCODINGS if strings else ())) for e in md.encodings):
                continue  # encodings not decoded here: the older way
            dictionary = None
            if md.dictionary_page_offset is not None:
                if not strings or not 0 < md.dictionary_page_offset < md.data_page_offset:
                    continue
                dictionary = (int(md.dictionary_page_offset), int(md.data_page_offset))
            at = c.offset_index_offset - base
            index = bytes(tail[at:at + c.offset_index_length])
            got[name] = Chunk(_CODECS[md.codec], dictionary, index)
            # the bytes (~13 a page), the arrays parsed from them on use (16 a page), the objects
            nbytes += INDEX_BYTES_FACTOR * len(index) + 300
        chunks.append(got)
    return Layout(file_digest_columns(schema), names, np.array(starts, np.int64), leaves, chunks,
                  nbytes + 64 * len(leaves) + 2048)


# decoding ----------------------------------------------------------------------------------
def _levels(body: np.ndarray, pos: int, count: int, max_level: int) -> tuple[np.ndarray | None, int]:
    """RLE/bit-packed levels of a v1 data page (4-byte length first)."""
    if max_level == 0:
        return None, pos
    from fastparquet.cencoding import NumpyIO, read_rle_bit_packed_hybrid

    n = int.from_bytes(body[pos:pos + 4].tobytes(), "little")
    width = int(max_level).bit_length()
    out = np.zeros(count + 64, np.uint8)  # bit-packed runs end on multiples of 8 values
    o = NumpyIO(out)
    read_rle_bit_packed_hybrid(NumpyIO(body[pos + 4:pos + 4 + n]), width, n, o, itemsize=1)
    if o.tell() < count:
        raise Unreadable("levels end early")
    return out[:count], pos + 4 + n


def _varint(data: bytes, p: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = data[p]
        p += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, p


def _one_run(body: np.ndarray, pos: int, count: int, level: int) -> bool:
    """Whether a v1 page's levels at ``pos`` are one RLE run of ``level`` over all ``count`` entries
    (what the writer makes of a column without nulls or empty lists): nothing to decode then."""
    n = int.from_bytes(body[pos:pos + 4].tobytes(), "little")
    if n > 12:
        return False
    data = body[pos + 4:pos + 4 + n].tobytes()
    header, p = _varint(data, 0)
    return not header & 1 and header >> 1 >= count and p < len(data) and data[p] == level


@dataclass
class Page:
    """The rows of one decoded page: row ``j``'s values are ``values[start[j]:end[j]]`` (lists) or
    ``values[start[j]]`` (flat), ``valid[j]`` whether the row is not null; ``item_valid`` per value."""

    values: np.ndarray
    start: np.ndarray
    end: np.ndarray
    valid: np.ndarray | None
    item_valid: np.ndarray | None


def _page_body(raw: bytes | memoryview, codec: str | None) -> tuple[Any, np.ndarray]:
    """(page header, uncompressed body) of one page, its CRC checked first (so damaged bytes never
    reach a decoder)."""
    from fastparquet.cencoding import NumpyIO, ThriftObject

    buf = np.frombuffer(raw, np.uint8)
    io = NumpyIO(buf)
    ph = ThriftObject.from_buffer(io, "PageHeader")
    head = io.tell()
    comp = buf[head:head + ph.compressed_page_size]
    if len(comp) != ph.compressed_page_size:
        raise Unreadable("page cut short")
    if ph.crc is None or (zlib.crc32(comp) & 0xFFFFFFFF) != (ph.crc & 0xFFFFFFFF):
        raise Unreadable("page fails its CRC")
    if codec is None:
        return ph, comp
    return ph, np.frombuffer(pa.Codec(codec).decompress(comp, decompressed_size=ph.uncompressed_page_size), np.uint8)


def _byte_arrays(data: np.ndarray, n: int) -> pa.Array:
    """``n`` PLAIN byte arrays (4-byte length, bytes) as an Arrow string array."""
    from fastparquet.speedups import unpack_byte_array_arrow

    return pa.array(unpack_byte_array_arrow(np.ascontiguousarray(data), n), pa.string())


def dictionary_of(ph: Any, body: np.ndarray) -> pa.Array:
    """The strings of a dictionary page (header and uncompressed body)."""
    if ph.type != 2 or ph.dictionary_page_header is None or ph.dictionary_page_header.encoding not in (_PLAIN, 2):
        raise Unreadable("not a PLAIN dictionary page")
    return _byte_arrays(body, ph.dictionary_page_header.num_values)


def page_of(ph: Any, body: np.ndarray, leaf: Leaf, dictionary: pa.Array | None = None) -> Page:
    """A data page's rows from its header and uncompressed body."""
    from fastparquet.cencoding import NumpyIO, read_rle_bit_packed_hybrid

    if ph.type != 0 or ph.data_page_header is None:
        raise Unreadable("not a v1 data page")
    dh = ph.data_page_header
    if dh.encoding != _PLAIN and not (leaf.physical == _BYTE_ARRAY and dh.encoding in _DICT_ENCODINGS):
        raise Unreadable("values not PLAIN")
    count = dh.num_values
    rep, pos = _levels(body, 0, count, leaf.max_rep)
    row_at = None if rep is None else np.flatnonzero(rep == 0)
    if leaf.max_def and _one_run(body, pos, count, leaf.max_def):
        dl, pos = None, pos + 4 + int.from_bytes(body[pos:pos + 4].tobytes(), "little")  # all defined
    else:
        dl, pos = _levels(body, pos, count, leaf.max_def)
    present = None if dl is None else dl == leaf.max_def
    nval = count if present is None else int(np.count_nonzero(present))
    data = body[pos:]
    if leaf.physical in _FIXED:
        dt = _FIXED[leaf.physical]
        if len(data) < nval * dt.itemsize:
            raise Unreadable("values cut short")
        vals = data[:nval * dt.itemsize].view(dt)
    elif leaf.physical == _FLBA:
        if len(data) < nval * leaf.width:
            raise Unreadable("values cut short")
        vals = data[:nval * leaf.width].reshape(nval, leaf.width)
    elif leaf.physical == _BOOLEAN:
        vals = np.unpackbits(data[:(nval + 7) // 8], bitorder="little")[:nval].astype(bool)
    elif leaf.physical == _BYTE_ARRAY:
        if dh.encoding == _PLAIN:
            strings = _byte_arrays(data, nval)
        else:
            if dictionary is None or not len(data):
                raise Unreadable("dictionary-coded page without its dictionary")
            width = int(data[0])
            idx = np.zeros(nval + 64, np.int32)
            o = NumpyIO(idx.view(np.uint8))
            if nval:
                read_rle_bit_packed_hybrid(NumpyIO(data[1:]), width, len(data) - 1, o, itemsize=4)
            idx = idx[:nval]
            if nval and (idx.min() < 0 or idx.max() >= len(dictionary)):
                raise Unreadable("dictionary index out of range")
            strings = dictionary.take(pa.array(idx))
        slot = np.arange(count, dtype=np.int64) if present is None else np.cumsum(present) - 1
        return Page(strings, slot, slot + 1, present, None)  # type: ignore[arg-type]
    else:
        raise Unreadable("physical type not decoded here")
    if not leaf.is_list:
        if dl is None:
            idx = np.arange(count, dtype=np.int64)
            return Page(vals, idx, idx + 1, None, None)
        full = np.zeros((count,) + vals.shape[1:], vals.dtype)  # nulls as zeros, masked by ``valid``
        full[present] = vals  # type: ignore[index]
        idx = np.arange(count, dtype=np.int64)
        return Page(full, idx, idx + 1, present, None)
    assert row_at is not None
    first = int(leaf.field_optional) + 1  # the level from which an entry is an item (null or not)
    valid = dl[row_at] >= 1 if leaf.field_optional and dl is not None else None
    if nval == count:  # every entry an item with a value (no null or empty list, no null item)
        lengths = np.diff(row_at, append=count)
        item_present = None
    else:
        assert dl is not None
        is_item = dl >= first
        lengths = np.add.reduceat(is_item.astype(np.int64), row_at) if len(row_at) else np.zeros(0, np.int64)
        item_present = present[is_item] if leaf.element_optional else None
    end = np.cumsum(lengths)
    start = end - lengths
    if item_present is not None and not item_present.all():
        items = np.zeros(len(item_present), vals.dtype)
        items[item_present] = vals
        return Page(items, start, end, valid, item_present)
    return Page(vals, start, end, valid, None)


def _bits(mask: np.ndarray) -> pa.Buffer:
    return pa.py_buffer(np.packbits(mask, bitorder="little"))


def _values_array(t: pa.DataType, vals: np.ndarray, valid: np.ndarray | None) -> pa.Array:
    """An Arrow array of type ``t`` from decoded physical values (one copy at most)."""
    n = len(vals)
    vbuf = None if valid is None or valid.all() else _bits(valid)
    if pa.types.is_boolean(t):
        return pa.Array.from_buffers(t, n, [vbuf, _bits(vals.astype(bool))])
    if pa.types.is_fixed_size_binary(t):
        return pa.Array.from_buffers(t, n, [vbuf, pa.py_buffer(np.ascontiguousarray(vals))])
    width = t.bit_width // 8
    kind = "u" if pa.types.is_unsigned_integer(t) else ("f" if pa.types.is_floating(t) else "i")
    dt = np.dtype(f"<{kind}{width}")
    if vals.dtype.itemsize == width and vals.dtype.kind in "iu" and kind in "iu":
        out = vals.view(dt)
    else:
        out = vals.astype(dt, copy=False)
    return pa.Array.from_buffers(t, n, [vbuf, pa.py_buffer(np.ascontiguousarray(out))])


def assemble(leaf: Leaf, pages: list[Page], which: np.ndarray, rows: np.ndarray) -> pa.Array:
    """Column ``leaf`` of the asked rows: row ``i`` is row ``rows[i]`` of ``pages[which[i]]``."""
    n = len(rows)
    valid = None
    if leaf.field_optional:
        flags = [p.valid if p.valid is not None else np.ones(len(p.start), bool) for p in pages]
        valid = np.array([bool(flags[w][r]) for w, r in zip(which.tolist(), rows.tolist())], bool)
    if not leaf.is_list and leaf.physical == _BYTE_ARRAY:  # values are Arrow strings: one take
        base = np.cumsum([0] + [len(p.values) for p in pages])
        at = np.array([base[w] + pages[w].start[r] for w, r in zip(which.tolist(), rows.tolist())], np.int64)
        if valid is not None and not valid.all():
            at[~valid] = 0
        strings = pa.concat_arrays([p.values for p in pages]) if pages else pa.array([], pa.string())
        got = strings.take(pa.array(at, mask=None if valid is None or valid.all() else ~valid))
        return got.cast(leaf.arrow)
    if not leaf.is_list:
        vals = [pages[w].values[pages[w].start[r]] for w, r in zip(which.tolist(), rows.tolist())]
        flat = np.stack(vals) if vals else np.zeros((0,), np.int64)
        return _values_array(leaf.arrow, flat, valid)
    parts, item_parts, lengths = [], [], np.empty(n, np.int64)
    for i, (w, r) in enumerate(zip(which.tolist(), rows.tolist())):
        p = pages[w]
        a, b = int(p.start[r]), int(p.end[r])
        parts.append(p.values[a:b])
        if leaf.element_optional:
            item_parts.append(p.item_valid[a:b] if p.item_valid is not None else np.ones(b - a, bool))
        lengths[i] = b - a
    vals = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    items = _values_array(leaf.arrow.value_type, vals, np.concatenate(item_parts) if item_parts else None)
    odt = np.int64 if pa.types.is_large_list(leaf.arrow) else np.int32
    offsets = np.zeros(n + 1, odt)
    np.cumsum(lengths, out=offsets[1:])
    mask = None if valid is None or valid.all() else pa.array(~valid)
    return pa.ListArray.from_arrays(pa.array(offsets), items, type=leaf.arrow, mask=mask) if odt is np.int32 else \
        pa.LargeListArray.from_arrays(pa.array(offsets), items, type=leaf.arrow, mask=mask)


# reading ------------------------------------------------------------------------------------
#: threads that CRC-check and decompress the pages of one get (native code without the GIL)
BODY_THREADS = 2


class _Plan:
    """Which pages of one file a take reads, and how each asked row is found in them."""

    def __init__(self, lay: Layout, cols: list[str], read: list[str]) -> None:
        self.lay, self.cols, self.read = lay, cols, read
        self.wanted: dict[tuple[int, int], int] = {}  # (offset, size) -> page number
        self.codecs: dict[int, str | None] = {}
        self.dict_of: dict[int, int] = {}  # page number -> the page number of its chunk's dictionary
        self.rows: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # column -> (page of each row, row in it)

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
        return _finish_together([self], [bodies], [keys])


def _finish_together(plans: list[_Plan], bodies: list[dict], keys: list[list[str]]) -> pa.Table:
    """``_Plan.finish`` of several files' plans with the same columns and kinds, as one table: each
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
        local = np.concatenate([p.rows[c][1] for p in plans])
        uniq, inv = np.unique(page_ids, return_inverse=True)
        try:
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


def _bodies(jobs: list[tuple[int, int, memoryview]], plans: list) -> dict[int, dict]:
    """``_page_body`` of every (item, page number, raw bytes), split over ``BODY_THREADS`` threads:
    {item: {page number: (header, body) or Unreadable}}."""
    from .runtime import native_call

    out: dict[int, dict] = {i: {} for i, _n, _r in jobs}

    def run(part: list[tuple[int, int, memoryview]]) -> None:
        with native_call("decompressing lake pages"):
            for i, n, raw in part:
                try:
                    out[i][n] = _page_body(raw, plans[i].codecs[n])
                except Unreadable as e:
                    out[i][n] = e
                except Exception as e:  # noqa: BLE001 - a header or body that does not decode
                    out[i][n] = Unreadable(f"{type(e).__name__}: {e}")

    if len(jobs) < 8 or BODY_THREADS < 2:
        run(jobs)
        return out
    parts = [jobs[k::BODY_THREADS] for k in range(BODY_THREADS)]
    workers = [threading.Thread(target=run, args=(p,), name="lakebuffer-pages", daemon=True) for p in parts[1:]]
    for w in workers:
        w.start()
    run(parts[0])
    for w in workers:
        w.join()
    return out


class RowPages:
    """Rows of one lake's files by (file, row), page by page, every row checked (thread-safe)."""

    def __init__(self, store: LakeFS, cache_bytes: int) -> None:
        self.store = store
        self.cache_bytes = int(cache_bytes)
        self._lock = threading.Lock()
        self._layouts: OrderedDict[str, Layout] = OrderedDict()
        self._held = 0
        #: rows this reader returned, and files' reads it left to the caller (it could not verify them)
        self.counts = {"rows": 0, "left": 0}

    # file access
    def _read_ranges(self, rel: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        path = self.store.abs(rel)
        if self.store.native_local:
            fd = os.open(path, os.O_RDONLY)
            try:
                out = []
                for a, b in ranges:
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
            with self.store.pafs.open_input_file(path) as f:  # (a HEAD request: pyarrow takes no known size)
                for a, b in ranges:
                    got = f.read_at(b - a, a)
                    if len(got) != b - a:
                        raise Unreadable("file shorter than its footer says")
                    out.append(got)
        return out

    def layout(self, entry: dict) -> Layout:
        """The file's layout (read once, kept within ``cache_bytes``); ``Unreadable`` if it cannot be."""
        rel = entry["path"]
        with self._lock:
            got = self._layouts.get(rel)
            if got is not None:
                self._layouts.move_to_end(rel)
                return got
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
        if len(todo) < 2:
            return

        def one(entry: dict) -> None:
            try:
                self.layout(entry)
            except Unreadable:
                pass

        with ThreadPoolExecutor(min(LAYOUT_THREADS, len(todo)), thread_name_prefix="lakebuffer-layouts") as pool:
            list(pool.map(one, todo))

    def forget(self, rel: str) -> None:
        with self._lock:
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
        for part in self._parts(plans, errors):
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
        for part in self._parts(plans, errors):
            bodies = self._bodies_of(items, plans, part, errors)
            groups: dict[tuple, list[int]] = {}
            for i in part:
                plan = plans[i]
                if plan is not None and i not in errors:
                    sig = (tuple(plan.read), tuple(plan.lay.hashed or ()),
                           tuple(plan.lay.leaves[c] for c in plan.read))
                    groups.setdefault(sig, []).append(i)
            for members in groups.values():
                try:
                    table = _finish_together([plans[i] for i in members], [bodies.get(i, {}) for i in members],  # type: ignore[misc]
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
               ) -> tuple[list[_Plan | None], dict[int, Unreadable]]:
        errors: dict[int, Unreadable] = {}
        plans: list[_Plan | None] = []
        for i, (entry, keys, rows) in enumerate(items):
            try:
                plans.append(self._plan(entry, keys, rows, columns))
            except Unreadable as e:
                plans.append(None)
                errors[i] = e
        return plans, errors

    @staticmethod
    def _parts(plans: list[_Plan | None], errors: dict[int, Unreadable]) -> list[list[int]]:
        """The planned items in runs of at most ``PART_BYTES`` of pages (one item may exceed it alone)."""
        parts: list[list[int]] = [[]]
        held = 0
        for i, plan in enumerate(plans):
            if plan is None or i in errors:
                continue
            size = sum(n for _o, n in plan.wanted)
            if parts[-1] and held + size > PART_BYTES:
                parts.append([])
                held = 0
            parts[-1].append(i)
            held += size
        return [p for p in parts if p]

    def _bodies_of(self, items: list[tuple[dict, list[str], np.ndarray]], plans: list[_Plan | None],
                   part: list[int], errors: dict[int, Unreadable]) -> dict[int, dict]:
        """Read and decompress the pages of the items of ``part``: {item: {page: (header, body)}}.
        Pages are read file by file (on an object store ``FETCH_THREADS`` files at once), then
        CRC-checked and decompressed on ``BODY_THREADS`` threads (native work, without the GIL)."""
        def fetch(i: int) -> list[memoryview] | Unreadable:
            try:
                return self._fetch(items[i][0], plans[i])  # type: ignore[arg-type]
            except Unreadable as e:
                return e

        if self.store.native_local or len(part) < 2:
            raws = [fetch(i) for i in part]
        else:  # an object store: the files' requests overlap
            with ThreadPoolExecutor(min(FETCH_THREADS, len(part)), thread_name_prefix="lakebuffer-pages") as pool:
                raws = list(pool.map(fetch, part))
        jobs = []
        for i, raw in zip(part, raws):
            if isinstance(raw, Unreadable):
                errors[i] = raw
            else:
                jobs.extend((i, n, r) for n, r in enumerate(raw))
        return _bodies(jobs, plans)

    def _plan(self, entry: dict, keys: list[str], rows: np.ndarray, columns: list[str]) -> _Plan:
        lay = self.layout(entry)
        if lay.hashed is None:
            raise Unreadable("no row digests")
        cols = [c for c in dict.fromkeys(["key", *columns]) if c == "key" or c in lay.names]
        read = [c for c in cols if c != "key"] + [HASH_COLUMN]
        rows = np.asarray(rows, np.int64)
        if len(rows) and (rows.min() < 0 or rows.max() >= lay.row_starts[-1]):
            raise Unreadable("row beyond the file")
        rg = np.searchsorted(lay.row_starts, rows, side="right") - 1
        in_rg = rows - lay.row_starts[rg]
        plan = _Plan(lay, cols, read)
        # which page of each column holds each row; one read per distinct page (adjacent ones merged)
        for c in read:
            page_ids = np.empty(len(rows), np.int64)
            local = np.empty(len(rows), np.int64)
            for g in np.unique(rg).tolist():
                ch = lay.chunks[g].get(c)
                if ch is None:
                    raise Unreadable(f"column {c} is not decoded here")
                sel = rg == g
                first_rows, offsets, sizes = ch.pages()
                p = np.searchsorted(first_rows, in_rg[sel], side="right") - 1
                ids = np.empty(len(p), np.int64)
                for j, (off, size) in enumerate(zip(offsets[p].tolist(), sizes[p].tolist())):
                    ids[j] = plan.page((off, size), ch.codec, ch.dictionary)
                page_ids[sel] = ids
                local[sel] = in_rg[sel] - first_rows[p]
            plan.rows[c] = (page_ids, local)
        return plan

    def _fetch(self, entry: dict, plan: _Plan) -> list[memoryview]:
        """The raw bytes of the plan's pages, in page-number order (adjacent ranges read as one)."""
        merged: list[list[int]] = []
        for off, size in sorted(plan.wanted):
            if merged and off <= merged[-1][1] + MERGE_GAP:
                merged[-1][1] = max(merged[-1][1], off + size)
            else:
                merged.append([off, off + size])
        try:
            blobs = self._read_ranges(entry["path"], [(a, b) for a, b in merged])
        except Unreadable:
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
