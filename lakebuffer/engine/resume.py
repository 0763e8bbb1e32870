"""A lazy resume: a fresh directory takes the run's rows as cold batches, from the lake's metadata columns.

``ReplayBuffer.open(empty_dir, lake=, run_id=)`` used to copy every row of the run's last snapshot into
the warm tier before ``open`` returned (reading the lake's bytes twice: the sha256 pass and the decode).
With ``restore="lazy"`` (the default) or ``"cold"`` it reads, of each Parquet row group of the run's live
files, only the ``key`` and the metadata columns (the catalog's ``meta``: a few bytes a row next to the
token lists), and records each row group as one cold batch: its keys, its metadata and each row's lake
location (file, row in file) in one index write (``KeyIndex.record_cold_batch``). ``sample``/``get`` are
served from the cold tier at once; ``"lazy"`` then warms the batches on the write-back worker, newest
first, while they fit ``disk_limit_gb`` (``ColdPromotion.warm``), each waiting while cold reads run
(``promotion.YIELD_S``, at most ``YIELD_TIMES`` times: the reads come first), ``"cold"`` leaves them in the lake
until a read promotes them (``promote_cold_reads``).

Integrity: the metadata columns are read with Parquet page checksums (every page read is checked); a
file's whole-file sha256 is checked the first time a data read of the cold tier opens it, not here
(open is O(metadata), DESIGN v3). Crash safety: a batch is indexed whole or not at all, and the
``restoring`` mark (the snapshot id) stays until the last row group is indexed, so an interrupted
resume resumes, skipping the rows already indexed (also those an earlier eager attempt installed).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import CorruptionError, LakeError
from ..index import BatchInfo
from .state import BufferState, with_batch

#: the fields of a lake file entry a cold batch's locations keep (as ``engine/diskbudget`` records them)
ENTRY_FIELDS = ("path", "bytes", "run_id", "policy_bucket", "min_key", "max_key", "min_policy_version",
                "max_policy_version")


def _open(store: Any, entry: dict) -> pq.ParquetFile:
    url = store.url_of(entry["path"])
    try:
        return pq.ParquetFile(store.pafs.open_input_file(store.abs(entry["path"])), page_checksum_verification=True)
    except FileNotFoundError:
        raise CorruptionError(f"lake file {url} listed in the Delta log is missing; restore it from a copy of the "
                              "lake (`lakebuffer fsck` lists every damaged file)") from None
    except pa.ArrowInvalid as e:
        raise CorruptionError(f"lake file {url} is not readable Parquet ({e}); restore it from a copy of the lake") from e
    except OSError as e:  # the store did not answer: an outage, not damage
        raise LakeError(f"cannot read lake file {url} ({e}); open again once the lake is reachable") from e


def _meta(t: pa.Table, s: BufferState) -> pa.Table:
    """The metadata columns of rows read from a lake file, in the buffer's types (``run_id`` is a partition)."""
    n = t.num_rows
    arrays = []
    for c in s.meta_columns:
        f = s.schema.field(c)
        if c in t.column_names:
            col = t.column(c)
            arrays.append(col if col.type.equals(f.type) else col.cast(f.type))
        elif c == "run_id":
            arrays.append(pa.repeat(pa.scalar(s.run_id, f.type), n))
        else:
            arrays.append(pa.nulls(n, f.type))
    return pa.Table.from_arrays(arrays, schema=pa.schema([s.schema.field(c) for c in s.meta_columns]))


class LakeSide(Exception):
    """What ``read_meta`` raised (the lake's error), told apart from the index's own damage."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def lake_side(items: Iterable[Any]) -> Iterator[Any]:
    """``items``, with the lake's ``LakeError``/``CorruptionError`` wrapped in ``LakeSide``."""
    try:
        yield from items
    except (LakeError, CorruptionError) as e:
        raise LakeSide(e) from e


def read_meta(lake: Any, manifest: dict, columns: list[str]) -> Iterator[tuple[dict, np.ndarray, int, pa.Table]]:
    """The lake side, one Parquet row group at a time: (file entry kept in the locations, the rows' row
    numbers in the file, the group's uncompressed bytes, its ``key`` + ``columns``). Only these reads
    touch the lake (the caller bounds them by its deadline on a helper thread)."""
    want = list(dict.fromkeys(["key", *columns]))
    for entry in manifest["files"]:
        ref = {k: entry[k] for k in ENTRY_FIELDS if k in entry}
        pf = _open(lake.store, entry)
        cols = [c for c in want if c in set(pf.schema_arrow.names)]
        start = 0
        for g in range(pf.metadata.num_row_groups):
            rg = pf.metadata.row_group(g)
            try:
                t = pf.read_row_group(g, columns=cols, use_threads=False)
            except pa.ArrowInvalid as e:
                raise CorruptionError(f"lake file {lake.store.url_of(entry['path'])} cannot be decoded ({e}); "
                                      "restore it from a copy of the lake") from e
            except OSError as e:
                raise LakeError(f"cannot read lake file {lake.store.url_of(entry['path'])} ({e}); open again once "
                                "the lake is reachable") from e
            yield ref, np.arange(start, start + rg.num_rows, dtype=np.int64), int(rg.total_byte_size), t
            start += rg.num_rows


class _MirrorSide:
    """The local mirror where ``read_meta`` expects a lake (it reads ``.store`` only)."""

    def __init__(self, mirror: Any) -> None:
        self.store = mirror.store


#: lake files an eager restore copies at once (the sha256 of one overlaps the copy of the other)
MIRROR_THREADS = 2


def bytes_to_copy(mirror: Any, manifest: dict) -> int:
    """Bytes of the manifest's files not in the mirror yet."""
    return sum(int(e["bytes"]) for e in manifest["files"] if not mirror.has(e["path"]))


def copy_and_read_meta(lake: Any, mirror: Any, manifest: dict, columns: list[str]
                       ) -> Iterator[tuple[dict, np.ndarray, int, pa.Table]]:
    """``read_meta`` for ``restore="eager"``: each file is first copied into the local mirror (hashed as
    it is copied, ``tiers/mirror.py``; the next file's copy overlaps this one's indexing), then its key and
    metadata columns are read from the copy. An interrupted restore copies only what is missing."""
    local = _MirrorSide(mirror)
    for entry in mirror.copy(lake.store, manifest["files"], MIRROR_THREADS):
        yield from read_meta(local, {"files": [entry]}, columns)


def index_cold(s: BufferState, groups: Iterable[tuple[dict, np.ndarray, int, pa.Table]], sid: int,
               total: int, progress: Any = None, first: bool = False) -> list[int]:
    """Index the rows of ``groups`` (``read_meta``'s, of snapshot ``sid``) as cold batches, one per row
    group; rows the index already holds are skipped (not looked up on a ``first`` attempt: a fresh
    directory's index holds none). The new batch ids, in lake order."""
    done = 0
    added: list[int] = []
    for ref, rows, group_bytes, t in groups:
        n = t.num_rows
        keys = t.column("key").to_pylist()
        found = np.zeros(n, bool) if first else s.index.lookup(keys)[2]
        done += n
        if found.any():  # indexed by an earlier, interrupted attempt
            keep = ~found
            t, rows = t.filter(pa.array(keep)), rows[keep]
            keys = [k for k, f in zip(keys, found.tolist()) if not f]
        if keys:
            meta = _meta(t, s)
            bid = s.index.reserve_batch()
            info = BatchInfo(batch_id=bid, tier="cold", rows=len(keys), files=[ref["path"]],
                             nbytes=group_bytes * len(keys) // max(n, 1), snapshot=sid)
            s.index.record_cold_batch(info, keys, meta, [ref], np.zeros(len(keys), np.int64), rows)
            with s.lock:
                s.batches[bid] = info
                s.cold.admit(bid, info.rows, info.nbytes, [ref])
                s.catalog.insert_meta(with_batch(meta, bid).select(s.catalog.meta_schema.names))
            added.append(bid)
        if progress is not None:
            progress(done, total)
    return added
