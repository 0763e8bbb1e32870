"""Per-row, per-column content hashes: what lets a random cold read verify exactly the rows it returns.

Why: the page-granular reader (DataFusion / arrow-rs) does not check Parquet page CRCs, and the file's
sha256 costs a whole-file read. So each lake file carries one hidden column, ``_lb_hash``, written with
the rows at snapshot: for every row, one 64-bit digest per data column (``fixed_size_binary(8 x k)``,
the column order in the file's key-value metadata). A reader checks the digests of the rows and
columns it returned: cost proportional to the bytes read, whichever reader served them. The column is
not in the Delta schema, so Delta readers (deltalake, polars, DuckDB, Spark) never see it.

The digest is defined here, on Arrow's physical layout, with numpy arithmetic modulo 2**64 (splitmix64's
finaliser, position-bound sums over list and string elements): stable across library versions (no
library hash), vectorised (no per-row Python), and meant to detect damage, not adversaries.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

HASH_COLUMN = "_lb_hash"
META_KEY = b"lakebuffer.row_hash"
VERSION = 1
_NULL = np.uint64(0x6A09E667F3BCC908)
_GOLD = np.uint64(0x9E3779B97F4A7C15)
_LEN = np.uint64(0xC2B2AE3D27D4EB4F)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
#: rows are hashed in slices of about this many Arrow bytes (memory: a few uint64 copies of a slice)
SLICE_BYTES = 256 * 1024


class Unhashable(TypeError):
    """A column type the digest does not cover (the file is then written without ``_lb_hash``)."""


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, in place on a uint64 array (a fresh one is passed in)."""
    x ^= x >> np.uint64(30)
    x *= _M1
    x ^= x >> np.uint64(27)
    x *= _M2
    x ^= x >> np.uint64(31)
    return x


def _valid(arr: pa.Array) -> np.ndarray | None:
    if arr.null_count == 0:
        return None
    return arr.is_valid().to_numpy(zero_copy_only=False)


def _normalize(arr: pa.Array) -> pa.Array:
    """One physical form per logical value: dictionaries decoded, view and large types cast down."""
    t = arr.type
    if pa.types.is_dictionary(t):
        return _normalize(arr.dictionary_decode())
    if pa.types.is_string_view(t) or pa.types.is_large_string(t):
        return arr.cast(pa.string())
    if pa.types.is_binary_view(t) or pa.types.is_large_binary(t):
        return arr.cast(pa.binary())
    if pa.types.is_large_list(t) or pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        return arr.cast(pa.list_(t.value_field))
    return arr


def _words(arr: pa.Array) -> np.ndarray:
    """A fixed-width array's values as uint64 (one per slot; nulls' slots hold whatever was there)."""
    t = arr.type
    if pa.types.is_boolean(t):
        return pc.fill_null(arr, False).cast(pa.uint8()).to_numpy(zero_copy_only=False).astype(np.uint64)
    width = getattr(t, "bit_width", None)
    if width not in (8, 16, 32, 64, 128):
        raise Unhashable(f"type {t}")
    buf = arr.buffers()[1]
    lanes = max(1, width // 64)
    dt = np.dtype(f"u{min(width, 64) // 8}")
    raw = np.frombuffer(buf, dtype=dt, count=(arr.offset + len(arr)) * lanes)[arr.offset * lanes:]
    if lanes == 1:
        return raw.astype(np.uint64)
    pairs = raw.reshape(-1, 2).astype(np.uint64)
    return _mix(pairs[:, 0].copy()) ^ pairs[:, 1]


_P = 0xD6E8FEB86659FD93  # odd: invertible modulo 2**64
_P_INV = pow(_P, -1, 2**64)
_POW_CACHE = 1 << 20  # powers kept for segments' elements up to this many (16 MiB for both tables)
_pows: dict[int, np.ndarray] = {}


def _powers(base: int, n: int) -> np.ndarray:
    """base**j mod 2**64 for j < n (cached up to ``_POW_CACHE``)."""
    have = _pows.get(base)
    if have is None or len(have) < n:
        size = max(n, 1024) if n > _POW_CACHE else min(_POW_CACHE, max(n, 2 * len(have) if have is not None else 4096))
        arr = np.full(size, base, np.uint64)
        arr[0] = 1
        np.cumprod(arr, out=arr)
        if size > _POW_CACHE:
            return arr
        _pows[base] = have = arr
    return have[:n]


def prepare() -> None:
    """Compute the power tables at their full size now (~5 ms, 16 MiB): an open with cold rows calls this
    in the background, so the first cold take does not grow them by doubling (fresh pages each time:
    ~16 ms of a resumed node's first ``sample + get``)."""
    for base in (_P, _P_INV):
        _powers(base, _POW_CACHE)


def _segmented(elements: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per segment [offsets[i], offsets[i+1]): sum over its elements of (e + GOLD) x P**position, mod
    2**64, bound to its length and mixed. One multiply and one running sum per element: the powers run
    over the whole slice, and each segment's sum is brought back to its own start by P**-start (P is
    odd, so any one changed element always changes the sum)."""
    base = int(offsets[0])
    e = elements[base:int(offsets[-1])]
    n = len(e)
    h = e + _GOLD
    h *= _powers(_P, n)
    cs = np.zeros(n + 1, np.uint64)
    np.cumsum(h, out=cs[1:])
    starts = offsets[:-1].astype(np.int64) - base
    ends = offsets[1:].astype(np.int64) - base
    seg = (cs[ends] - cs[starts]) * _powers(_P_INV, n + 1)[starts]
    return _mix(seg + (ends - starts).astype(np.uint64) * _LEN + _GOLD)


def _elements(arr: pa.Array) -> np.ndarray:
    """Pre-digest values of a child array: raw words for fixed width, full digests for the rest."""
    arr = _normalize(arr)
    t = arr.type
    if pa.types.is_nested(t) or pa.types.is_binary(t) or pa.types.is_string(t):
        return digest(arr)
    out = _words(arr)
    valid = _valid(arr)
    if valid is not None:
        out[~valid] = _NULL
    return out


def digest(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """One uint64 per row of ``arr`` (see the module); ``Unhashable`` for types it does not cover."""
    if isinstance(arr, pa.ChunkedArray):
        if arr.num_chunks == 0:
            return np.zeros(0, np.uint64)
        return np.concatenate([digest(c) for c in arr.chunks])
    arr = _normalize(arr)
    t = arr.type
    n = len(arr)
    if pa.types.is_string(t) or pa.types.is_binary(t):
        offsets = np.frombuffer(arr.buffers()[1], np.int32, count=arr.offset + n + 1)[arr.offset:].astype(np.int64)
        data = arr.buffers()[2]
        raw = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
        if len(raw) < int(offsets[-1]):
            raw = np.zeros(int(offsets[-1]), np.uint8)
        out = _segmented(raw.astype(np.uint64), offsets)
    elif pa.types.is_list(t) or pa.types.is_map(t) or pa.types.is_fixed_size_list(t):
        if pa.types.is_fixed_size_list(t):
            offsets = (np.arange(n + 1, dtype=np.int64) + arr.offset) * t.list_size
        else:
            offsets = np.asarray(arr.offsets).astype(np.int64)
        base = int(offsets[0])
        child = arr.values.slice(base, int(offsets[-1]) - base)  # only this slice's elements
        out = _segmented(_elements(child), offsets - base)
    elif pa.types.is_struct(t):
        out = np.zeros(n, np.uint64)
        for i in range(t.num_fields):
            out += _mix(digest(arr.field(i)) + np.uint64(((i + 1) * int(_GOLD)) % 2**64))
        out = _mix(out)
    elif pa.types.is_null(t):
        return np.full(n, _NULL, np.uint64)
    else:
        out = _mix(_words(arr) + _GOLD)
    valid = _valid(arr)
    if valid is not None:
        out[~valid] = _NULL
    return out


def hashable(schema: pa.Schema) -> bool:
    """Whether every column of ``schema`` has a digest (else files of it carry no ``_lb_hash``)."""
    try:
        for f in schema:
            digest(pa.array([], f.type))
    except (Unhashable, pa.ArrowNotImplementedError, pa.ArrowInvalid):
        return False
    return True


def table_digests(table: pa.Table | pa.RecordBatch, columns: list[str]) -> np.ndarray:
    """(rows, len(columns)) uint64 digests; each column hashed in row slices of ~``SLICE_BYTES`` (its
    temporaries stay in cache and out of fresh pages: 8 MiB ones hashed 10x slower here)."""
    n = table.num_rows
    out = np.empty((n, len(columns)), np.uint64)
    for j, c in enumerate(columns):
        col = table.column(c)
        step = max(1, int(n * SLICE_BYTES // max(1, col.nbytes))) if n else 1
        for a in range(0, n, step):
            part = col.slice(a, step)
            out[a:a + len(part), j] = digest(part)
    return out


def hash_column(table: pa.Table | pa.RecordBatch, columns: list[str]) -> pa.Array:
    """The ``_lb_hash`` values of ``table``: each row's digests as 8 x len(columns) little-endian bytes."""
    d = table_digests(table, columns).astype("<u8", copy=False)
    width = 8 * len(columns)
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), len(d), [None, pa.py_buffer(d.tobytes())])


def schema_with_hash(schema: pa.Schema) -> pa.Schema:
    """The Parquet file schema: the rows' columns, ``_lb_hash`` last, its column list in the metadata."""
    cols = [f.name for f in schema]
    meta = dict(schema.metadata or {})
    meta[META_KEY] = json.dumps({"v": VERSION, "columns": cols}).encode()
    return schema.append(pa.field(HASH_COLUMN, pa.binary(8 * len(cols)), nullable=False)).with_metadata(meta)


def hashed_columns(metadata: dict | None) -> list[str] | None:
    """The column list of a file's ``_lb_hash`` (from its key-value metadata), or None (an older file)."""
    raw = (metadata or {}).get(META_KEY)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    if doc.get("v") != VERSION:
        return None
    return [str(c) for c in doc.get("columns", [])]


def file_digest_columns(schema: pa.Schema) -> list[str] | None:
    """The columns a file's ``_lb_hash`` covers, from its Arrow schema alone (readers such as DataFusion
    drop the key-value metadata): every other column, in file order, when the width says so; else None."""
    if HASH_COLUMN not in schema.names:
        return None
    t = schema.field(HASH_COLUMN).type
    names = [n for n in schema.names if n != HASH_COLUMN]
    if not pa.types.is_fixed_size_binary(t) or t.byte_width != 8 * len(names):
        return None
    return names


def mismatches(table: pa.Table, columns: list[str], hashed: list[str]) -> np.ndarray:
    """Row numbers of ``table`` whose ``columns`` do not match their recorded digests (``_lb_hash``)."""
    rec = table.column(HASH_COLUMN)
    if isinstance(rec, pa.ChunkedArray):
        rec = rec.combine_chunks()
    n = len(rec)
    stored = np.frombuffer(rec.buffers()[1], dtype="<u8", count=(rec.offset + n) * len(hashed))
    stored = stored[rec.offset * len(hashed):].reshape(n, len(hashed))
    bad = np.zeros(n, bool)
    if rec.null_count:
        bad |= ~rec.is_valid().to_numpy(zero_copy_only=False)
    if columns:  # in row slices, as written: a whole take's temporaries in fresh pages cost 3-4x the hashing
        got = table_digests(table, list(columns))
        bad |= (got != stored[:, [hashed.index(c) for c in columns]]).any(axis=1)
    return np.flatnonzero(bad)
