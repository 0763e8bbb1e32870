"""Issue 23 item 2: the per-row, per-column digests written into every lake file (``_lb_hash``).

They must be stable (files written today are checked by any later version: the values are pinned
here), the same for every physical form a reader hands back (DataFusion returns other string and list
types than pyarrow), the same for a row alone or inside a slice, and different after any change of
one value.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from lakebuffer.lake import rowhash as rh

SMALL = pa.table({
    "key": ["a", "bc", None],
    "ids": pa.array([[1, 2, 3], [], None], pa.list_(pa.int32())),
    "r": pa.array([0.5, None, -1.0], pa.float32()),
    "b": [True, False, None],
    "ts": pa.array([0, 1, 2], pa.timestamp("us", tz="UTC")),
    "s": pa.array([{"x": 1}, {"x": None}, None], pa.struct([("x", pa.int8())])),
})

PINNED = [
    [12776647588497555390, 13513065453750205835, 12143599794774963797, 10451216379200822465,
     16294208416658607535, 12100477452831230990],
    [3901296908506361852, 16294208416658607535, 7640891576956012808, 16294208416658607535,
     10451216379200822465, 12960085686518949483],
    [7640891576956012808, 7640891576956012808, 1376027890811250489, 7640891576956012808,
     10905525725756348110, 7640891576956012808],
]


def test_digests_are_pinned_values():
    assert rh.table_digests(SMALL, SMALL.column_names).tolist() == PINNED


def _rows(n: int = 300, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    lens = rng.integers(0, 50, n)
    offs = pa.array(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32))
    return pa.table({
        "key": [f"k-{i:06d}" for i in range(n)],
        "ids": pa.ListArray.from_arrays(offs, pa.array(rng.integers(0, 1000, int(lens.sum())).astype(np.int32))),
        "lp": pa.ListArray.from_arrays(offs, pa.array(-rng.random(int(lens.sum())).astype(np.float32))),
        "reward": pa.array(rng.random(n).astype(np.float32)),
        "tag": pa.array([None if i % 7 == 0 else f"t{i % 3}" for i in range(n)]),
    })


def test_physical_forms_slices_and_takes_give_the_same_digests(monkeypatch):
    t = _rows()
    cols = t.column_names
    full = rh.table_digests(t, cols)
    other = pa.table({
        "key": t.column("key").cast(pa.string_view()),
        "ids": t.column("ids").cast(pa.large_list(pa.int32())),
        "lp": t.column("lp"),
        "reward": t.column("reward"),
        "tag": t.column("tag").dictionary_encode(),
    })
    assert (rh.table_digests(other, cols) == full).all()
    assert (rh.table_digests(t.slice(17, 101), cols) == full[17:118]).all()
    idx = [299, 3, 150]
    assert (rh.table_digests(t.take(pa.array(idx)), cols) == full[idx]).all()
    monkeypatch.setattr(rh, "SLICE_BYTES", 512)  # many small slices: same values
    assert (rh.table_digests(t, cols) == full).all()


@pytest.mark.parametrize("column", ["key", "ids", "lp", "reward", "tag"])
def test_one_changed_value_changes_exactly_its_row_and_column(column):
    t = _rows()
    cols = t.column_names
    with_hash = t.append_column(rh.HASH_COLUMN, rh.hash_column(t, cols))
    assert rh.mismatches(with_hash, cols, cols).tolist() == []
    values = with_hash.column(column).to_pylist()
    row = next(i for i, v in enumerate(values) if v)  # a row with a non-empty value
    v = values[row]
    if isinstance(v, list):
        v = v[:-1] + [v[-1] + 1 if isinstance(v[-1], int) else v[-1] * 0.5]
    elif isinstance(v, str):
        v = v[:-1] + chr(ord(v[-1]) ^ 1)
    else:
        v = v * 0.5
    values[row] = v
    damaged = with_hash.set_column(with_hash.column_names.index(column), column,
                                   pa.array(values, with_hash.schema.field(column).type))
    assert rh.mismatches(damaged, [column], cols).tolist() == [row]


def test_swapped_list_elements_change_the_digest():
    a = pa.array([[1, 2, 3]], pa.list_(pa.int32()))
    b = pa.array([[2, 1, 3]], pa.list_(pa.int32()))
    assert rh.digest(a)[0] != rh.digest(b)[0]


def test_file_columns_come_from_the_schema_alone():
    schema = rh.schema_with_hash(pa.schema([("key", pa.string()), ("x", pa.int64())]))
    assert rh.file_digest_columns(schema) == ["key", "x"]
    assert rh.hashed_columns(schema.metadata) == ["key", "x"]
    assert rh.file_digest_columns(pa.schema([("key", pa.string())])) is None
