"""A Parquet column chunk's offset index (where each page starts, its size, its first row), decoded
with numpy in one pass instead of one Thrift object per page.

Why: a fresh node's first cold ``get`` parses the offset index of every file it touches; with 32 KiB
pages that is ~700 page locations a ``response_ids`` chunk, and fastparquet's Thrift decoder took 52
of the 209 ms of that first call (~0.15 ms a chunk; this decoder: BENCHMARKS.md "#23").

The layout decoded (Thrift compact protocol, as parquet-cpp, arrow-rs and parquet-mr write it):
``OffsetIndex{1: list<PageLocation>}`` with ``PageLocation{1: i64 offset, 2: i32 size, 3: i64
first_row}``, each field a one-byte header (delta 1) and a zigzag varint, each struct ended by a stop
byte. Anything else (other fields, another order, a long-form header) returns None and the caller uses
the Thrift decoder, which reads every valid layout.
"""

from __future__ import annotations

import numpy as np

_LIST_FIELD = 0x19  # field 1, type LIST
_STRUCT = 12
_I64, _I32 = 0x16, 0x15  # field delta 1, types I64 / I32
_TOKENS = 7  # terminal bytes of one location: header, varint end, header, varint end, header, varint end, stop


def decode(index: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(first row, offset, size) of each page, or None when ``index`` is not laid out as above."""
    buf = np.frombuffer(index, np.uint8)
    if len(buf) < 2 or buf[0] != _LIST_FIELD or buf[1] & 0x0F != _STRUCT:
        return None
    count, pos = int(buf[1]) >> 4, 2
    if count == 15:  # long form: the count follows as a varint
        count = shift = 0
        while True:
            if pos >= len(buf) or shift > 28:
                return None
            b = int(buf[pos])
            pos += 1
            count |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
    body = buf[pos:]
    ends = np.flatnonzero(body < 0x80)  # every token ends on a byte with the high bit clear
    if count == 0 or len(ends) < _TOKENS * count:
        return None
    tok = ends[:_TOKENS * count].reshape(count, _TOKENS)
    starts = np.empty_like(tok)
    starts[:, 0] = np.concatenate([[0], tok[:-1, 6] + 1])
    starts[:, 1:] = tok[:, :-1] + 1
    singles = tok[:, [0, 2, 4, 6]]
    if not ((starts[:, [0, 2, 4, 6]] == singles).all() and (body[tok[:, 0]] == _I64).all()
            and (body[tok[:, 2]] == _I32).all() and (body[tok[:, 4]] == _I64).all() and (body[tok[:, 6]] == 0).all()):
        return None
    # the three varints of each location: bytes starts[:, j] .. tok[:, j] for j = 1, 3, 5
    first = starts[:, [1, 3, 5]].ravel()
    last = tok[:, [1, 3, 5]].ravel()
    lengths = last - first + 1
    if (lengths > 10).any():
        return None
    at = np.repeat(first, lengths) + (np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths))
    shift = (at - np.repeat(first, lengths)).astype(np.uint64) * np.uint64(7)
    parts = (body[at].astype(np.uint64) & np.uint64(0x7F)) << shift
    raw = np.add.reduceat(parts, np.cumsum(lengths) - lengths)
    values = (raw >> np.uint64(1)).astype(np.int64) ^ -(raw & np.uint64(1)).astype(np.int64)  # zigzag
    values = values.reshape(count, 3)
    return values[:, 2].astype(np.int32), values[:, 0].copy(), values[:, 1].astype(np.int32)
