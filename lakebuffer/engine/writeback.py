"""Write-back (hot -> warm), eviction scheduling, and THE one install-fragment path.

``FragmentInstaller.install`` is the only code that puts a new warm fragment into service:
reserve a batch id, stage the rows in the warm tier, describe them (``BatchInfo``), record keys,
location and metadata in the index in one write, then publish the fragment. Push of an oversized
batch, restore from the lake and fsck's rebuild all go through it; the index write always comes
before the publish, so a crash in between leaves an unpublished fragment recovery drops, never
a visible row the index does not know. The install is noted in the index before the fragment is
written (``begin_install``), so recovery knows that fragment is a crash's leftover and not rows a
damaged index lost.

Write-back moves existing hot batches instead (they already have index entries), then the index,
the warm version and the hot tier change in one step under the engine's lock. A batch of at least
``PROMOTE_BYTES`` whose WAL segment is on disk is *promoted*: the segment becomes its warm fragment
by a hard link (``WarmTier.adopt``), so its bytes are written once on ingest (issue 17). Smaller
batches are coalesced into one written fragment of about ``FRAGMENT_BYTES`` (a second write, but of
small batches only), so the tier does not fill up with tiny files.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pyarrow as pa

from ..index import BatchInfo, KeyIndex
from ..tiers import Staged, WarmTier, table_bytes
from .budget import EVICT_HIGH, EVICT_LOW, Budget
from .state import BufferState, with_batch
from .tasks import P1

FRAGMENT_BYTES = 8 << 20  # small evicted batches are coalesced into fragments of about this size
PROMOTE_BYTES = 1 << 20  # a batch this large becomes its own fragment: its WAL segment, hard-linked

#: ``publish(staged, info, meta)``: make an installed fragment visible (``meta`` has ``_batch``)
Publish = Callable[[Staged, BatchInfo, pa.Table], None]


class FragmentInstaller:
    """Install tables as new warm fragments (see the module docstring)."""

    def __init__(self, index: KeyIndex, warm: WarmTier, meta_columns: Sequence[str],
                 publish: Publish | None = None) -> None:
        self.index = index
        self.warm = warm
        self.meta_columns = list(meta_columns)
        self._publish = publish or (lambda staged, info, meta: warm.publish(staged))

    def install(self, table: pa.Table, *, snapshot: int | None = None, batch_id: int | None = None,
                meta: pa.Table | None = None) -> BatchInfo:
        """Store ``table`` as one fragment under a new batch id (or ``batch_id``, to rebuild one).

        ``meta`` overrides the metadata recorded (fsck keeps the index's own: its replay counts
        are kept apart from the pushed ``sample_count``).
        """
        bid = self.index.reserve_batch() if batch_id is None else batch_id
        self.index.begin_install(bid)  # recovery drops this fragment only if the install never finished
        staged = self.warm.stage(table)
        info = BatchInfo(batch_id=bid, tier="warm", rows=table.num_rows, fragment=staged.part,
                         files=list(staged.files), checksum=staged.checksum, nbytes=staged.nbytes, snapshot=snapshot)
        meta = table.select(self.meta_columns) if meta is None else meta
        self.index.record_batch(info, table.column("key").to_pylist(), meta)
        self._publish(staged, info, with_batch(meta, bid))
        return info


class WriteBack:
    """Decides when hot batches leave RAM and writes them to the warm tier (p1 tasks)."""

    def __init__(self, state: BufferState, budget: Budget) -> None:
        self.s = state
        self.budget = budget
        self._paused = 0
        self.installer = FragmentInstaller(state.index, state.warm, state.meta_columns, self._publish_installed)

    def _publish_installed(self, staged: Staged, info: BatchInfo, meta: pa.Table) -> None:
        with self.s.lock:
            self.s.warm.publish(staged)
            self.s.batches[info.batch_id] = info
            self.s.catalog.insert_meta(meta)

    # scheduling --------------------------------------------------------------------------
    def pause(self) -> None:
        """No new write-backs are scheduled until ``resume`` (deletes rewrite hot batches)."""
        with self.s.lock:
            self._paused += 1

    def resume(self) -> None:
        with self.s.lock:
            self._paused -= 1

    def evict_past_high_mark(self) -> None:
        """Start write-back once resident hot bytes pass the high mark."""
        with self.s.lock:
            if self.s.hot.resident_bytes() > self.budget.hot_limit() * EVICT_HIGH:
                self.schedule()

    def schedule(self, extra: int = 0) -> None:
        """Hand least recently used batches to write-back (p1), in fragment-sized groups."""
        with self.s.lock:
            if self._paused:
                return
            target = int(self.budget.hot_limit() * EVICT_LOW) - extra - self.budget.reserved
            victims = self.s.hot.choose_victims(max(target, 0))
            for group in self._groups(victims):
                self._submit(group)

    def _groups(self, victims: Sequence) -> list[list[int]]:
        """One group per promotable batch; the small ones together, ``FRAGMENT_BYTES`` at a time."""
        out: list[list[int]] = []
        group: list[int] = []
        size = 0
        for v in victims:
            if v.nbytes >= PROMOTE_BYTES and self.s.durability == "wal":
                out.append([v.batch_id])
                continue
            group.append(v.batch_id)
            size += v.nbytes
            if size >= FRAGMENT_BYTES:
                out.append(group)
                group, size = [], 0
        if group:
            out.append(group)
        return out

    def _submit(self, group: list[int]) -> None:
        ids = list(group)
        self.s.tasks.submit(P1, lambda: self.write_back(ids), name=f"write-back {ids[0]}..{ids[-1]}")

    def evict_to_low_mark(self) -> None:
        """Synchronously write back until the hot tier is under the low mark (recovery)."""
        low = int(self.budget.hot_limit() * EVICT_LOW)
        while self.s.hot.nbytes > low:
            victims = self.s.hot.choose_victims(low)
            if not victims:
                break
            for group in self._groups(victims):
                self.write_back(group)

    def evict_all(self) -> None:
        """Write every hot batch now (promoted, or coalesced as in ``schedule``)."""
        with self.s.lock:
            victims = self.s.hot.choose_victims(0)
        for group in self._groups(victims):
            self.write_back(group)

    def _promotable(self, batch_ids: list[int], tables: list[pa.Table]) -> Path | None:
        """The WAL segment that can become the warm fragment of this one batch as it is, if any."""
        s = self.s
        if len(batch_ids) != 1 or s.durability != "wal" or not tables[0].schema.equals(s.warm.schema):
            return None
        seg = s.wal.segment_path(batch_ids[0])
        return seg if seg.exists() else None

    def adopt_recovered(self, batches: dict[int, BatchInfo]) -> None:
        """A reopen's hot batches, whose rows only their WAL segments hold: each segment becomes the batch's
        warm fragment by a hard link, unread (checked chunk by chunk as reads reach it, like any fragment a
        reopen finds), so a reopen reads the segments' footers, not their rows (issue 23: an open is
        O(metadata); reading them into RAM made it O(memory_limit_mb)); an adopted batch's info now says
        warm. Left to be read into the hot tier: a batch under ``PROMOTE_BYTES`` (write-back would coalesce it
        with others rather than keep a small file), and a segment of an older format or another schema.

        Crash-safe as a write-back's promotion: a fragment linked before the index write is dropped by
        the next recovery (the index still has its batch in the WAL), a segment left after it is swept."""
        s = self.s
        if s.durability != "wal":
            return
        adopted: list[tuple[Staged, BatchInfo]] = []
        try:
            for bid, info in sorted(batches.items()):
                seg = s.wal.segment_path(bid)
                if info.nbytes < PROMOTE_BYTES or not s.warm.adoptable_unread(seg):
                    continue
                staged = s.warm.adopt(seg, info.rows, check_now=False)
                _place(info, staged, 0)
                adopted.append((staged, info))
        finally:  # the ones linked so far, in one index write
            if adopted:
                s.index.set_batches([info for _, info in adopted])
                for staged, info in adopted:
                    s.warm.publish(staged)
                    s.wal.remove(info.batch_id)

    # the write-back ------------------------------------------------------------------------
    def write_back(self, batch_ids: list[int]) -> None:
        """Write hot batches to one warm fragment (or promote one's WAL segment), then move them there."""
        s = self.s
        with s.lock:
            tables = [s.hot.get(b, touch=False).table for b in batch_ids]
            segment = self._promotable(batch_ids, tables)
            # a written fragment's concatenated copy is RAM the budget must cover too; a link needs none
            held = 0 if segment else self.budget.hold_encoding(sum(table_bytes(t) for t in tables))
        try:
            if segment is not None:
                staged = s.warm.adopt(segment, tables[0].num_rows, s.wal.written.get(batch_ids[0]))
            else:
                staged = s.warm.stage(pa.concat_tables(tables) if len(tables) > 1 else tables[0])
        except BaseException:
            with s.lock:
                s.hot.release_victims(batch_ids)
                self.budget.drop_encoding(held)
            raise
        with self.budget.space:
            self.budget.encoding -= held
            infos = []
            offset = 0
            for b, t in zip(batch_ids, tables):
                info = s.batches[b]
                _place(info, staged, offset)
                infos.append(info)
                offset += t.num_rows
            s.index.set_batches(infos)
            s.warm.publish(staged)
            for b in batch_ids:
                s.hot.remove(b)
                s.wal.remove(b)
            self.budget.space.notify_all()
        s.catalog.warm_soon()  # a write: the catalog's warm-up waits for the writes to stop


def _place(info: BatchInfo, staged: Staged, offset: int) -> None:
    """``info`` now describes its batch as the rows from ``offset`` of the warm fragment ``staged``."""
    info.tier, info.fragment, info.offset = "warm", staged.part, offset
    info.files, info.checksum, info.nbytes = list(staged.files), staged.checksum, staged.nbytes
