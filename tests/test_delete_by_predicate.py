"""A delete by a metadata predicate reads only the ``meta`` table: no re-registration of the tiers'
objects, one binder probe per predicate shape (a TransferQueue clear of 16 samples took ~18 ms, 11 of
them that work), and the rows it names are gone from every tier either way."""

from __future__ import annotations

import numpy as np
import pytest

import lakebuffer as lb
from lakebuffer.catalog import Catalog
from tests.rollouts import make_rollouts


def _counting(monkeypatch) -> dict[str, int]:
    """Count the catalog's re-registrations of the tiers' objects and its binder probes."""
    calls = {"register": 0, "probe": 0}
    register, render = Catalog._register_sources, Catalog.render

    def counted_register(self, sources):
        calls["register"] += 1
        return register(self, sources)

    def counted_render(self, name, **fields):
        if name == "probe_predicate":
            calls["probe"] += 1
        return render(self, name, **fields)

    monkeypatch.setattr(Catalog, "_register_sources", counted_register)
    monkeypatch.setattr(Catalog, "render", counted_render)
    return calls


def test_a_metadata_delete_after_a_push_needs_no_tier_sync_and_one_probe_per_shape(tmp_path, monkeypatch):
    with lb.ReplayBuffer.open(tmp_path / "b", memory_limit_mb=64, snapshot_interval_s=0) as buf:
        version = {}
        for part in range(2):  # versions 0-7 warm, 8-15 hot
            vs = np.arange(40) % 8 + 8 * part
            version |= dict(zip(buf.push(make_rollouts(40, tokens=8, version=vs, seed=part)).to_pylist(), vs.tolist()))
            if part == 0:
                buf.evict_all()
        calls = _counting(monkeypatch)
        deleted: set[int] = set()
        for round_ in range(3):
            buf.push(make_rollouts(4, tokens=8, version=100, seed=10 + round_))  # a tier changed: a sync is due
            pair = (round_, round_ + 8)  # one warm version, one hot
            gone = [k for k, v in version.items() if v in pair]
            assert buf.delete(where=f"policy_version IN ({pair[0]}, {pair[1]})") == len(gone) == 10
            assert buf.count(where="key IN (" + ", ".join(f"'{k}'" for k in gone) + ")") == 0
            deleted |= set(pair)
        assert calls["register"] == 0  # meta-only statements: the tiers' objects were never re-registered
        assert calls["probe"] == 2  # one binder probe per shape: the deletes' "policy_version IN (#, #)", the counts' "key IN (#, ...)"
        left = [k for k, v in version.items() if v not in deleted]
        assert buf.get(left, columns=["key"]).column("key").to_pylist() == left  # the others stay, in both tiers


def test_a_payload_predicate_still_reads_the_rows_and_deletes_what_it_names(tmp_path, monkeypatch):
    with lb.ReplayBuffer.open(tmp_path / "b", memory_limit_mb=64, snapshot_interval_s=0) as buf:
        t = make_rollouts(30, tokens=8, seed=3)
        keys = buf.push(t).to_pylist()
        buf.count(where="policy_version >= 0")  # a metadata shape cached first
        calls = _counting(monkeypatch)
        buf.push(make_rollouts(3, tokens=8, seed=4))
        first_token = t.column("response_ids").to_pylist()[0][0]
        where = f"response_ids[1] = {first_token}"  # a payload column: not in meta
        named = [k for k, ids in zip(keys, t.column("response_ids").to_pylist()) if ids[0] == first_token]
        assert buf.delete(where=where) >= len(named) >= 1
        assert calls["probe"] == 1 and calls["register"] >= 1  # bound against rollouts: the tiers synced
        assert buf.count(where=f"key IN ({', '.join(repr(k) for k in named)})") == 0


def test_a_where_delete_of_an_empty_buffer_returns_0_at_once_and_still_refuses_bad_predicates(tmp_path, monkeypatch):
    """A TransferQueue store's first generation stays empty when every field is new: each ``kv_clear``
    deletes there too. With no row in any tier that is 0 with no statement; a bad predicate still raises."""
    with lb.ReplayBuffer.open(tmp_path / "b", memory_limit_mb=64, snapshot_interval_s=0) as buf:
        calls = _counting(monkeypatch)
        assert buf.delete(where="policy_version IN (1, 2)") == 0
        assert calls == {"register": 0, "probe": 0}
        with pytest.raises(lb.QueryError):
            buf.delete(where="policy_version >")
        with pytest.raises(lb.QueryError):
            buf.delete(where="1; DROP TABLE meta")
        keys = buf.push(make_rollouts(5, tokens=4, version=1, seed=7)).to_pylist()
        assert buf.delete(where="policy_version IN (1, 2)") == 5  # not empty any more: the rows go
        assert buf.count() == 0 and len(keys) == 5
