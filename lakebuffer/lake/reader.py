"""Verified reads of committed lake files: whole-file fetches checked against the sha256 in the file's
name, a read-ahead reader handing out one row group at a time, and the key lookups of a delete.

Why by hand: Delta has no per-file checksum and pyarrow's dataset reader has no checksum hook, so a file
is checked as a whole before pyarrow decodes it (the Parquet page checksums the writer adds cover the
data pages only, not the footer, and a one-byte flip in a delta-rs file was read back silently in issue
14). ``ranged_reads=True`` trades that for streaming: pages are verified by their crc32 as pyarrow
decodes them (``page_checksum_verification``), the footer is not.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import CorruptionError
from . import runtime
from .checksums import check_bytes, stream_problem
from .fs import LakeFS
from .options import LakeOptions
from .verified import mark_verified

# check_bytes, stream_problem live in checksums.py (verified.py needs them too); callers may import them here

check_whole = check_bytes

STREAM_BLOCK_BYTES = 1 << 20  # fsspec's block size for a streamed file (reads are whole column chunks anyway)


def _missing(store: LakeFS, rel: str) -> CorruptionError:
    return CorruptionError(
        f"lake file {store.url_of(rel)} listed in the Delta log is missing; restore it from a copy of the lake "
        "(`lakebuffer fsck` lists every damaged file)"
    )


def _failed(store: LakeFS, rel: str, problem: str) -> CorruptionError:
    return CorruptionError(
        f"lake file {store.url_of(rel)} fails its checksum ({problem}); nothing was read from it. Restore "
        "the file from a copy of the lake, or rewrite the run from a buffer that still holds the rows"
    )


def fetch(store: LakeFS, entry: dict, *, verify: bool) -> bytes:
    """The whole file ``entry``, checked (``CorruptionError`` naming it) unless ``verify`` is False."""
    rel = entry["path"]
    try:
        data = store.cat(rel)
    except FileNotFoundError:
        raise _missing(store, rel) from None
    if verify:
        problem = check_bytes(entry, data)
        if problem:
            raise _failed(store, rel, problem)
        mark_verified(store, [entry])  # the dataset paths need not read it again in this process
    return data


def open_streamed(store: LakeFS, entry: dict, *, verify: bool) -> pq.ParquetFile:
    """A file too large to hold whole: hashed by streaming (checked like ``fetch``), then opened for
    reads by row group (ranged, page checksums verified as they are decoded)."""
    rel = entry["path"]
    try:
        if verify:
            problem = stream_problem(store, entry)
            if problem:
                raise _failed(store, rel, problem)
            mark_verified(store, [entry])
        # fsspec, as above, with no read cache: its default (s3fs: 50 MiB read ahead) held most of a
        # 35 MB file per open file, and a file object under a ParquetFile is freed only by the cycle
        # collector (143 MB held after a delete read 25 files): callers ``close_file`` when done
        f = store.io(f"reading {rel}", store.fs.open, store.abs(rel), "rb", block_size=STREAM_BLOCK_BYTES,
                     cache_type="none")
        return pq.ParquetFile(f, page_checksum_verification=verify)
    except FileNotFoundError:
        raise _missing(store, rel) from None
    except (pa.ArrowInvalid, OSError) as e:
        raise CorruptionError(f"lake file {store.url_of(rel)} is not readable Parquet: {e}") from e


def close_file(pf: pq.ParquetFile) -> None:
    """Close the file under ``pf`` now (a streamed file object sits in a reference cycle: left to the
    collector, its buffers outlive the read)."""
    pf.close(force=True)


def open_verified(store: LakeFS, options: LakeOptions, entry: dict, *, verify: bool = True) -> pq.ParquetFile:
    """A lake file opened for reading, checked against its name: fetched whole when it is at most
    ``options.whole_file_bytes``, else hashed by streaming and read by row group."""
    if int(entry["bytes"]) > options.whole_file_bytes:
        return open_streamed(store, entry, verify=verify)
    return open_parquet(store, entry, fetch(store, entry, verify=verify))


def open_parquet(store: LakeFS, entry: dict, data: bytes) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(pa.BufferReader(pa.py_buffer(data)))
    except (pa.ArrowInvalid, OSError) as e:
        raise CorruptionError(f"lake file {store.url_of(entry['path'])} is not readable Parquet: {e}") from e


class FileReader:
    """The files of a scan in order, fetched one at a time up to ``LakeOptions.ahead_bytes`` ahead of
    the consumer (so decoding one file overlaps fetching the next), each checked whole; files larger
    than ``whole_file_bytes`` are hashed by streaming when their turn comes and read by row group."""

    def __init__(self, store: LakeFS, options: LakeOptions, entries: list[dict], verify: bool) -> None:
        self.store = store
        self.options = options
        self.entries = entries
        self.verify = verify

    def _ranged(self) -> Iterator[tuple[dict, pq.ParquetFile, int]]:
        for entry in self.entries:
            url = self.store.url_of(entry["path"])
            try:
                f = self.store.pafs.open_input_file(self.store.abs(entry["path"]))
                pf = pq.ParquetFile(f, page_checksum_verification=self.verify)
            except FileNotFoundError:
                raise CorruptionError(f"lake file {url} listed in the Delta log is missing") from None
            except (pa.ArrowInvalid, OSError) as e:
                raise CorruptionError(f"lake file {url} is not readable Parquet: {e}") from e
            for i in range(pf.metadata.num_row_groups):
                yield entry, pf, i

    def row_groups(self) -> Iterator[tuple[dict, pq.ParquetFile, int]]:
        """(entry, open Parquet file, row group index), in file order, each file verified."""
        if self.options.ranged_reads:
            yield from self._ranged()
            return
        if not self.entries:
            return
        # one GET at a time, ahead of decoding: the first file arrives as early as possible and decoding
        # it overlaps fetching the next (several in parallel only split the same bandwidth)
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lakebuffer-fetch")
        futures: dict[int, Future] = {}
        whole = self.options.whole_file_bytes
        ahead = 0
        nxt = 0
        try:
            for fi, entry in enumerate(self.entries):
                while nxt < len(self.entries) and (nxt <= fi or ahead < self.options.ahead_bytes):
                    if int(self.entries[nxt]["bytes"]) <= whole:
                        futures[nxt] = runtime.submit(pool, functools.partial(fetch, verify=self.verify), self.store, self.entries[nxt])
                        ahead += int(self.entries[nxt]["bytes"])
                    nxt += 1
                if fi in futures:
                    data = futures.pop(fi).result()
                    ahead -= int(entry["bytes"])
                    pf = open_parquet(self.store, entry, data)
                    del data
                else:
                    pf = open_streamed(self.store, entry, verify=self.verify)
                try:
                    for i in range(pf.metadata.num_row_groups):
                        yield entry, pf, i
                finally:
                    close_file(pf)
                del pf
        finally:
            for fut in futures.values():
                fut.cancel()
            pool.shutdown(wait=True, cancel_futures=True)


def read_group(store: LakeFS, entry: dict, pf: pq.ParquetFile, i: int, columns: list[str] | None = None) -> pa.Table:
    """Row group ``i`` of a lake file; a decoding error (a page checksum on ranged reads, a damaged
    page or header) is a ``CorruptionError`` naming the file, never a raw Arrow error."""
    try:
        return pf.read_row_group(i, columns=columns, use_threads=False)
    except (pa.ArrowInvalid, OSError) as e:
        raise CorruptionError(f"lake file {store.url_of(entry['path'])} cannot be decoded ({e}); restore it from a copy of the lake") from e


def key_range_hit(entry: dict, sorted_keys: list[str]) -> bool:
    """Whether the file's key range (from its Delta stats) holds one of ``sorted_keys``: a delete
    fetches only files that may hold a deleted key, not every file between the smallest and the
    largest (keys are sequential per run, so a bucket's files have narrow ranges)."""
    kmin, kmax = entry.get("min_key"), entry.get("max_key")
    if kmin is None or kmax is None:
        return True
    i = bisect.bisect_left(sorted_keys, kmin)
    return i < len(sorted_keys) and sorted_keys[i] <= kmax


def holds_any(pf: pq.ParquetFile, keys: pa.Array) -> bool:
    if "key" not in pf.schema_arrow.names:
        return False
    return bool(pc.any(pc.is_in(pf.read(columns=["key"]).column("key"), value_set=keys)).as_py())
