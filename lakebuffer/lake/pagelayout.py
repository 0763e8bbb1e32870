"""Where the pages of a lake file are: its footer and offset indexes, parsed once per file.

The row reader (``lake/rowpages.py``) keeps one ``Layout`` per file it has read (within its cache's
bytes): the row groups' first rows, the columns it can decode (``Leaf``) and, per column chunk, the
codec and the offset index, parsed into page positions on first use (a get reads a few columns).
"""

from __future__ import annotations

import base64
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from . import offsetindex
from .pagedecode import BYTE_ARRAY, CODECS, DICT_ENCODINGS, OPTIONAL, PLAIN, REPEATED, RLE, Leaf, Unreadable, thrift
from .rowhash import HASH_COLUMN, file_digest_columns

#: bytes read from a file's end for its footer and page indexes in one request (more if they need it)
TAIL_BYTES = 64 * 1024
INDEX_BYTES_FACTOR = 3  # RAM held per byte of a file's offset indexes (``parse_layout``), measured
#: offset indexes at least this long are decoded by ``lake/offsetindex.py`` (~70 pages and more: 4x
#: faster than the Thrift decoder at ~460 pages, slower below ~50)
VECTOR_INDEX_BYTES = 1024


class Chunk:
    """One column chunk: where its pages are (its offset index, parsed on first use: a get reads a few
    of a file's columns) and how they are compressed."""

    __slots__ = ("codec", "dictionary", "_index", "_pages", "_values")

    def __init__(self, codec: str | None, dictionary: tuple[int, int] | None, index: bytes) -> None:
        self.codec = codec
        self.dictionary = dictionary  # the byte range of its dictionary page (strings only)
        self._index = index
        self._pages: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._values: np.ndarray | bool | None = None

    def plain_value_starts(self, rows: int, width: int, max_header: int) -> np.ndarray | None:
        """Where each page's values start, for an uncompressed chunk of required ``width``-byte values
        in ``rows`` rows (a page is its header, then its rows x ``width`` bytes); None when a page's
        header would be empty or longer than ``max_header`` (the pages are not laid out so)."""
        got = self._values
        if got is None:
            got = False
            if self.codec is None and self.dictionary is None:
                first_rows, offsets, sizes = self.pages()
                header = sizes - np.diff(np.append(first_rows, rows)) * width
                if len(header) and (header > 0).all() and (header <= max_header).all():
                    got = offsets + header
            self._values = got  # (False: not laid out so; asked once)
        return None if got is False else got

    def pages(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(first row within the row group, offset, size) of each page."""
        got = self._pages
        if got is None:
            if len(self._index) >= VECTOR_INDEX_BYTES:  # many pages: decoded in one numpy pass
                got = offsetindex.decode(self._index)
            if got is None:
                # the raw field dicts (field 1: page_locations; a location's 1 offset, 2 size, 3 first
                # row): 3x faster than attribute access per page
                locs = thrift(self._index, "OffsetIndex").contents[1]
                a = np.array([(d[1], d[2], d[3]) for d in locs], np.int64).reshape(-1, 3)
                got = (a[:, 2].astype(np.int32), a[:, 0].copy(), a[:, 1].astype(np.int32))
            self._pages = got
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

    def decode_pages(self) -> None:
        """Parse every chunk's offset index now (``nbytes`` counts the parsed arrays already): what a
        resume does before its first take, instead of ~100 of them inside it."""
        for group in self.chunks:
            for chunk in group.values():
                chunk.pages()


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
        opt = top.repetition_type == OPTIONAL
        if arrow is not None and not kids and top.repetition_type != REPEATED:
            if (_decodable(arrow) or pa.types.is_fixed_size_binary(arrow) or pa.types.is_boolean(arrow)
                    or ((pa.types.is_string(arrow) or pa.types.is_large_string(arrow)) and top.type == BYTE_ARRAY)):
                out[name] = Leaf(name, arrow, top.type, top.type_length or 0, opt, False, False, int(opt), 0)
        elif (arrow is not None and kids == 1 and span == 3 and (pa.types.is_list(arrow) or pa.types.is_large_list(arrow))
              and _decodable(arrow.value_type) and top.repetition_type != REPEATED):
            rep, leaf = elems[i + 1], elems[i + 2]
            if rep.repetition_type == REPEATED and (rep.num_children or 0) == 1 and not leaf.num_children \
                    and leaf.repetition_type != REPEATED:
                eopt = leaf.repetition_type == OPTIONAL
                out[name] = Leaf(name, arrow, leaf.type, leaf.type_length or 0, opt, True, eopt, int(opt) + 1 + int(eopt), 1)
        i += span
    return out


#: (Arrow schema, leaves) of the file schemas seen, by their footer form: a run's files share one
#: schema, and deriving the leaves cost a third of a layout's parse
_SCHEMAS: dict[tuple, tuple[pa.Schema, dict[str, Leaf]]] = {}
_SCHEMAS_KEPT = 64


def _schema_and_leaves(fmd: Any) -> tuple[pa.Schema, dict[str, Leaf]]:
    raw = fmd.contents
    arrow = next((kv.get(2) for kv in raw.get(5) or [] if kv.get(1) in (b"ARROW:schema", "ARROW:schema")), None)
    key = (arrow, tuple((e.get(4), e.get(1), e.get(2), e.get(3), e.get(5)) for e in raw.get(2) or []))
    got = _SCHEMAS.get(key)
    if got is None:
        schema = _arrow_schema(fmd)
        got = (schema, _leaves(fmd, schema))
        if len(_SCHEMAS) >= _SCHEMAS_KEPT:
            _SCHEMAS.clear()
        _SCHEMAS[key] = got
    return got


def parse_layout(tail: bytes, size: int, read: Any) -> Layout:
    """A file's ``Layout`` from its last bytes (``tail``), reading more with ``read(start, end)``.
    The footer is walked as Thrift field dicts (``contents``: ids from parquet.thrift), ~2x faster
    than attribute access for the ~30 column chunks of a lake file."""
    if len(tail) < 8 or tail[-4:] != b"PAR1":
        raise Unreadable("not a Parquet file")
    flen = struct.unpack("<i", tail[-8:-4])[0]
    if flen <= 0 or flen + 8 > size:
        raise Unreadable("bad footer length")
    if flen + 8 > len(tail):
        tail = read(size - flen - 8, size)
    fmd = thrift(tail[len(tail) - 8 - flen:len(tail) - 8], "FileMetaData")
    schema, leaves = _schema_and_leaves(fmd)
    names = [n for n in schema.names if n != HASH_COLUMN]
    groups = fmd.contents.get(4) or []  # FileMetaData.row_groups
    starts = [0]
    index_from = size
    for rg in groups:
        starts.append(starts[-1] + rg[3])  # RowGroup.num_rows
        for c in rg[1]:  # RowGroup.columns
            at = c.get(4)  # ColumnChunk.offset_index_offset
            if at is not None and at < index_from:
                index_from = at
    base = size - len(tail)
    if index_from < base:
        tail, base = read(index_from, size), index_from
    chunks: list[dict[str, Chunk]] = []
    nbytes = 0
    for rg in groups:
        got: dict[str, Chunk] = {}
        for c in rg[1]:
            md = c.get(3)  # ColumnChunk.meta_data
            at = c.get(4)
            if md is None or at is None:
                continue
            name = md[3][0]  # ColumnMetaData.path_in_schema
            name = name.decode() if isinstance(name, bytes) else name
            leaf = leaves.get(name)
            codec = md[4]
            if leaf is None or codec not in CODECS:
                continue
            strings = leaf.physical == BYTE_ARRAY
            if any(e not in (PLAIN, RLE, 4, *(DICT_ENCODINGS if strings else ())) for e in md[2]):
                continue  # encodings not decoded here: the older way
            dictionary = None
            dict_at, data_at = md.get(11), md[9]  # dictionary_page_offset, data_page_offset
            if dict_at is not None:
                if not strings or not 0 < dict_at < data_at:
                    continue
                dictionary = (int(dict_at), int(data_at))
            at -= base
            index = bytes(tail[at:at + c[5]])  # ColumnChunk.offset_index_length
            got[name] = Chunk(CODECS[codec], dictionary, index)
            # the bytes (~13 a page), the arrays parsed from them on use (16 a page), the objects
            nbytes += INDEX_BYTES_FACTOR * len(index) + 300
        chunks.append(got)
    return Layout(file_digest_columns(schema), names, np.array(starts, np.int64), leaves, chunks,
                  nbytes + 64 * len(leaves) + 2048)
