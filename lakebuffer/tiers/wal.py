"""The write-ahead log: one Arrow IPC segment per hot batch, so an acknowledged push survives kill -9.

A segment is written to ``<id>.arrow.tmp`` and renamed into place, so a torn write never looks
like a segment; the index entry for the batch is written after the rename, so a segment with no
index entry is a push that was never acknowledged (recovery deletes it). A segment is removed as
soon as its batch is in the warm tier.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa

from ..errors import CorruptionError


class WriteAheadLog:
    def __init__(self, path: Path, sync: bool = False) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.sync = sync

    def _segment(self, batch_id: int) -> Path:
        return self.path / f"{batch_id:016d}.arrow"

    def write(self, batch_id: int, table: pa.Table) -> None:
        final = self._segment(batch_id)
        tmp = final.with_suffix(".arrow.tmp")
        with pa.OSFile(str(tmp), "wb") as f:  # native writes: no Python bytes copies per buffer
            with pa.ipc.new_file(f, table.schema) as w:
                w.write_table(table)
        if self.sync:
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        os.replace(tmp, final)
        if self.sync:
            fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def read(self, batch_id: int) -> pa.Table:
        seg = self._segment(batch_id)
        try:
            with pa.memory_map(str(seg)) as src:
                return pa.ipc.open_file(src).read_all()
        except (OSError, pa.ArrowInvalid) as e:
            raise CorruptionError(f"WAL segment {seg} is missing or torn: {e}") from e

    def remove(self, batch_id: int) -> None:
        self._segment(batch_id).unlink(missing_ok=True)

    def ids(self) -> list[int]:
        """Batch ids of complete segments (read-only: a ``.tmp`` may be a push writing right now)."""
        return sorted(int(p.stem) for p in self.path.iterdir() if p.suffix == ".arrow" and p.stem.isdigit())

    def remove_torn(self) -> int:
        """Delete ``.tmp`` leftovers of torn writes; only while no writer runs (open, fsck --repair)."""
        torn = list(self.path.glob("*.arrow.tmp"))
        for p in torn:
            p.unlink(missing_ok=True)
        return len(torn)

    def nbytes(self) -> int:
        total = 0
        for p in self.path.glob("*.arrow"):
            try:
                total += p.stat().st_size
            except FileNotFoundError:  # removed by a write-back meanwhile
                pass
        return total
