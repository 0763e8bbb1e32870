"""Verified reads of committed lake files: ``BlockReader`` (read-ahead, checksums, one row group at a
time), whole-file fetches checked against the manifest, and the row copies that commit and compaction
make from existing files.

Hand-written (moved as it was from ``lake.py``): it checks every byte against the manifest's sha256 /
crc32 before pyarrow decodes it (pyarrow's dataset reader has no such hook), and it reads ahead across
files within a byte budget. The Delta Lake issue replaces this module.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import CorruptionError
from ..schema import cast_to
from .fs import LakeFS
from .options import LakeOptions


def check_bytes(entry: dict, data: bytes) -> str | None:
    """What is wrong with ``data`` as the file ``entry`` describes (size, sha256), or None."""
    if len(data) != int(entry["bytes"]):
        return f"{len(data)} bytes, the manifest says {entry['bytes']}"
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry["sha256"]:
        return f"sha256 {digest}, the manifest says {entry['sha256']}"
    return None


def check_whole(entry: dict, data: bytes) -> str | None:
    """Block crc32s when the manifest has them (about twice as fast as sha256), else sha256."""
    blocks = entry.get("blocks") or {}
    bsize, crcs = int(blocks.get("bytes") or 0), blocks.get("crc32") or []
    if bsize <= 0 or len(crcs) != -(-len(data) // bsize) or len(data) != int(entry["bytes"]):
        return check_bytes(entry, data)
    view = memoryview(data)
    for i, want in enumerate(crcs):
        got = zlib.crc32(view[i * bsize : (i + 1) * bsize])
        if got != want:
            return f"bytes {i * bsize}-{min(len(data), (i + 1) * bsize)} have crc32 {got}, the manifest says {want}"
    return None


def fetch(store: LakeFS, entry: dict, *, verify: bool) -> bytes:
    """The whole file ``entry``, checked (``CorruptionError`` naming it) unless ``verify`` is False."""
    rel = entry["path"]
    try:
        data = store.cat(rel)
    except FileNotFoundError:
        raise CorruptionError(f"lake file {store.url_of(rel)} listed in a committed manifest is missing") from None
    if verify:
        problem = check_bytes(entry, data)
        if problem:
            raise CorruptionError(f"lake file {store.url_of(rel)} fails its checksum: {problem}")
    return data


class BlockReader:
    """Fetch the data files of a scan on a few threads, in file order, up to ``read_ahead_bytes``
    ahead of the consumer, verify them and hand out each row group as soon as its bytes are there.

    By default each file is one GET (checked by sha256): moto, like some other S3 servers, reads the
    whole object for every ranged GET, so ranges cost O(object size) each there. With
    ``ranged_reads=True`` files are fetched in their 8 MiB checksum blocks (footer block first, each
    block checked by crc32), so decoding the first row groups of a big file overlaps fetching the
    rest: better on real S3 with few, large (compacted) files."""

    def __init__(self, store: LakeFS, options: LakeOptions, entries: list[dict], verify: bool) -> None:
        self.store = store
        self.options = options
        self.entries = entries
        self.verify = verify
        self.tasks: list[tuple[int, int, int, int | None]] = []  # (file, start, end, crc32 | None)
        self.first: list[int] = []  # index of each file's first task
        self.block: list[int] = []  # block size per file (0: one task for the whole file)
        for fi, e in enumerate(entries):
            size = int(e["bytes"])
            blocks = e.get("blocks") or {}
            bsize, crcs = int(blocks.get("bytes") or 0), list(blocks.get("crc32") or [])
            self.first.append(len(self.tasks))
            if options.ranged_reads and bsize > 0 and crcs and len(crcs) == -(-size // bsize):
                ranges = [(i * bsize, min(size, (i + 1) * bsize), crc) for i, crc in enumerate(crcs)]
                ranges = ranges[-1:] + ranges[:-1]  # the footer first
                self.block.append(bsize)
            else:
                ranges = [(0, size, None)]
                self.block.append(0)
            self.tasks.extend((fi, a, b, c) for a, b, c in ranges)
        self.futures: dict[int, Any] = {}
        self.buffers: dict[int, Any] = {}
        self.submitted = 0
        self.ahead = 0

    def _fetch(self, idx: int) -> None:
        fi, start, end, crc = self.tasks[idx]
        entry = self.entries[fi]
        rel = entry["path"]
        url = self.store.url_of(rel)
        try:
            if start == 0 and end == int(entry["bytes"]) and crc is None:
                data = self.store.cat_range(rel)
            else:
                data = self.store.cat_range(rel, start, end)
        except FileNotFoundError:
            raise CorruptionError(f"lake file {url} listed in a committed manifest is missing") from None
        if len(data) != end - start:
            raise CorruptionError(f"lake file {url} is shorter than the manifest says ({entry['bytes']} bytes)")
        if self.verify:
            if crc is not None:
                got = zlib.crc32(data)
                if got != crc:
                    raise CorruptionError(f"lake file {url} fails its checksum: bytes {start}-{end} have crc32 {got}, the manifest says {crc}")
            else:
                problem = check_whole(entry, data)
                if problem:
                    raise CorruptionError(f"lake file {url} fails its checksum: {problem}")
        if self.block[fi] == 0:
            self.buffers[fi] = data  # the whole file: use the bytes as they are
        else:
            self.buffers[fi][start:end] = np.frombuffer(data, dtype=np.uint8)

    def _submit_next(self) -> None:
        idx = self.submitted
        fi, start, end, _ = self.tasks[idx]
        if fi not in self.buffers and self.block[fi]:
            self.buffers[fi] = np.empty(int(self.entries[fi]["bytes"]), dtype=np.uint8)
        self.futures[idx] = self.pool.submit(self._fetch, idx)
        self.submitted += 1
        self.ahead += end - start

    def _wait(self, idx: int) -> None:
        while self.submitted <= idx:
            self._submit_next()
        fut = self.futures.pop(idx, None)
        if fut is not None:
            fut.result()
            _, start, end, _ = self.tasks[idx]
            self.ahead -= end - start
        while self.submitted < len(self.tasks) and self.ahead < self.options.read_ahead_bytes:
            self._submit_next()

    def _wait_range(self, fi: int, start: int, end: int) -> None:
        first, bsize = self.first[fi], self.block[fi]
        if bsize == 0:
            self._wait(first)
            return
        nblocks = -(-int(self.entries[fi]["bytes"]) // bsize)
        for b in range(start // bsize, -(-end // bsize)):
            self._wait(first if b == nblocks - 1 else first + 1 + b)  # task order: last block, then 0..n-2

    def row_groups(self) -> Iterator[tuple[dict, pq.ParquetFile, int]]:
        """(manifest entry, open Parquet file, row group index), in file order, each verified."""
        if not self.tasks:
            return
        # whole files: one GET at a time (s3fs splits large ones itself), so the first file arrives as
        # early as possible and decoding it overlaps fetching the next; blocks: a few in parallel
        workers = max(1, self.options.read_concurrency) if any(self.block) else 1
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lakebuffer-fetch")
        try:
            for fi, entry in enumerate(self.entries):
                size = int(entry["bytes"])
                url = self.store.url_of(entry["path"])
                if size < 12:
                    raise CorruptionError(f"lake file {url} is too small to be Parquet ({size} bytes)")
                self._wait_range(fi, size - 8, size)
                buf = self.buffers[fi]
                view = memoryview(buf)
                footer = int.from_bytes(view[size - 8 : size - 4], "little")
                if view[size - 4 : size].tobytes() != b"PAR1" or footer + 12 > size:
                    raise CorruptionError(f"lake file {url} has no valid Parquet footer")
                self._wait_range(fi, size - 8 - footer, size)
                try:
                    pf = pq.ParquetFile(pa.BufferReader(pa.py_buffer(buf)))
                except (pa.ArrowInvalid, OSError) as e:
                    raise CorruptionError(f"lake file {url} is not readable Parquet: {e}") from e
                md = pf.metadata
                for i in range(md.num_row_groups):
                    rg = md.row_group(i)
                    lo, hi = size, 0
                    for j in range(rg.num_columns):
                        c = rg.column(j)
                        off = c.data_page_offset
                        if c.has_dictionary_page and c.dictionary_page_offset and 0 < c.dictionary_page_offset < off:
                            off = c.dictionary_page_offset
                        lo, hi = min(lo, off), max(hi, off + c.total_compressed_size)
                    if rg.num_columns:
                        self._wait_range(fi, lo, min(hi, size))
                    yield entry, pf, i
                del pf, buf, view
                self.buffers.pop(fi, None)
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.buffers.clear()


def files_with_keys(store: LakeFS, manifest: dict | None, keys: pa.Array) -> list[dict]:
    """Live files of ``manifest`` holding any of ``keys`` (reads only the key column)."""
    if not manifest or not len(keys):
        return []
    out = []
    for f in manifest["files"]:
        t = store.io(f"reading keys of {f['path']}", pq.read_table, store.abs(f["path"]), columns=["key"], filesystem=store.pafs)
        if pc.any(pc.is_in(t.column("key"), value_set=keys)).as_py():
            out.append(f)
    return out


def copy_rows(
    store: LakeFS,
    options: LakeOptions,
    entries: list[dict],
    writer: Any,
    hidden: pa.Array,
    schema: pa.Schema,
    progress: Callable[[int], None] | None = None,
) -> None:
    """Stream the rows of verified files into ``writer`` (a ``writer.Writer``), without keys in ``hidden``."""
    for entry, pf, i in BlockReader(store, options, entries, verify=True).row_groups():
        t = pf.read_row_group(i, use_threads=False)
        if len(hidden) and "key" in t.column_names:
            t = t.filter(pc.invert(pc.is_in(t.column("key"), value_set=hidden)))
        if t.num_rows:
            for b in cast_to(t, schema).to_batches():
                writer.add(b)
        if progress is not None:
            progress(int(entry["bytes"]) // max(pf.metadata.num_row_groups, 1))
