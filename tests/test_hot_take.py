"""What a ``get`` of hot rows hands back: a whole batch read in order is that batch's own arrays (no copy: a
TransferQueue get of the rows one put stored, 3 MB at 16 x 16,384 tokens), any other selection one compact
copy of just its rows, so that sending it to another process (the store's socket pickles its buffers) sends
those rows' bytes and not the whole batch's."""

from __future__ import annotations

import pickle

import lakebuffer as lb
from tests.rollouts import make_rollouts


def _values_address(table) -> int:
    return table.column(0).chunk(0).values.buffers()[1].address


def _pickled_bytes(table) -> int:
    buffers: list[pickle.PickleBuffer] = []
    pickle.dumps(table, protocol=5, buffer_callback=buffers.append)
    return sum(b.raw().nbytes for b in buffers)


def test_a_whole_hot_batch_comes_back_without_a_copy_and_a_part_as_a_compact_one(tmp_path):
    with lb.ReplayBuffer.open(tmp_path / "b", memory_limit_mb=64, snapshot_interval_s=0) as buf:
        keys = buf.push(make_rollouts(16, tokens=512, seed=1)).to_pylist()
        buf.push(make_rollouts(16, tokens=512, seed=2))
        assert buf.stats()["hot"]["rows"] == 32
        first = buf.get(keys, columns=["response_ids"])
        again = buf.get(keys, columns=["response_ids"])
        assert first.equals(again)
        assert _values_address(first) == _values_address(again)  # both are the batch's own buffers
        part = buf.get(keys[4:8], columns=["response_ids"])
        assert part.column("response_ids").to_pylist() == first.column("response_ids").to_pylist()[4:8]
        assert _values_address(part) != _values_address(first)  # a copy of its rows ...
        assert _pickled_bytes(part) < _pickled_bytes(first) / 2  # ... that sends only them (4 of 16 rows)
        # the same rows out of order, or two batches' rows together, are copies as well
        backwards = buf.get(keys[::-1], columns=["response_ids"])
        assert backwards.column("response_ids").to_pylist() == first.column("response_ids").to_pylist()[::-1]
        assert _values_address(backwards) != _values_address(first)
