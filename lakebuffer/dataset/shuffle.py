"""The torch-free core: :func:`iter_batches` streams exactly ``batch_size``-row record batches.

Rows are shuffled in blocks of a shuffle buffer (~64 MiB of rows by default): the buffer fills with
zero-copy read batches, is permuted, and every full batch is emitted with each row copied once.
Memory is bounded: a shard holds at most its read batches (sized from the row width, ~16 MiB), its
shuffle buffer and one output batch, however large the lake.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .collate import one_batch, pool_empty
from .filters import compile_predicate
from .sharding import plan_shard, seed_int
from .sources import as_source, resolve_columns

_READ_BYTES = 16 << 20  # target size of one read batch
_SHUFFLE_BYTES = 64 << 20  # default shuffle buffer size


@dataclass
class IterStats:
    """What one pass did: rows and batches out, units read, the most rows held at once."""

    rows: int = 0
    batches: int = 0
    units: int = 0
    mode: str = ""
    max_rows_held: int = 0
    read_rows: int = 0
    shuffle_rows: int = 0
    extra: dict = field(default_factory=dict)


def _fast_list(t: pa.DataType) -> bool:
    return (pa.types.is_list(t) or pa.types.is_large_list(t)) and (
        pa.types.is_integer(t.value_type) or pa.types.is_floating(t.value_type))


class _Gather:
    """Rows of several record batches gathered in any order into new batches, each row copied once.

    pyarrow's ``take`` on a list column builds an index per *element*; for token lists a slice copy
    per row is ~10x faster, so long primitive lists take that path and everything else ``take``.
    """

    def __init__(self, batches: list[pa.RecordBatch]) -> None:
        self.schema = batches[0].schema
        self.base = np.cumsum([0] + [b.num_rows for b in batches])
        self.cols: list[Any] = []
        for i, f in enumerate(self.schema):
            chunks = [b.column(i) for b in batches]
            fast = _fast_list(f.type) and all(c.null_count == 0 and c.values.null_count == 0 for c in chunks)
            if fast:
                offs = [np.asarray(c.offsets, dtype=np.int64) for c in chunks]
                n_vals = sum(int(o[-1] - o[0]) for o in offs)
                fast = n_vals >= 16 * int(self.base[-1])  # short lists: take's per-element path is fine
            if fast:
                self.cols.append(("list", [c.values.to_numpy() for c in chunks],
                                  np.concatenate([o[:-1] for o in offs]), np.concatenate([o[1:] for o in offs])))
            else:
                self.cols.append(("arrow", pa.chunked_array(chunks, type=f.type)))

    def take(self, idx: np.ndarray) -> pa.RecordBatch:
        chunk: list[int] | None = None
        arrays = []
        for (kind, *rest), f in zip(self.cols, self.schema):
            if kind == "arrow":
                arrays.append(rest[0].take(pa.array(idx)).combine_chunks())
                continue
            values, starts, ends = rest
            if chunk is None:
                chunk = (np.searchsorted(self.base, idx, side="right") - 1).tolist()
            s, e = starts[idx], ends[idx]
            vt = f.type.value_type
            buf, flat = pool_empty(int((e - s).sum()), values[0].dtype)
            if len(idx):
                np.concatenate([values[c][a:b] for c, a, b in zip(chunk, s.tolist(), e.tolist())], out=flat)
            child = pa.Array.from_buffers(vt, len(flat), [None, buf])
            offsets = np.zeros(len(idx) + 1, dtype=np.int64 if pa.types.is_large_list(f.type) else np.int32)
            np.cumsum(e - s, out=offsets[1:])
            arrays.append(pa.Array.from_buffers(f.type, len(idx), [None, pa.py_buffer(offsets)], children=[child]))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


class _Drain:
    """Yield ``count`` rows of ``pending`` as batches, one at a time; ``rest`` is what is left after."""

    def __init__(self, pending: list[pa.RecordBatch], held: int, count: int, batch_size: int,
                 rng: np.random.Generator | None) -> None:
        self.pending, self.held, self.count, self.batch_size, self.rng = pending, held, count, batch_size, rng
        self.rest: list[pa.RecordBatch] = []

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        count, bs = self.count, self.batch_size
        if self.rng is None:
            table = pa.Table.from_batches(self.pending)
            self.pending = []
            for i in range(0, count, bs):
                yield one_batch(table.slice(i, min(bs, count - i)))
            rest = table.slice(count)
            self.rest = rest.to_batches() if rest.num_rows else []
            return
        perm = self.rng.permutation(self.held)
        g = _Gather(self.pending)
        self.pending = []
        if count < self.held:  # carried over: copied first, so the read batches are freed with g
            self.rest = [g.take(perm[count:])]
        for i in range(0, count, bs):
            yield g.take(perm[i : min(i + bs, count)])


def _rebatch(batches: Iterable[pa.RecordBatch], batch_size: int, rng: np.random.Generator | None,
             shuffle_rows: Callable[[pa.RecordBatch], int], drop_last: bool, stats: IterStats) -> Iterator[pa.RecordBatch]:
    """Exactly ``batch_size`` rows per batch; with ``rng``, shuffled in blocks of the shuffle buffer.

    Shuffling fills the buffer with ``target`` rows (zero-copy read batches), permutes it and emits
    every full batch, each row copied once; only the last partial batch's rows are carried over.
    Memory: at most ``target`` rows plus one read batch, plus the batch being built.
    """
    pending: list[pa.RecordBatch] = []
    held = 0
    target = batch_size
    if rng is not None:
        target = 0
    for b in batches:
        if b.num_rows == 0:
            continue
        if not target:
            target = max(batch_size, shuffle_rows(b))
            stats.shuffle_rows = target
        pending.append(b)
        held += b.num_rows
        stats.max_rows_held = max(stats.max_rows_held, held)
        if held < target:
            continue
        emit = held // batch_size * batch_size
        drain = _Drain(pending, held, emit, batch_size, rng)
        pending = []
        yield from drain
        pending = drain.rest
        held -= emit
    if held:
        end = held if not drop_last else held // batch_size * batch_size
        yield from _Drain(pending, held, end, batch_size, rng)


def _sizes(src: Any) -> tuple[int, int]:
    """(read batch bytes, shuffle buffer bytes): the defaults, within a source's memory budget when it
    has one (a buffer: a read batch of 1/16 of it, as its own scans, and a shuffle buffer of half)."""
    budget = getattr(src, "memory_bytes", lambda: None)()
    if not budget:
        return _READ_BYTES, _SHUFFLE_BYTES
    return min(_READ_BYTES, max(budget // 16, 1 << 20)), min(_SHUFFLE_BYTES, max(budget // 2, 4 << 20))


def iter_batches(
    source: Any,
    where: str | pc.Expression | None = None,
    columns: Sequence[str] | None = None,
    batch_size: int = 256,
    *,
    shuffle: bool = False,
    seed: int = 0,
    epoch: int = 0,
    shard: int = 0,
    num_shards: int = 1,
    shard_by: str = "auto",
    shuffle_buffer: int | None = None,
    read_rows: int | None = None,
    drop_last: bool = False,
    stats: IterStats | None = None,
) -> Iterator[pa.RecordBatch]:
    """Stream shard ``shard`` of ``num_shards`` of ``source`` as record batches of ``batch_size`` rows.

    The torch-free core of :class:`RolloutDataset`. Over all shards of one ``(seed, epoch)`` every
    matching row comes out exactly once. ``shuffle`` permutes the unit order (with the epoch's seed)
    and rows within a sliding buffer of ``shuffle_buffer`` rows (default: ~64 MiB of rows).
    ``read_rows`` is the read granularity (default: ~16 MiB of rows). ``stats`` (an ``IterStats``)
    is filled as the pass goes.
    """
    if batch_size <= 0:
        raise ValueError("batch_size must be positive")
    src = as_source(source)
    cols = resolve_columns(src, columns)
    pred = compile_predicate(where, src.schema)
    stats = stats if stats is not None else IterStats()
    units, row_shard, mode = plan_shard(src.units(), shard, num_shards, seed=seed, epoch=epoch,
                                        shuffle=shuffle, shard_by=shard_by)
    stats.mode, stats.units = mode, len(units)
    width = src.row_bytes(cols)
    read_bytes, shuffle_bytes = _sizes(src)
    rows = read_rows or (int(min(max(read_bytes / width, 64), 65536)) if width else 4096)
    stats.read_rows = rows

    def shuffle_rows(first: pa.RecordBatch) -> int:
        if shuffle_buffer:
            return int(shuffle_buffer)
        w = width or (first.nbytes / max(first.num_rows, 1))
        return int(min(max(shuffle_bytes / max(w, 1), 1024), 1 << 20))

    rng = np.random.default_rng(seed_int(seed, epoch, shard, num_shards)) if shuffle else None
    batches = src.read(units, columns=cols, predicate=pred, batch_rows=rows, shard=row_shard)
    for b in _rebatch(batches, batch_size, rng, shuffle_rows, drop_last, stats):
        stats.rows += b.num_rows
        stats.batches += 1
        yield b
