"""The PyTorch datasets: :class:`RolloutDataset` (epochs over a buffer or a lake) and
:class:`SamplingDataset` (online replay from any sampler).

Importing this module never imports torch: the public classes are built on first use by
:func:`dataset_class`, on torch's ``IterableDataset`` / ``Dataset`` when torch is installed (so
``DataLoader`` treats them right), on ``object`` otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import OptionError
from .collate import import_torch, one_batch
from .filters import compile_predicate
from .sharding import loader_worker, rank_world, seed_int
from .shuffle import IterStats, iter_batches
from .sources import as_source, resolve_columns

#: the module the public classes live in (pickle finds them there, DataLoader workers included)
PUBLIC_MODULE = "lakebuffer.dataset"
_CLASSES: dict[str, type] = {}


class _RolloutDataset:
    """A PyTorch ``IterableDataset`` of rollout batches from a buffer or a lake.

    Each item is one batch of ``batch_size`` rows: a ``pa.RecordBatch``, or ``collate(batch)``
    (e.g. :func:`pad_collate`). Use it with ``DataLoader(ds, batch_size=None, num_workers=k)``
    (or ``ds.loader(num_workers=k)``): the dataset batches, the loader must not.

    Rows are sharded over ``world_size`` ranks (default: torch.distributed's when initialised, else
    one) times the loader's workers; call ``set_epoch(e)`` before each epoch for a new, reproducible
    order (as with ``DistributedSampler``; with ``persistent_workers=True`` the workers keep the
    epoch they were started with). See the module docstring for how shards are assigned.

    ``source``: a ``ReplayBuffer``, a lake view (``ReplayBuffer.open_lake``), a ``Lake``, a
    ``pyarrow.dataset.Dataset``, a Parquet path or a table. ``where``: SQL or a pyarrow expression.
    Keyword-only: ``drop_last`` (drop each shard's short last batch), ``shard_by`` (``"auto"``,
    ``"unit"``, ``"row"``), ``shuffle_buffer`` (rows), ``read_rows`` (read granularity), ``unit``
    (``"file"`` or ``"row_group"`` for Parquet sources). Without torch installed it is a plain
    iterable (``iter_batches(worker_id, num_workers)`` gives a shard's record batches).
    """

    def __init__(
        self,
        source: Any,
        where: str | pc.Expression | None = None,
        columns: Sequence[str] | None = None,
        batch_size: int = 256,
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        collate: Callable[[pa.RecordBatch], Any] | None = None,
        *,
        drop_last: bool = False,
        shard_by: str = "auto",
        shuffle_buffer: int | None = None,
        read_rows: int | None = None,
        unit: str = "file",
    ) -> None:
        self._live = _is_live_buffer(source)
        self._owner_pid = os.getpid()
        self.source = as_source(source, unit=unit)
        self.columns = resolve_columns(self.source, columns)
        compile_predicate(where, self.source.schema)  # fail early on a bad predicate
        self.where = where
        if batch_size <= 0:
            raise ValueError("batch_size must be positive")
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        if (rank is None) != (world_size is None):
            raise ValueError("give both rank and world_size, or neither")
        if rank is None:
            rank, world_size = rank_world()
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} out of range for world_size {world_size}")
        self.rank, self.world_size = int(rank), int(world_size)
        self.collate = collate
        self.drop_last = drop_last
        self.shard_by = shard_by
        self.shuffle_buffer = shuffle_buffer
        self.read_rows = read_rows
        self.epoch = 0
        self.last_stats: IterStats | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def shard(self, worker_id: int | None = None, num_workers: int | None = None) -> tuple[int, int]:
        """``(shard, num_shards)`` of this rank and DataLoader worker."""
        if worker_id is None:
            worker_id, num_workers = loader_worker()
        return self.rank * num_workers + worker_id, self.world_size * num_workers

    def iter_batches(self, worker_id: int | None = None, num_workers: int | None = None) -> Iterator[pa.RecordBatch]:
        """The raw record batches of this rank and worker (what ``__iter__`` collates)."""
        if self._live:
            refuse_foreign_process(self._owner_pid, "RolloutDataset")
        shard, num_shards = self.shard(worker_id, num_workers)
        self.last_stats = IterStats()
        return iter_batches(
            self.source, self.where, self.columns, self.batch_size, shuffle=self.shuffle, seed=self.seed,
            epoch=self.epoch, shard=shard, num_shards=num_shards, shard_by=self.shard_by,
            shuffle_buffer=self.shuffle_buffer, read_rows=self.read_rows, drop_last=self.drop_last,
            stats=self.last_stats,
        )

    def __iter__(self) -> Iterator[Any]:
        for b in self.iter_batches():
            yield self.collate(b) if self.collate is not None else b

    def loader(self, num_workers: int = 0, **kwargs: Any):
        """A ``torch.utils.data.DataLoader`` over this dataset (``batch_size=None``)."""
        torch = import_torch()
        if torch is None:
            raise ImportError("RolloutDataset.loader needs torch: pip install 'lakebuffer[torch]'")
        if self._live and num_workers > 0:
            raise OptionError(_LIVE_WORKERS.format(what="RolloutDataset", n=f"num_workers={num_workers}"))
        return torch.utils.data.DataLoader(self, batch_size=None, num_workers=num_workers, **kwargs)


class _SamplingDataset:
    """Online replay: a map-style dataset whose item ``i`` is a fresh sample from any registered sampler.

    ``len(ds) == n_steps``; ``ds[i]`` calls ``buffer.sample(batch_size, where, sampler, columns,
    seed=f(seed, epoch, i), **sampler_options)`` and returns the batch as a ``pa.RecordBatch`` or
    ``collate(batch)``. Deterministic for a given buffer content, seed, epoch and step. The samples
    are drawn when the item is asked for, so rollouts pushed meanwhile are eligible. Use it in the
    process that owns the buffer: ``DataLoader(ds, batch_size=None, num_workers=0)`` or iterate it.
    """

    def __init__(
        self,
        buffer: Any,
        n_steps: int,
        batch_size: int,
        sampler: Any = "uniform",
        where: str | None = None,
        columns: Sequence[str] | None = None,
        seed: int = 0,
        collate: Callable[[pa.RecordBatch], Any] | None = None,
        **sampler_options: Any,
    ) -> None:
        if n_steps < 0 or batch_size <= 0:
            raise ValueError("n_steps must be >= 0 and batch_size positive")
        self.buffer = buffer
        self._live = _is_live_buffer(buffer)
        self._owner_pid = os.getpid()
        self.n_steps = int(n_steps)
        self.batch_size = int(batch_size)
        self.sampler = sampler
        self.where = where
        self.columns = list(columns) if columns is not None else None
        self.seed = int(seed)
        self.collate = collate
        self.sampler_options = sampler_options
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.n_steps

    def sample(self, step: int) -> pa.RecordBatch:
        if self._live:
            refuse_foreign_process(self._owner_pid, "SamplingDataset")
        table = self.buffer.sample(self.batch_size, where=self.where, sampler=self.sampler, columns=self.columns,
                                   seed=seed_int(self.seed, self.epoch, step), **self.sampler_options)
        return one_batch(table)

    def __getitem__(self, step: int) -> Any:
        if not -self.n_steps <= step < self.n_steps:
            raise IndexError(step)
        b = self.sample(step % self.n_steps)
        return self.collate(b) if self.collate is not None else b

    def __iter__(self) -> Iterator[Any]:
        for i in range(self.n_steps):
            yield self[i]


_LIVE_WORKERS = (
    "a {what} over a live ReplayBuffer cannot be read from another process ({n}): the buffer's DuckDB, "
    "RocksDB and locks belong to the process that opened it. Use num_workers=0, or snapshot and read "
    "the lake with workers: RolloutDataset(ReplayBuffer.open_lake(url), ...)"
)


def _is_live_buffer(source: Any) -> bool:
    from ..buffer import ReplayBuffer

    return isinstance(source, ReplayBuffer)


def refuse_foreign_process(owner_pid: int, what: str) -> None:
    """Raise ``OptionError`` when called in a process other than the one that opened the buffer
    (a forked DataLoader worker): reading a live buffer there would silently use copied state."""
    if os.getpid() != owner_pid:
        _, workers = loader_worker()
        n = f"num_workers={workers}" if workers > 1 else f"pid {os.getpid()}, opened in pid {owner_pid}"
        raise OptionError(_LIVE_WORKERS.format(what=what, n=n))


if TYPE_CHECKING:  # what type checkers see; at run time ``dataset_class`` builds them
    RolloutDataset = _RolloutDataset
    SamplingDataset = _SamplingDataset


def dataset_class(name: str) -> type:
    """The public ``RolloutDataset`` or ``SamplingDataset`` class, built once (see the module docstring)."""
    cls = _CLASSES.get(name)
    if cls is not None:
        return cls
    impl = {"RolloutDataset": _RolloutDataset, "SamplingDataset": _SamplingDataset}[name]
    torch = import_torch()
    if torch is None:
        base: type = object
    else:
        base = torch.utils.data.IterableDataset if name == "RolloutDataset" else torch.utils.data.Dataset
    cls = type(name, (impl, base), {"__module__": PUBLIC_MODULE, "__doc__": impl.__doc__, "__qualname__": name})
    return _CLASSES.setdefault(name, cls)
