"""One Parquet page decoded to Arrow values: the row reader's (``lake/rowpages.py``) decoders.

Why our own: the row reader decodes only the pages holding asked rows, which no well-kept reader
offers per page (pyarrow decodes whole column chunks; DataFusion plans a scan per file). The Thrift
headers and RLE/bit-packed levels are fastparquet's decoders; values are numpy views of the page.
What is decoded: v1 data pages, PLAIN values (and dictionary-coded strings) of fixed-width numbers,
booleans, fixed-size binary, strings, and one-level lists of numbers with nulls at either level
(``page_of``, a page at a time; lists without nulls, every page of a take at once: ``simple_list_rows``).
Anything else raises ``Unreadable`` and the caller reads the file the older way.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from isal.isal_zlib import crc32

CODECS = {0: None, 1: "snappy", 2: "gzip", 4: "brotli", 6: "zstd"}
PLAIN, RLE = 0, 3
REQUIRED, OPTIONAL, REPEATED = 0, 1, 2
FIXED = {1: np.dtype("<i4"), 2: np.dtype("<i8"), 4: np.dtype("<f4"), 5: np.dtype("<f8")}  # INT32 INT64 FLOAT DOUBLE
BOOLEAN, BYTE_ARRAY, FLBA = 0, 6, 7
DICT_ENCODINGS = (2, 8)  # PLAIN_DICTIONARY, RLE_DICTIONARY
#: no page of a lake file is larger than this uncompressed, nor has more level entries (the writer's pages
#: are ~32 KiB, or one row): a header claiming more is damaged (a header is outside its page's CRC) and is
#: refused before a decoder allocates from it
MAX_PAGE_BYTES = 256 << 20
MAX_PAGE_ENTRIES = 16 << 20


class Unreadable(Exception):
    """This reader does not serve the file (or these rows of it): the caller reads it the older way."""


class PageDamaged(Unreadable):
    """A page fails the CRC its writer stored, or is cut short: the file is damaged. No other reader is
    asked (DataFusion does not check page CRCs: it could return the page, and a row its damage missed)."""


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


_FROM_BUFFER: Any = None


def thrift(data: bytes, name: str) -> Any:
    global _FROM_BUFFER
    if _FROM_BUFFER is None:
        with warnings.catch_warnings():  # fastparquet's import asks pandas for an option pandas 3 deprecates
            warnings.simplefilter("ignore")
            from fastparquet.cencoding import from_buffer
            from fastparquet.speedups import unpack_byte_array_arrow  # noqa: F401 - imported once, here
        _FROM_BUFFER = from_buffer
    return _FROM_BUFFER(data, name)


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


def page_header(raw: bytes | memoryview) -> tuple[Any, np.ndarray]:
    """(page header, compressed body) of one page, its CRC checked (so damaged bytes never reach a
    decoder). ISA-L's CRC-32 (the one Parquet uses, as zlib's): ~19x zlib's speed on these pages
    (``benchmarks/page_bodies.py``)."""
    from fastparquet.cencoding import NumpyIO, ThriftObject

    buf = np.frombuffer(raw, np.uint8)
    io = NumpyIO(buf)
    ph = ThriftObject.from_buffer(io, "PageHeader")
    head = io.tell()
    comp = buf[head:head + ph.compressed_page_size]
    if len(comp) != ph.compressed_page_size:
        raise PageDamaged("a page is cut short")
    if ph.crc is None:
        raise Unreadable("a page without a CRC (another writer's file)")
    if (crc32(comp) & 0xFFFFFFFF) != (ph.crc & 0xFFFFFFFF):
        raise PageDamaged(f"a page fails its CRC ({len(comp)} bytes)")
    fields = ph.contents  # (raw Thrift fields: 2 uncompressed size; 5, 7, 8 the page kinds' headers, 1 their entries)
    kind = fields.get(5) or fields.get(8) or fields.get(7) or {}
    if not 0 <= fields.get(2, 0) <= MAX_PAGE_BYTES or not 0 <= kind.get(1, 0) <= MAX_PAGE_ENTRIES:
        raise PageDamaged(f"a page header claims {fields.get(2)} bytes and {kind.get(1)} values")
    return ph, comp


def decompress(ph: Any, comp: np.ndarray, codec: str | None) -> np.ndarray:
    """The uncompressed body of a page whose header is ``ph`` (native work, without the GIL)."""
    if codec is None:
        return comp
    return np.frombuffer(_codec(codec).decompress(comp, decompressed_size=ph.uncompressed_page_size), np.uint8)


_CODECS: dict[str, pa.Codec] = {}


def _codec(name: str) -> pa.Codec:
    """One Arrow codec per name, shared (its one-shot ``Decompress`` keeps no state between calls): a
    new one per page cost a construction and a context allocation under the GIL."""
    got = _CODECS.get(name)
    if got is None:
        got = _CODECS.setdefault(name, pa.Codec(name))
    return got


def _byte_arrays(data: np.ndarray, n: int) -> pa.Array:
    """``n`` PLAIN byte arrays (4-byte length, bytes) as an Arrow string array."""
    from fastparquet.speedups import unpack_byte_array_arrow

    return pa.array(unpack_byte_array_arrow(np.ascontiguousarray(data), n), pa.string())


def dictionary_of(ph: Any, body: np.ndarray) -> pa.Array:
    """The strings of a dictionary page (header and uncompressed body)."""
    if ph.type != 2 or ph.dictionary_page_header is None or ph.dictionary_page_header.encoding not in (PLAIN, 2):
        raise Unreadable("not a PLAIN dictionary page")
    return _byte_arrays(body, ph.dictionary_page_header.num_values)


def page_of(ph: Any, body: np.ndarray, leaf: Leaf, dictionary: pa.Array | None = None) -> Page:
    """A data page's rows from its header and uncompressed body."""
    from fastparquet.cencoding import NumpyIO, read_rle_bit_packed_hybrid

    if ph.type != 0 or ph.data_page_header is None:
        raise Unreadable("not a v1 data page")
    dh = ph.data_page_header
    if dh.encoding != PLAIN and not (leaf.physical == BYTE_ARRAY and dh.encoding in DICT_ENCODINGS):
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
    if leaf.physical in FIXED:
        dt = FIXED[leaf.physical]
        if len(data) < nval * dt.itemsize:
            raise Unreadable("values cut short")
        vals = data[:nval * dt.itemsize].view(dt)
    elif leaf.physical == FLBA:
        if len(data) < nval * leaf.width:
            raise Unreadable("values cut short")
        vals = data[:nval * leaf.width].reshape(nval, leaf.width)
    elif leaf.physical == BOOLEAN:
        vals = np.unpackbits(data[:(nval + 7) // 8], bitorder="little")[:nval].astype(bool)
    elif leaf.physical == BYTE_ARRAY:
        if dh.encoding == PLAIN:
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
    if nval == count:  # every entry an item with a value (no null or empty list, no null item):
        start = row_at  # a row's items are its entries
        end = np.empty_like(row_at)
        end[:-1] = row_at[1:]
        end[-1:] = count
        return Page(vals, start, end, valid, None)
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
    if not leaf.is_list and leaf.physical == BYTE_ARRAY:  # values are Arrow strings: one take
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
    return _list_array(leaf, lengths, items, None if valid is None or valid.all() else pa.array(~valid))


def _list_array(leaf: Leaf, lengths: np.ndarray, items: pa.Array, mask: pa.Array | None) -> pa.Array:
    """The list column ``leaf`` of rows with ``lengths`` items each, from their ``items`` in order."""
    large = pa.types.is_large_list(leaf.arrow)
    offsets = np.zeros(len(lengths) + 1, np.int64 if large else np.int32)
    np.cumsum(lengths, out=offsets[1:])
    cls = pa.LargeListArray if large else pa.ListArray
    return cls.from_arrays(pa.array(offsets), items, type=leaf.arrow, mask=mask)


def simple_list_rows(leaf: Leaf, bodies: list[tuple[Any, np.ndarray]], which: np.ndarray,
                     rows: np.ndarray) -> pa.Array | None:
    """Column ``leaf`` (a list of fixed-width numbers) of the asked rows (row ``rows[i]`` of page
    ``bodies[which[i]]``), every page decoded in one pass: their repetition levels into one array, the
    row starts found once. Only for pages whose every level entry is an item with a value (one run of
    the top definition level: no null row, empty list or null item, what the writer makes of token ids
    and log-probs); None when a page is not so (``page_of`` decodes it). Why: a cold get of ~190 rows
    decodes ~190 pages, and the per-page steps of ``page_of`` cost more than their levels' decoding."""
    from fastparquet.cencoding import NumpyIO, read_rle_bit_packed_hybrid

    dt = FIXED.get(leaf.physical)
    if dt is None or not leaf.is_list or leaf.max_rep != 1:
        return None
    width = dt.itemsize
    pages = []  # per page: (its levels' bytes, entries, where its values start in its body)
    for ph, body in bodies:
        head = ph.contents  # the raw fields (PageHeader: 1 type, 5 data page header: 1 num_values, 2 encoding)
        dh = head.get(5)
        if head.get(1) != 0 or dh is None or dh.get(2) != PLAIN:
            return None
        count = dh[1]
        n_rep = int.from_bytes(body[:4].tobytes(), "little")
        pos = 4 + n_rep
        if leaf.max_def:
            if not _one_run(body, pos, count, leaf.max_def):
                return None
            pos += 4 + int.from_bytes(body[pos:pos + 4].tobytes(), "little")
        if len(body) < pos + count * width:
            raise Unreadable("values cut short")
        pages.append((n_rep, count, pos))
    counts = np.array([c for _r, c, _a in pages], np.int64)
    offs = np.zeros(len(pages), np.int64)  # where each page's levels start in ``levels``
    np.cumsum(counts[:-1] + 64, out=offs[1:])  # 64 spare: bit-packed runs end on multiples of 8 values
    levels = np.empty(int(counts.sum()) + 64 * len(pages), np.uint8)
    for (_ph, body), (n_rep, count, _at), a in zip(bodies, pages, offs.tolist()):
        o = NumpyIO(levels[a:a + count + 64])
        read_rle_bit_packed_hybrid(NumpyIO(body[4:4 + n_rep]), 1, n_rep, o, itemsize=1)
        if o.tell() < count:
            raise Unreadable("levels end early")
        levels[a + count:a + count + 64] = 1  # past the page's entries: no row starts there
    starts = np.flatnonzero(levels == 0)  # every row's first entry, all pages
    if not len(starts):
        raise Unreadable("pages without rows")
    first = np.searchsorted(starts, offs)
    n_rows = np.searchsorted(starts, offs + counts) - first
    if (rows >= n_rows[which]).any() or (rows < 0).any():
        raise Unreadable("row beyond its page")
    if (starts[np.minimum(first, len(starts) - 1)] != offs).any():
        raise Unreadable("a page does not start with a row")
    k = first[which] + rows
    begin = starts[k] - offs[which]
    last = rows + 1 >= n_rows[which]
    end = np.where(last, counts[which], starts[np.minimum(k + 1, len(starts) - 1)] - offs[which])
    at = np.array([a for _r, _c, a in pages], np.int64)[which]
    parts = [bodies[p][1][a:b].view(dt) for p, a, b in
             zip(which.tolist(), (at + begin * width).tolist(), (at + end * width).tolist())]
    vals = np.concatenate(parts) if parts else np.zeros(0, dt)
    return _list_array(leaf, end - begin, _values_array(leaf.arrow.value_type, vals, None), None)
