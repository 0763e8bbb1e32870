"""Training integration: the buffer and the lake as datasets (PyTorch, Ray Data).

Everything is built on one torch-free core, :func:`iter_batches`, which streams ``pa.RecordBatch``es
of exactly ``batch_size`` rows from a :class:`Source` (a live buffer, a lake, a read-only lake view,
any ``pyarrow.dataset.Dataset``, a table or a path).

Sharding. Every reader (a distributed rank times a DataLoader worker) is one of ``S`` shards and
computes the same plan from ``(seed, epoch)`` alone, so no coordination is needed; each row lands
in exactly one shard (see :mod:`.sharding`).

Predicates are DuckDB SQL strings (as in ``ReplayBuffer.sample``) or pyarrow expressions. Simple SQL
(comparisons, AND/OR/NOT, IN, BETWEEN, IS NULL over columns and literals) is translated to a pyarrow
expression and pushed into the Parquet scan (row-group and partition pruning); anything else is
evaluated exactly by DuckDB on the metadata columns of each record batch, and the payload is then
filtered in Arrow without ever passing through DuckDB (:mod:`.filters`, :mod:`lakebuffer.predicate`).

Memory is bounded: a shard holds at most its read batches (sized from the row width, ~16 MiB), its
shuffle buffer (~64 MiB by default) and one output batch, however large the lake.

Modules, one job each: :mod:`.sources` (what is read), :mod:`.filters` (predicates),
:mod:`.sharding` (who reads what), :mod:`.shuffle` (the batch stream), :mod:`.collate` (padding),
:mod:`.torch` (the PyTorch datasets), :mod:`.ray` (Ray Data).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .collate import one_batch, pad_collate, pad_lists
from .filters import Predicate, compile_predicate, sql_to_expression, sql_to_ray_expression
from .ray import to_ray
from .sharding import plan_shard
from .shuffle import IterStats, iter_batches
from .sources import ArrowDatasetSource, BufferSource, Source, Unit, as_source

if TYPE_CHECKING:
    from .torch import RolloutDataset, SamplingDataset

__all__ = [
    "ArrowDatasetSource",
    "BufferSource",
    "IterStats",
    "Predicate",
    "RolloutDataset",
    "SamplingDataset",
    "Source",
    "Unit",
    "as_source",
    "compile_predicate",
    "iter_batches",
    "one_batch",
    "pad_collate",
    "pad_lists",
    "plan_shard",
    "sql_to_expression",
    "sql_to_ray_expression",
    "to_ray",
]


def __getattr__(name: str) -> Any:
    """``RolloutDataset`` / ``SamplingDataset`` are built on first use (torch is imported only then).
    (``bench_dataset`` is in :mod:`lakebuffer.bench.dataset`: the bench sits above the dataset layer.)"""
    if name in ("RolloutDataset", "SamplingDataset"):
        from .torch import dataset_class

        cls = dataset_class(name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = cls
    return cls
