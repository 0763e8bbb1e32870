"""Positioned reads of Arrow IPC files: the asked rows of the asked columns, no memory map (issue 24).

Why not a memory map: a mapped page of a file another program truncates raises SIGBUS in whatever
thread touches it (and one it rewrites can hand Arrow garbage offsets: SIGSEGV); no stat before the
read can close that window. A ``pread`` of a truncated file returns fewer bytes instead, and a file
changed in place changes its mtime *before* its bytes (the kernel updates it first), so a read
followed by an ``fstat`` that still shows the verified (inode, size, mtime) read verified bytes.

``Layout`` is what the IPC footer and each record batch's metadata say (parsed once per verified
file, with a small flatbuffer reader: pyarrow exposes no buffer offsets): for every batch and
column, the file offset and length of each buffer. ``take`` then reads, per run of consecutive asked
rows, only the bytes of those rows: for a ``list<int32>`` column the two offsets and the values
between them, directly into the output's buffers (one ``preadv`` per run and buffer level, no
per-row Python beyond that system call). Any offset that points outside its buffer is damage
(``LayoutError``), checked before anything is read from it.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

_IPC_MAGIC = b"ARROW1"


class LayoutError(Exception):
    """The file's bytes are not a readable IPC file (truncated, rewritten, damaged)."""


# --- a minimal flatbuffer reader (bounds-checked: a damaged file raises LayoutError) ---------------
def _u(fmt: str, buf: bytes, pos: int) -> int:
    try:
        return struct.unpack_from(fmt, buf, pos)[0]
    except struct.error as e:
        raise LayoutError(f"metadata ends early at {pos}") from e


def _field(buf: bytes, table: int, i: int) -> int | None:
    """Absolute position of field ``i`` of the table at ``table``, None when absent."""
    vt = table - _u("<i", buf, table)
    vt_len = _u("<H", buf, vt)
    if 4 + 2 * i >= vt_len:
        return None
    off = _u("<H", buf, vt + 4 + 2 * i)
    return table + off if off else None


def _deref(buf: bytes, pos: int) -> int:
    return pos + _u("<I", buf, pos)


def _structs(buf: bytes, table: int, i: int, fmt: str) -> list[tuple]:
    """A vector of structs (field ``i``), each unpacked with ``fmt``."""
    p = _field(buf, table, i)
    if p is None:
        return []
    v = _deref(buf, p)
    n, size = _u("<I", buf, v), struct.calcsize(fmt)
    if v + 4 + n * size > len(buf):
        raise LayoutError("vector runs past the metadata")
    return [struct.unpack_from(fmt, buf, v + 4 + k * size) for k in range(n)]


# --- layout --------------------------------------------------------------------------------------
@dataclass
class Node:
    """One field of one record batch: its length, null count, buffers (file offset, length), children."""

    type: pa.DataType
    length: int
    nulls: int
    buffers: list[tuple[int, int]]
    children: list[Node] = field(default_factory=list)
    #: buffer index -> its bytes, read with the layout (the offsets of list/string columns: small, and
    #: read by every ``take``), so a ``take`` reads them from memory, not with a system call per batch
    cached: dict[int, np.ndarray] = field(default_factory=dict)


@dataclass
class Layout:
    schema: pa.Schema
    batches: list[list[Node]]  # per batch, one Node per top-level column
    starts: np.ndarray  # first row of each batch, then the row count
    supported: bool  # False: dictionaries, compression or a type ``take`` does not read (read whole)

    @property
    def rows(self) -> int:
        return int(self.starts[-1])

    def column_bytes(self, names: list[str]) -> int:
        """Bytes on disk of ``names`` over every batch (what a scan of them reads)."""
        idx = [self.schema.get_field_index(c) for c in names if c in self.schema.names]

        def size(n: Node) -> int:
            return sum(b[1] for b in n.buffers) + sum(size(c) for c in n.children)

        return sum(size(b[i]) for b in self.batches for i in idx)


_FIXED = (pa.types.is_integer, pa.types.is_floating, pa.types.is_temporal, pa.types.is_decimal,
          pa.types.is_fixed_size_binary)


def _kind(t: pa.DataType) -> str | None:
    if pa.types.is_boolean(t):
        return "bool"
    if any(f(t) for f in _FIXED) and not pa.types.is_interval(t):
        return "fixed"
    if pa.types.is_string(t) or pa.types.is_binary(t):
        return "binary"
    if pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        return "large_binary"
    if pa.types.is_list(t):
        return "list"
    if pa.types.is_large_list(t):
        return "large_list"
    if pa.types.is_fixed_size_list(t):
        return "fixed_list"
    if pa.types.is_struct(t):
        return "struct"
    return None


_NBUF = {"bool": 2, "fixed": 2, "binary": 3, "large_binary": 3, "list": 2, "large_list": 2, "fixed_list": 1,
         "struct": 1}


def _children(t: pa.DataType) -> list[pa.DataType]:
    return [t.field(i).type for i in range(t.num_fields)] if _kind(t) in ("list", "large_list", "fixed_list", "struct") else []


def _build(t: pa.DataType, nodes: list, bufs: list, body: int, body_len: int) -> Node:
    kind = _kind(t)
    if kind is None:
        raise NotImplementedError(str(t))
    if not nodes:
        raise LayoutError("fewer field nodes than the schema has fields")
    length, nulls = nodes.pop(0)
    mine = []
    for _ in range(_NBUF[kind]):
        if not bufs:
            raise LayoutError("fewer buffers than the schema needs")
        off, n = bufs.pop(0)
        if off < 0 or n < 0 or off + n > body_len:
            raise LayoutError("a buffer lies outside its batch's body")
        mine.append((body + off, n))
    return Node(t, length, nulls, mine, [_build(c, nodes, bufs, body, body_len) for c in _children(t)])


def _pread(fd: int, n: int, off: int) -> bytes:
    b = os.pread(fd, n, off)
    if len(b) != n:
        raise LayoutError(f"file ends at {off + len(b)}, expected {off + n} bytes")
    return b


def read_layout(fd: int, ipc_end: int) -> Layout:
    """Parse the IPC file that ends at byte ``ipc_end`` of ``fd`` (the CRC32C footer follows it)."""
    if ipc_end < 18 or _pread(fd, 6, 0) != _IPC_MAGIC or _pread(fd, 6, ipc_end - 6) != _IPC_MAGIC:
        raise LayoutError("not an Arrow IPC file")
    flen = _u("<i", _pread(fd, 4, ipc_end - 10), 0)
    if flen <= 0 or flen > ipc_end - 18:
        raise LayoutError("bad footer length")
    footer = _pread(fd, flen, ipc_end - 10 - flen)
    root = _deref(footer, 0)
    blocks = _structs(footer, root, 3, "<qi4xq")
    supported = not _structs(footer, root, 2, "<qi4xq")  # dictionary batches: read whole
    head = _pread(fd, 8, 8)
    cont, mlen = struct.unpack("<Ii", head)
    if cont != 0xFFFFFFFF or mlen <= 0 or mlen > ipc_end:
        raise LayoutError("bad schema message")
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(head + _pread(fd, mlen, 16)))
    except (pa.ArrowException, ValueError) as e:
        raise LayoutError(f"schema unreadable ({e})") from e
    batches: list[list[Node]] = []
    lengths = []
    for off, meta_len, body_len in blocks:
        if off < 8 or meta_len < 8 or body_len < 0 or off + meta_len + body_len > ipc_end:
            raise LayoutError("a record batch lies outside the file")
        meta = _pread(fd, meta_len, off)
        start = 8 if _u("<I", meta, 0) == 0xFFFFFFFF else 4
        msg = start + _u("<I", meta, start)
        header_type = _field(meta, msg, 1)
        if header_type is None or _u("<B", meta, header_type) != 3:  # 3: RecordBatch
            raise LayoutError("a block is not a record batch")
        hp = _field(meta, msg, 2)
        if hp is None:
            raise LayoutError("record batch without header")
        rb = _deref(meta, hp)
        lp = _field(meta, rb, 0)
        length = _u("<q", meta, lp) if lp is not None else 0
        if _field(meta, rb, 3) is not None:  # compressed body
            supported = False
        nodes = _structs(meta, rb, 1, "<qq")
        bufs = _structs(meta, rb, 2, "<qq")
        cols: list[Node] = []
        if supported:
            try:
                for f in schema:
                    cols.append(_build(f.type, nodes, bufs, off + meta_len, body_len))
            except NotImplementedError:
                supported, cols = False, []
        batches.append(cols)
        lengths.append(length)
    starts = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=starts[1:])
    if supported:
        _cache_offsets(fd, [n for cols in batches for n in cols])
    return Layout(schema, batches, starts, supported)


#: offsets read with a file's layout, at most this many bytes per file (the rest is read per ``take``)
CACHE_OFFSETS_BYTES = 1 << 20


def _cache_offsets(fd: int, nodes: list[Node]) -> None:
    budget = CACHE_OFFSETS_BYTES
    todo = list(nodes)
    while todo:
        n = todo.pop()
        todo.extend(n.children)
        if _kind(n.type) in ("binary", "large_binary", "list", "large_list"):
            off, blen = n.buffers[1]
            if blen <= budget:
                n.cached[1] = np.frombuffer(_pread(fd, blen, off), np.uint8)
                budget -= blen


# --- ranged reads --------------------------------------------------------------------------------
@dataclass
class Runs:
    """Element ranges [start, end) of one field, each in node ``node[i]`` read through ``fd[i]``."""

    fd: list[int]
    node: list[Node]
    start: np.ndarray
    end: np.ndarray


def _read_into(fd: int, dst: memoryview, off: int) -> None:
    if len(dst) and os.preadv(fd, [dst], off) != len(dst):
        raise LayoutError(f"file ends before byte {off + len(dst)}")


def _gather_bytes(runs: Runs, buf: int, width: int) -> pa.Buffer:
    """Bytes [start*width, end*width) of buffer ``buf`` of each run, concatenated."""
    n = (runs.end - runs.start) * width
    out = bytearray(int(n.sum()))
    view = memoryview(out)
    pos = 0
    for fd, node, s, k in zip(runs.fd, runs.node, (runs.start * width).tolist(), n.tolist()):
        off, blen = node.buffers[buf]
        if s + k > blen:
            raise LayoutError("rows past the end of their buffer")
        _read_into(fd, view[pos : pos + k], off + s)
        pos += k
    return pa.py_buffer(out)


#: offsets are read once per record batch (the span the asked rows cover) when that span is this small
SPAN_BYTES = 1 << 20


def _gather_spans(runs: Runs, buf: int, width: int) -> np.ndarray:
    """Like ``_gather_bytes`` (as uint8), but one read per node for the span its runs cover, when small:
    the offsets of a batch's asked rows cost one ``pread``, not one per run."""
    spans: dict[int, list] = {}
    for fd, node, s, e in zip(runs.fd, runs.node, runs.start.tolist(), runs.end.tolist()):
        sp = spans.setdefault(id(node), [fd, node, s, e])
        sp[2], sp[3] = min(sp[2], s), max(sp[3], e)
    data: dict[int, tuple[int, np.ndarray] | None] = {}
    for k, (fd, node, lo, hi) in spans.items():
        off, blen = node.buffers[buf]
        if buf in node.cached:
            if hi * width > blen:
                raise LayoutError("rows past the end of their buffer")
            data[k] = (0, node.cached[buf])
            continue
        if (hi - lo) * width > SPAN_BYTES:
            data[k] = None
            continue
        if hi * width > blen:
            raise LayoutError("rows past the end of their buffer")
        data[k] = (lo, np.frombuffer(_pread(fd, (hi - lo) * width, off + lo * width), np.uint8))
    parts = []
    for fd, node, s, e in zip(runs.fd, runs.node, runs.start.tolist(), runs.end.tolist()):
        got = data[id(node)]
        if got is None:
            parts.append(np.frombuffer(_gather_bytes(Runs([fd], [node], np.array([s]), np.array([e])), buf, width), np.uint8))
        else:
            lo, arr = got
            parts.append(arr[(s - lo) * width : (e - lo) * width])
    return np.concatenate(parts) if parts else np.zeros(0, np.uint8)


def _gather_bits(runs: Runs, buf: int, when_nulls: bool) -> pa.Buffer | None:
    """Bits [start, end) of bitmap ``buf`` of each run, repacked from bit 0; None when no run has nulls."""
    if when_nulls and not any(n.nulls for n in runs.node):
        return None
    parts = []
    for fd, node, s, e in zip(runs.fd, runs.node, runs.start.tolist(), runs.end.tolist()):
        off, blen = node.buffers[buf]
        if when_nulls and (node.nulls == 0 or blen == 0):
            parts.append(np.ones(e - s, np.uint8))
            continue
        lo, hi = s // 8, (e + 7) // 8
        if hi > blen:
            raise LayoutError("bitmap shorter than its rows")
        raw = np.frombuffer(_pread(fd, hi - lo, off + lo), np.uint8)
        parts.append(np.unpackbits(raw, bitorder="little")[s - lo * 8 : e - lo * 8])
    bits = np.concatenate(parts) if parts else np.zeros(0, np.uint8)
    return pa.py_buffer(np.packbits(bits, bitorder="little").tobytes())


def _offsets(runs: Runs, buf: int, dtype: type) -> tuple[pa.Buffer, Runs]:
    """The runs' offsets rebased from 0, and the child element runs they point at."""
    width = np.dtype(dtype).itemsize
    raw = _gather_spans(Runs(runs.fd, runs.node, runs.start, runs.end + 1), buf, width)
    offs = raw.view(dtype).astype(np.int64)
    counts = (runs.end - runs.start + 1)
    firsts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    lasts = firsts + counts - 1
    cstart, cend = offs[firsts], offs[lasts]
    child_len = np.array([n.children[0].length if n.children else n.buffers[2][1] for n in runs.node], np.int64)
    steps = np.diff(offs)
    steps[lasts[:-1]] = 0  # the jump between two runs is not a length
    if (cstart < 0).any() or (cend > child_len).any() or (steps < 0).any():
        raise LayoutError("offsets out of order or past their child")
    lens = np.diff(offs)
    keep = np.ones(len(lens), bool)
    keep[lasts[:-1]] = False
    out = np.zeros(int(keep.sum()) + 1, np.int64)
    np.cumsum(lens[keep], out=out[1:])
    return pa.py_buffer(out.astype(dtype).tobytes()), Runs(runs.fd, [n.children[0] if n.children else n for n in runs.node],
                                                             cstart, cend)


def read_runs(t: pa.DataType, runs: Runs) -> pa.Array:
    """The elements of every run, concatenated, as one array of type ``t``."""
    kind = _kind(t)
    length = int((runs.end - runs.start).sum())
    validity = _gather_bits(runs, 0, when_nulls=True)
    if kind == "bool":
        return pa.Array.from_buffers(t, length, [validity, _gather_bits(runs, 1, when_nulls=False)])
    if kind == "fixed":
        return pa.Array.from_buffers(t, length, [validity, _gather_bytes(runs, 1, t.bit_width // 8)])
    if kind in ("binary", "large_binary"):
        offs, child = _offsets(runs, 1, np.int32 if kind == "binary" else np.int64)
        return pa.Array.from_buffers(t, length, [validity, offs, _gather_bytes(child, 2, 1)])
    if kind in ("list", "large_list"):
        offs, child = _offsets(runs, 1, np.int32 if kind == "list" else np.int64)
        return pa.Array.from_buffers(t, length, [validity, offs], children=[read_runs(t.value_type, child)])
    if kind == "fixed_list":
        k = t.list_size
        child = Runs(runs.fd, [n.children[0] for n in runs.node], runs.start * k, runs.end * k)
        return pa.Array.from_buffers(t, length, [validity], children=[read_runs(t.value_type, child)])
    if kind == "struct":
        kids = [read_runs(t.field(i).type, Runs(runs.fd, [n.children[i] for n in runs.node], runs.start, runs.end))
                for i in range(t.num_fields)]
        return pa.Array.from_buffers(t, length, [validity], children=kids)
    raise NotImplementedError(str(t))


def runs_of(fds: list[int], layouts: list[Layout], which: np.ndarray, rows: np.ndarray,
            column: int) -> Runs:
    """Runs of consecutive rows of one batch, in the order asked, for top-level ``column``."""
    batch = np.empty(len(rows), np.int64)
    local = np.empty(len(rows), np.int64)
    for i, lay in enumerate(layouts):  # one searchsorted per fragment
        sel = np.flatnonzero(which == i)
        b = np.searchsorted(lay.starts, rows[sel], side="right") - 1
        batch[sel], local[sel] = b, rows[sel] - lay.starts[b]
    cut = np.flatnonzero((np.diff(which) != 0) | (np.diff(batch) != 0) | (np.diff(local) != 1)) + 1
    first = np.concatenate([[0], cut]).astype(np.int64)
    last = np.concatenate([cut, [len(rows)]]).astype(np.int64)
    w, b = which[first].tolist(), batch[first].tolist()
    return Runs([fds[i] for i in w], [layouts[i].batches[j][column] for i, j in zip(w, b)],
                 local[first], local[first] + (last - first))
