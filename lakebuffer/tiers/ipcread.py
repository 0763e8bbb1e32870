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
from typing import Protocol

import numpy as np
import pyarrow as pa

from ..pagecache import in_page_cache, will_need
from . import vmread

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


class RangeCheck(Protocol):
    """What a file's bytes must pass before they are read (a warm fragment checked chunk by chunk
    instead of whole: ``tiers.chunkcheck.ChunkCheck``)."""

    def __call__(self, pos: np.ndarray, n: np.ndarray) -> None: ...

    def pending(self, pos: np.ndarray, n: np.ndarray) -> list[tuple[int, int, int]]:
        """What is left to read and check before ranges [pos, pos + n) may be read."""
        ...

    def announce(self, runs: list[tuple[int, int, int]]) -> None:
        """A hint that ``runs`` will be verified soon (start reading them)."""
        ...

    def verify(self, runs: list[tuple[int, int, int]]) -> None: ...


#: per open file descriptor: the check its bytes must pass before they are read; ``_pread`` and
#: ``read_ranges`` run it
_CHECKS: dict[int, RangeCheck] = {}
#: a read that checks several chunk runs first announces them all (``RangeCheck.announce``): their disk
#: reads then overlap instead of following one another (60 warm rows from disk after a reopen: 9.6 vs 14.3 ms)
ANNOUNCE = True


def set_check(fd: int, check: RangeCheck) -> None:
    _CHECKS[fd] = check


def clear_check(fd: int, check: RangeCheck) -> None:
    """Forget ``fd``'s check if it is still ``check`` (called before the file is closed)."""
    if _CHECKS.get(fd) is check:
        _CHECKS.pop(fd, None)


def _checked(fds: np.ndarray, pos: np.ndarray, n: np.ndarray) -> None:
    """Run the checks of the files that have one over the ranges about to be read from them: what
    each leaves to check is found first, announced when it is more than one run, then checked."""
    todo: list[tuple[RangeCheck, list[tuple[int, int, int]]]] = []
    if len(fds) == 1 or (fds == fds[0]).all():
        c = _CHECKS.get(int(fds[0]))
        if c is not None:
            todo.append((c, c.pending(pos, n)))
    else:
        order = np.argsort(fds, kind="stable")
        f = fds[order]
        cuts = np.flatnonzero(f[1:] != f[:-1]) + 1
        for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), len(f)]):
            c = _CHECKS.get(int(f[a]))
            if c is not None:
                idx = order[a:b]
                todo.append((c, c.pending(pos[idx], n[idx])))
    if ANNOUNCE and sum(len(runs) for _c, runs in todo) > 1:
        for c, runs in todo:
            if runs:
                c.announce(runs)
    for c, runs in todo:
        c.verify(runs)


def _pread(fd: int, n: int, off: int) -> bytes:
    if _CHECKS and fd in _CHECKS:
        _CHECKS[fd](np.array([off], np.int64), np.array([n], np.int64))
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
    """Element ranges [start, end) of one field: run ``i`` lies in node ``node[of[i]]``, read through
    ``fd[of[i]]``. Nodes are listed once each (a call touches a few batches, many rows of each), so
    the planning below is numpy over runs and Python only over distinct nodes."""

    fd: np.ndarray  # per node: its file
    node: list[Node]
    of: np.ndarray  # per run: index into ``node``
    start: np.ndarray
    end: np.ndarray
    maps: tuple[np.ndarray, np.ndarray] | None = None  # per node: its file's map (address, bytes), if any

    def with_nodes(self, nodes: list[Node], start: np.ndarray, end: np.ndarray) -> Runs:
        """The same runs' elements in ``nodes`` (the children of ``node``), ranges ``start``..``end``."""
        return Runs(self.fd, nodes, self.of, start, end, self.maps)

    def source(self, idx: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
        """The file (and map) of node ``idx[i]`` for each i: what ``read_ranges`` reads from."""
        return self.fd[idx], None if self.maps is None else (self.maps[0][idx], self.maps[1][idx])


def one_run(fd: int, node: Node, start: int, end: int) -> Runs:
    """Elements [start, end) of ``node`` (a scan's chunk: one large range, one ``preadv``)."""
    return Runs(np.array([fd], np.int64), [node], np.zeros(1, np.int64), np.array([start], np.int64),
                np.array([end], np.int64))


def _buffer_at(runs: Runs, buf: int) -> tuple[np.ndarray, np.ndarray]:
    """(file offset, length) of buffer ``buf`` of each run's node."""
    off = np.array([n.buffers[buf][0] for n in runs.node], np.int64)
    blen = np.array([n.buffers[buf][1] for n in runs.node], np.int64)
    return off[runs.of], blen[runs.of]


#: two asked ranges of one file at most this many bytes apart are read by one ``preadv`` (the bytes
#: between them land in a scratch buffer): a system call costs about what copying a few KiB does
GAP_BYTES = 4096
_IOV_MAX = 512  # ranges per preadv (Linux allows 1,024 buffers)


#: a read of several ranges whose sampled ranges are not all in the page cache announces every range
#: first (``POSIX_FADV_WILLNEED``): the disk then serves them at once, not one page fault after another
#: (60 warm rows from disk: 3.7 vs 14.3 ms; the probe costs a hot read ~1%)
ANNOUNCE_READS = True


def _uncached(fds: np.ndarray, pos: np.ndarray, n: np.ndarray) -> bool:
    """Whether any of up to 4 ranges spread over the read (first byte each) is not in the page cache."""
    last = len(n) - 1
    return any(n[i] and not in_page_cache(int(fds[i]), int(pos[i]))
               for i in (sorted({0, last, last // 2, last // 4}) if last > 3 else range(last + 1)))


def read_ranges(fds: np.ndarray, pos: np.ndarray, n: np.ndarray,
                maps: tuple[np.ndarray, np.ndarray] | None = None) -> pa.Buffer:
    """Bytes [pos[i], pos[i] + n[i]) of file ``fds[i]`` for each i, concatenated in that order.

    With ``maps`` (each range's file mapped: address, bytes) every range is copied by one
    ``process_vm_readv`` (``vmread``: a truncated file is an error, not a signal). Else ranges of one
    file that lie within ``GAP_BYTES`` of each other are read by one ``preadv`` into their places in
    the output (a column of small values costs about one system call per file, not one per row). A
    short read (the file ends early) is ``LayoutError``.
    """
    total = int(n.sum())
    arr = np.empty(total, np.uint8)  # the process heap, reused (a fresh pool block faults in its pages)
    out = pa.py_buffer(arr)
    if total == 0:
        return out
    if _CHECKS:
        _checked(np.asarray(fds, np.int64), np.asarray(pos, np.int64), np.asarray(n, np.int64))
    if ANNOUNCE_READS and len(n) > 1 and _uncached(fds, pos, n):
        will_need(zip(fds.tolist(), pos.tolist(), n.tolist()))
    if maps is not None and vmread.available() and maps[0].all():
        if ((pos < 0) | (pos + n > maps[1])).any():
            raise LayoutError("a range lies outside its file")
        try:
            if vmread.copy(arr, maps[0] + pos, n):
                return out
        except vmread.VmReadError as e:
            raise LayoutError(str(e)) from e
    view = memoryview(arr)
    dst = np.zeros(len(n) + 1, np.int64)
    np.cumsum(n, out=dst[1:])
    if total >= len(n) * GAP_BYTES:  # ranges this long are seldom within a gap of each other: read in order
        for fdi, d, o, m in zip(fds.tolist(), dst.tolist(), pos.tolist(), n.tolist()):
            if m and os.preadv(fdi, [view[d : d + m]], o) != m:
                raise LayoutError(f"file ends before byte {o + m}")
        return out
    keep = np.flatnonzero(n > 0)
    order = keep[np.lexsort((pos[keep], fds[keep]))]
    p, k, f = pos[order], n[order], fds[order]
    gap = p[1:] - (p[:-1] + k[:-1])
    new = np.ones(len(order), bool)  # a range starts a new read: another file, a gap too wide, an overlap
    new[1:] = (f[1:] != f[:-1]) | (gap < 0) | (gap > GAP_BYTES)
    if new.all():  # nothing to join: one preadv per range
        for fdi, d, o, m in zip(f.tolist(), dst[order].tolist(), p.tolist(), k.tolist()):
            if os.preadv(fdi, [view[d : d + m]], o) != m:
                raise LayoutError(f"file ends before byte {o + m}")
        return out
    new[np.arange(len(order)) % _IOV_MAX == 0] = True
    scratch = memoryview(bytearray(GAP_BYTES))
    iov: list[memoryview] = []
    fd0 = at = want = 0
    for is_new, fdi, d, o, m, g in zip(new.tolist(), f.tolist(), dst[order].tolist(), p.tolist(), k.tolist(),
                                      [0, *gap.tolist()]):
        if is_new:
            if iov and os.preadv(fd0, iov, at) != want:
                raise LayoutError(f"file ends before byte {at + want}")
            iov, fd0, at, want = [], fdi, o, 0
        elif g:
            iov.append(scratch[:g])
            want += g
        iov.append(view[d : d + m])
        want += m
    if os.preadv(fd0, iov, at) != want:
        raise LayoutError(f"file ends before byte {at + want}")
    return out


def _gather_bytes(runs: Runs, buf: int, width: int) -> pa.Buffer:
    """Bytes [start*width, end*width) of buffer ``buf`` of each run, concatenated."""
    off, blen = _buffer_at(runs, buf)
    s = runs.start * width
    n = (runs.end - runs.start) * width
    if (s < 0).any() or (n < 0).any() or (s + n > blen).any():
        raise LayoutError("rows past the end of their buffer")
    fd, maps = runs.source(runs.of)
    return read_ranges(fd, off + s, n, maps)


def _spread(at: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """For runs of ``lens`` elements starting at source index ``at``: every element's source index."""
    ends = np.cumsum(lens)
    return np.repeat(at - (ends - lens), lens) + np.arange(int(ends[-1]) if len(ends) else 0, dtype=np.int64)


#: offsets are read once per record batch (the span the asked rows cover) when that span is this small
SPAN_BYTES = 1 << 20
#: the offsets a layout holds in memory are joined per call (one vectorised gather) up to this many bytes,
#: or up to ``JOIN_RATIO`` times the bytes asked (past that, each run slices them: a few huge fragments)
JOIN_BYTES = 1 << 20
JOIN_RATIO = 64


def _gather_elems(runs: Runs, buf: int, dtype: type) -> np.ndarray:
    """Elements [start, end) of buffer ``buf`` (of ``dtype``) of each run, concatenated: from the bytes
    the layout holds (list/string offsets, the usual case: no system call), else one read per node of
    the span its runs cover when that is small (``SPAN_BYTES``), else one read per run."""
    width = np.dtype(dtype).itemsize
    lens = runs.end - runs.start
    cached = [n.cached.get(buf) for n in runs.node]
    if all(c is not None for c in cached):
        size = np.array([len(c) for c in cached], np.int64) // width
        if int(size.sum()) * width <= max(JOIN_BYTES, JOIN_RATIO * width * int(lens.sum())):
            if ((runs.start < 0) | (lens < 0) | (runs.end > size[runs.of])).any():
                raise LayoutError("rows past the end of their buffer")
            joined = (np.concatenate(cached) if len(cached) > 1 else cached[0]).view(dtype)
            return joined[_spread((np.cumsum(size) - size)[runs.of] + runs.start, lens)]
    nu = len(runs.node)
    off, blen = _buffer_at(runs, buf)
    if ((runs.start < 0) | (lens < 0) | (runs.end * width > blen)).any():
        raise LayoutError("rows past the end of their buffer")
    lo = np.full(nu, np.iinfo(np.int64).max, np.int64)
    hi = np.zeros(nu, np.int64)
    np.minimum.at(lo, runs.of, runs.start)
    np.maximum.at(hi, runs.of, runs.end)
    lo = np.minimum(lo, hi)
    if all(c is None for c in cached) and ((hi - lo) * width <= SPAN_BYTES).all():  # one read per node's span
        node_off = np.array([n.buffers[buf][0] for n in runs.node], np.int64)
        joined = np.frombuffer(read_ranges(runs.fd, node_off + lo * width, (hi - lo) * width, runs.maps), dtype)
        base = np.cumsum(hi - lo) - (hi - lo)
        return joined[_spread(base[runs.of] + runs.start - lo[runs.of], lens)]
    parts = []  # mixed or large: per run, from memory where held, else by its own read
    for u, s, e, o in zip(runs.of.tolist(), runs.start.tolist(), runs.end.tolist(), off.tolist()):
        c = cached[u]
        if c is not None:
            parts.append(c[s * width : e * width])
        elif e > s:
            parts.append(np.frombuffer(_pread(int(runs.fd[u]), (e - s) * width, o + s * width), np.uint8))
    return (np.concatenate(parts) if parts else np.zeros(0, np.uint8)).view(dtype)


def _gather_bits(runs: Runs, buf: int, when_nulls: bool) -> pa.Buffer | None:
    """Bits [start, end) of bitmap ``buf`` of each run, repacked from bit 0; None when no run has nulls
    (``when_nulls``: a validity bitmap, absent or all-valid in a node without nulls)."""
    if when_nulls and not any(n.nulls for n in runs.node):
        return None
    nulls = np.array([n.nulls for n in runs.node], np.int64)[runs.of] if when_nulls else None
    off, blen = _buffer_at(runs, buf)
    read = blen > 0
    if nulls is not None:
        read &= nulls > 0
    lo, hi = runs.start // 8, (runs.end + 7) // 8
    if (read & ((lo < 0) | (hi > blen))).any():
        raise LayoutError("bitmap shorter than its rows")
    nbytes = np.where(read, hi - lo, 0)
    fd, maps = runs.source(runs.of)
    bits = np.unpackbits(np.frombuffer(read_ranges(fd, off + lo, nbytes, maps), np.uint8), bitorder="little")
    bits = np.append(bits, np.uint8(1))  # what a run without a bitmap reads: valid
    lens = runs.end - runs.start
    first_bit = np.zeros(len(lens), np.int64)
    np.cumsum(nbytes[:-1] * 8, out=first_bit[1:])
    idx = _spread(first_bit + runs.start - lo * 8, lens)
    idx[np.repeat(~read, lens)] = len(bits) - 1
    return pa.py_buffer(np.packbits(bits[idx], bitorder="little").tobytes())


def _offsets(runs: Runs, buf: int, dtype: type) -> tuple[pa.Buffer, Runs]:
    """The runs' offsets rebased from 0, and the child element runs they point at."""
    offs = _gather_elems(Runs(runs.fd, runs.node, runs.of, runs.start, runs.end + 1), buf, dtype).astype(np.int64)
    lasts = np.cumsum(runs.end - runs.start + 1) - 1
    cstart, cend = offs[lasts - (runs.end - runs.start)], offs[lasts]
    kids = [n.children[0] if n.children else n for n in runs.node]
    child_len = np.array([n.children[0].length if n.children else n.buffers[2][1] for n in runs.node], np.int64)
    lens = np.diff(offs)
    if len(lasts) > 1:
        lens[lasts[:-1]] = 0  # the jump between two runs is not a length
    if (cstart < 0).any() or (cend > child_len[runs.of]).any() or (lens < 0).any():
        raise LayoutError("offsets out of order or past their child")
    if len(lasts) > 1:
        lens = np.delete(lens, lasts[:-1])
    out = np.zeros(len(lens) + 1, dtype)
    np.cumsum(lens, out=out[1:])
    return pa.py_buffer(out), runs.with_nodes(kids, cstart, cend)


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
        child = runs.with_nodes([n.children[0] for n in runs.node], runs.start * k, runs.end * k)
        return pa.Array.from_buffers(t, length, [validity], children=[read_runs(t.value_type, child)])
    if kind == "struct":
        kids = [read_runs(t.field(i).type, runs.with_nodes([n.children[i] for n in runs.node], runs.start, runs.end))
                for i in range(t.num_fields)]
        return pa.Array.from_buffers(t, length, [validity], children=kids)
    raise NotImplementedError(str(t))


@dataclass
class Split:
    """Asked rows cut into runs of consecutive rows of one record batch, in the order asked."""

    fd: np.ndarray  # per distinct (file, batch): its file
    batch: list[tuple[Layout, int]]  # per distinct (file, batch)
    of: np.ndarray  # per run: index into ``batch``
    start: np.ndarray  # per run: first row in its batch
    end: np.ndarray
    maps: tuple[np.ndarray, np.ndarray] | None  # per distinct (file, batch): its file's map (address, bytes)

    def runs(self, column: int) -> Runs:
        """The runs of top-level ``column``."""
        return Runs(self.fd, [lay.batches[b][column] for lay, b in self.batch], self.of, self.start, self.end,
                    self.maps)


def split(fds: list[int], layouts: list[Layout], which: np.ndarray, rows: np.ndarray,
          maps: list[tuple[int, int]] | None = None) -> Split:
    """Row ``rows[i]`` of file ``which[i]`` for every i, cut into runs (vectorised: no per-row Python).
    ``maps``: each file's map (address, bytes; address 0: none), copied from instead of read."""
    fd = np.asarray(fds, np.int64)
    m = np.asarray(maps, np.int64).reshape(-1, 2) if maps else None
    if all(len(lay.batches) == 1 for lay in layouts):  # the usual fragment: one record batch: runs by file
        cut = np.flatnonzero((np.diff(which) != 0) | (np.diff(rows) != 1)) + 1
        first_row = np.concatenate([[0], cut])
        lens = np.diff(np.append(first_row, len(rows)))
        return Split(fd, [(lay, 0) for lay in layouts], which[first_row], rows[first_row], rows[first_row] + lens,
                     None if m is None else (m[:, 0], m[:, 1]))
    # which batch holds a row: one search over every file's batch starts, keyed by file
    nb = [len(lay.batches) for lay in layouts]
    allstarts = np.concatenate([lay.starts[:-1] for lay in layouts])
    first = np.zeros(len(layouts), np.int64)
    np.cumsum(nb[:-1], out=first[1:])
    keyed = np.repeat(np.arange(len(layouts), dtype=np.int64), nb) * (1 << 40) + allstarts
    g = np.searchsorted(keyed, which * (1 << 40) + rows, side="right") - 1
    batch, local = g - first[which], rows - allstarts[g]
    cut = np.flatnonzero((np.diff(which) != 0) | (np.diff(batch) != 0) | (np.diff(local) != 1)) + 1
    first_row = np.concatenate([[0], cut]).astype(np.int64)
    last_row = np.concatenate([cut, [len(rows)]]).astype(np.int64)
    pairs, of = np.unique(which[first_row] * (1 << 32) + batch[first_row], return_inverse=True)
    f = pairs >> 32
    return Split(fd[f], [(layouts[i], j) for i, j in zip(f.tolist(), (pairs & 0xFFFFFFFF).tolist())],
                 of.reshape(-1).astype(np.int64), local[first_row], local[first_row] + (last_row - first_row),
                 None if m is None else (m[f, 0], m[f, 1]))
