"""The systems users would otherwise pick, each configured the way its own docs or design suggest.

Every store has the same small surface so a scenario can time them side by side:
``prepare(table)`` turns the shared Arrow batch into the store's native input (not timed: a real
producer would hand that form over directly), ``push`` and ``finish`` are timed, ``sample_keys``
selects keys by ``reward > r AND policy_version >= v``, ``get`` fetches one payload column for keys.
"""

from __future__ import annotations

import logging
import os
import pickle
import random
import shutil
import sys
import tempfile
import zipfile
from collections import OrderedDict, deque
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from .data import PAYLOAD

_LIST_COLUMNS = ("prompt_ids", "response_ids", "response_logprobs")
_ROW_OVERHEAD = 1_150  # bytes of one dict row's Python objects (dict, strings, scalars, array headers), tracemalloc


def _flat(col: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Offsets (from 0) and flat values of a list column, zero-copy where Arrow allows."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    offsets = arr.offsets.to_numpy()
    return offsets - offsets[0], arr.flatten().to_numpy(zero_copy_only=False)


def dict_rows(table: pa.Table, *, lists_as_numpy: bool = True) -> list[dict[str, Any]]:
    """One dict per rollout, token lists as owning NumPy arrays (what a generator hands over).

    Built column-wise (no Arrow ``to_pylist`` of token lists, which would take minutes).
    """
    scalars = [c for c in table.column_names if c not in _LIST_COLUMNS]
    cols: dict[str, list[Any]] = {c: table.column(c).to_pylist() for c in scalars}
    for c in _LIST_COLUMNS:
        if c not in table.column_names or not lists_as_numpy:
            continue
        offsets, values = _flat(table.column(c))
        cols[c] = [values[a:b].copy() for a, b in zip(offsets[:-1], offsets[1:])]
    names = list(cols)
    return [dict(zip(names, vals)) for vals in zip(*(cols[n] for n in names))]


def row_bytes(row: dict[str, Any]) -> int:
    """Logical size of a dict row: its arrays plus a measured constant for the Python objects."""
    return _ROW_OVERHEAD + sum(v.nbytes for v in row.values() if isinstance(v, np.ndarray))


def _select(rows: Any, n: int, reward_gt: float, version_ge: int, seed: int) -> list[Any]:
    matches = [r["key"] for r in rows if r["reward"] > reward_gt and r["policy_version"] >= version_ge]
    return random.Random(seed).sample(matches, n)


class DequeStore:
    """OpenRLHF ``NaiveReplayBuffer`` style: dict rows in RAM, oldest dropped past the budget.

    OpenRLHF bounds its list by a sample count; the byte bound here is the same thing made
    comparable to the other systems' budgets. Rows dropped are lost, which the scenario reports.
    """

    name = "deque"

    def __init__(self, root: Path, budget_bytes: int | None) -> None:
        self.budget = budget_bytes
        self.items: deque[dict[str, Any]] = deque()
        self.by_key: dict[str, dict[str, Any]] = {}
        self.bytes = 0
        self.logical_pushed = 0
        self.dropped = 0
        self.out_of_budget_at: dict[str, int] | None = None

    def prepare(self, table: pa.Table) -> tuple[list[dict[str, Any]], int]:
        return dict_rows(table), table.nbytes

    def push(self, item: tuple[list[dict[str, Any]], int]) -> None:
        rows, logical = item
        for r in rows:
            self.items.append(r)
            self.by_key[r["key"]] = r
            self.bytes += row_bytes(r)
        self.logical_pushed += logical
        if self.budget is not None and self.bytes > self.budget:
            if self.out_of_budget_at is None:
                self.out_of_budget_at = {"rows": len(self.items), "logical_bytes": self.logical_pushed, "held_bytes": self.bytes}
            while self.bytes > self.budget and self.items:
                old = self.items.popleft()
                del self.by_key[old["key"]]
                self.bytes -= row_bytes(old)
                self.dropped += 1

    def finish(self) -> None:
        pass

    def sample_keys(self, n: int, reward_gt: float, version_ge: int, seed: int) -> list[Any]:
        return _select(self.items, n, reward_gt, version_ge, seed)

    def get(self, keys: list[Any], column: str) -> int:
        return sum(self.by_key[k][column].nbytes for k in keys)

    def footprint(self) -> dict[str, Any]:
        return {"rows": len(self.items), "ram_bytes": self.bytes, "disk_bytes": 0, "rows_dropped": self.dropped}

    def snapshot(self, fs: Any, url: str, workdir: Path) -> int:
        """No persistence of its own: pickle the rows to one object (what a user would add)."""
        blob = pickle.dumps(list(self.items), protocol=5)
        fs.pipe_file(url + "/deque.pickle", blob)
        return len(blob)

    @classmethod
    def restore(cls, fs: Any, url: str, root: Path, budget_bytes: int | None) -> DequeStore:
        store = cls(root, None)
        for r in pickle.loads(fs.cat_file(url + "/deque.pickle")):
            store.items.append(r)
            store.by_key[r["key"]] = r
            store.bytes += row_bytes(r)
        store.budget = budget_bytes
        return store

    def close(self) -> None:
        self.items.clear()
        self.by_key.clear()


class RocksPickleStore:
    """verl persistable-replay-buffer RFC: an LRU dict cache under a byte budget; the least
    recently used rows are pickled into RocksDB (one key per rollout); samplers keep their own
    in-memory score index; a snapshot zips the RocksDB directory and pickles the cache.

    Settings: rocksdict defaults (RocksDB WAL on, not fsynced; default block cache and memtables),
    pickle protocol 5 (out-of-band-capable, fastest for NumPy arrays), evictions of one push
    written in one ``WriteBatch`` (more generous than the RFC's one ``set`` per item), eviction done
    inline rather than on the RFC's single worker thread (the same work under the GIL; the timed
    region ends when it is drained either way).
    """

    name = "rocksdb_pickle"

    def __init__(self, root: Path, budget_bytes: int) -> None:
        from rocksdict import Rdict

        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.budget = budget_bytes
        self.db = Rdict(str(self.root / "db"))
        self.cache: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.cache_bytes = 0
        self.score: tuple[list[str], list[float], list[int]] = ([], [], [])
        self.disk_rows = 0

    def prepare(self, table: pa.Table) -> list[dict[str, Any]]:
        return dict_rows(table)

    def _index(self, rows: list[dict[str, Any]]) -> None:
        keys, rewards, versions = self.score
        for r in rows:
            keys.append(r["key"])
            rewards.append(r["reward"])
            versions.append(r["policy_version"])

    def push(self, rows: list[dict[str, Any]]) -> None:
        from rocksdict import WriteBatch

        for r in rows:
            self.cache[r["key"]] = r
            self.cache_bytes += row_bytes(r)
        self._index(rows)
        if self.cache_bytes <= self.budget:
            return
        wb = WriteBatch()
        while self.cache_bytes > self.budget and self.cache:
            key, row = self.cache.popitem(last=False)
            self.cache_bytes -= row_bytes(row)
            wb.put(key.encode(), pickle.dumps(row, protocol=5))
            self.disk_rows += 1
        self.db.write(wb)

    def finish(self) -> None:
        self.db.flush(True)

    def sample_keys(self, n: int, reward_gt: float, version_ge: int, seed: int) -> list[Any]:
        keys, rewards, versions = self.score
        matches = [k for k, r, v in zip(keys, rewards, versions) if r > reward_gt and v >= version_ge]
        return random.Random(seed).sample(matches, n)

    def get(self, keys: list[Any], column: str) -> int:
        total = 0
        for k in keys:
            row = self.cache.get(k)
            if row is None:
                row = pickle.loads(self.db[k.encode()])
            else:
                self.cache.move_to_end(k)
            total += row[column].nbytes
        return total

    def footprint(self) -> dict[str, Any]:
        return {
            "rows": len(self.score[0]),
            "ram_bytes": self.cache_bytes,
            "disk_bytes": _du(self.root),
            "rows_on_disk": self.disk_rows,
        }

    def snapshot(self, fs: Any, url: str, workdir: Path) -> int:
        from rocksdict import Checkpoint

        stage = Path(tempfile.mkdtemp(dir=workdir, prefix="rfc-snap-"))
        try:
            Checkpoint(self.db).create_checkpoint(str(stage / "db"))
            archive = shutil.make_archive(str(stage / "db"), "zip", root_dir=stage / "db")
            cache = stage / "lru_cache.pickle"
            with open(cache, "wb") as f:
                pickle.dump({"dict": self.cache, "size_in_bytes": self.cache_bytes}, f, protocol=5)
            fs.put_file(archive, url + "/db.zip")
            fs.put_file(str(cache), url + "/lru_cache.pickle")
            return os.path.getsize(archive) + cache.stat().st_size
        finally:
            shutil.rmtree(stage, ignore_errors=True)

    @classmethod
    def restore(cls, fs: Any, url: str, root: Path, budget_bytes: int) -> RocksPickleStore:
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        fs.get_file(url + "/db.zip", str(root / "db.zip"))
        with zipfile.ZipFile(root / "db.zip") as z:
            z.extractall(root / "db")
        (root / "db.zip").unlink()
        state = pickle.loads(fs.cat_file(url + "/lru_cache.pickle"))
        store = cls(root, budget_bytes)
        store.cache, store.cache_bytes = state["dict"], state["size_in_bytes"]
        # rebuild the sampler's score index, as the RFC's samplers must after a restore
        for _, blob in store.db.items():
            store._index([pickle.loads(blob)])
            store.disk_rows += 1
        store._index(list(store.cache.values()))
        return store

    def close(self) -> None:
        self.db.close()
        self.cache.clear()


class ScoreIndex:
    """The RFC's selection path alone: a sampler's in-memory Python index of key, reward, version.

    RocksDB is not read while the RFC selects keys, so the metadata-scale sample scenario builds
    only this index (persisting 10M pickled rows would add minutes and change nothing measured).
    """

    name = "rocksdb_pickle"

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.rewards: list[float] = []
        self.versions: list[int] = []

    def prepare(self, table: pa.Table) -> tuple[list[Any], list[Any], list[Any]]:
        return tuple(table.column(c).to_pylist() for c in ("key", "reward", "policy_version"))  # type: ignore[return-value]

    def push(self, item: tuple[list[Any], list[Any], list[Any]]) -> None:
        self.keys.extend(item[0])
        self.rewards.extend(item[1])
        self.versions.extend(item[2])

    def finish(self) -> None:
        pass

    def sample_keys(self, n: int, reward_gt: float, version_ge: int, seed: int) -> list[Any]:
        matches = [k for k, r, v in zip(self.keys, self.rewards, self.versions) if r > reward_gt and v >= version_ge]
        return random.Random(seed).sample(matches, n)

    def close(self) -> None:
        self.keys, self.rewards, self.versions = [], [], []


class NumpyIndex:
    """The floor for key selection: metadata as in-RAM NumPy arrays, ``flatnonzero`` + ``choice``."""

    name = "numpy"

    def __init__(self) -> None:
        self._parts: list[tuple[np.ndarray, np.ndarray]] = []
        self.reward = np.empty(0, np.float32)
        self.version = np.empty(0, np.int64)

    def prepare(self, table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
        return table.column("reward").to_numpy(), table.column("policy_version").to_numpy()

    def push(self, item: tuple[np.ndarray, np.ndarray]) -> None:
        self._parts.append(item)

    def finish(self) -> None:
        if self._parts:
            self.reward = np.concatenate([self.reward, *(p[0] for p in self._parts)])
            self.version = np.concatenate([self.version, *(p[1] for p in self._parts)])
            self._parts = []

    def sample_keys(self, n: int, reward_gt: float, version_ge: int, seed: int) -> np.ndarray:
        idx = np.flatnonzero((self.reward > reward_gt) & (self.version >= version_ge))
        return idx[np.random.default_rng(seed).choice(len(idx), n, replace=False)]

    def close(self) -> None:
        self.reward = self.version = np.empty(0)


def torch_available() -> str | None:
    """``None`` when torch + torchrl import, else the reason (the harness reports it and goes on)."""
    try:
        import tensordict  # noqa: F401
        import torch  # noqa: F401
        import torchrl  # noqa: F401
    except Exception as e:  # ImportError, or a broken binary wheel
        return f"{type(e).__name__}: {e}"
    logging.getLogger("torchrl").setLevel(logging.WARNING)
    return None


def _pad(col: pa.ChunkedArray, width: int, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad a list column into a dense ``[rows, width]`` matrix (vectorised)."""
    offsets, values = _flat(col)
    lengths = np.diff(offsets)
    out = np.zeros((len(lengths), width), dtype=dtype)
    rows = np.repeat(np.arange(len(lengths)), lengths)
    pos = np.arange(len(values)) - np.repeat(offsets[:-1], lengths)
    out[rows, pos] = values
    return out, lengths.astype(np.int32)


class TorchRLStore:
    """TorchRL ``ReplayBuffer(storage=LazyMemmapStorage(max_size))``.

    Memmap storage needs fixed shapes, so token lists are right-padded to the longest possible
    length (4096 response, 1024 prompt tokens) with a length column: the usual way to put ragged
    LLM rollouts in TensorDict storage. Keys are the storage indices. TorchRL has no predicate
    sampling: selection masks the stored ``reward``/``policy_version`` tensors with torch ops and
    draws 256 matching indices. Writes land in the page cache (no fsync); ``dumps`` persists.
    ``torch.set_num_threads(1)`` (see ``__init__``).
    """

    name = "torchrl"

    def __init__(self, root: Path, max_rows: int, shape: Any = PAYLOAD) -> None:
        import torch
        from torchrl.data import LazyMemmapStorage, ReplayBuffer

        # one intra-op thread: with two, every small elementwise op on this 2-core VM waits ~16 ms
        # on OpenMP wake-ups (0.5 ms with one); the fair setting for a latency benchmark
        torch.set_num_threads(1)
        self.torch = torch
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_rows = max_rows
        self.widths = {"response_ids": shape.response[1], "response_logprobs": shape.response[1], "prompt_ids": shape.prompt[1]}
        self.rb = ReplayBuffer(storage=LazyMemmapStorage(max_size=max_rows, scratch_dir=str(self.root / "mm")), batch_size=256)

    def prepare(self, table: pa.Table) -> Any:
        from tensordict import TensorDict

        t = self.torch
        fields: dict[str, Any] = {
            "reward": t.from_numpy(table.column("reward").to_numpy().copy()),
            "policy_version": t.from_numpy(table.column("policy_version").to_numpy().copy()),
        }
        for c, w in self.widths.items():
            dtype = np.float32 if c == "response_logprobs" else np.int32
            mat, lengths = _pad(table.column(c), w, dtype)
            fields[c] = t.from_numpy(mat)
            fields[c + "_len"] = t.from_numpy(lengths)
        return TensorDict(fields, batch_size=[table.num_rows])

    def push(self, td: Any) -> None:
        self.rb.extend(td)

    def finish(self) -> None:
        pass

    def _columns(self) -> tuple[Any, Any]:
        """Zero-copy plain-tensor views of the stored columns (ops on ``MemoryMappedTensor`` itself
        go through its ``__torch_function__`` and cost ~300x more; a tuned user avoids that)."""
        n = len(self.rb)
        st = self.rb.storage._storage
        plain = self.torch.Tensor
        return st["reward"].as_subclass(plain)[:n], st["policy_version"].as_subclass(plain)[:n]

    def sample_keys(self, n: int, reward_gt: float, version_ge: int, seed: int) -> list[Any]:
        reward, version = self._columns()
        idx = self.torch.nonzero((reward > reward_gt) & (version >= version_ge)).squeeze(1)
        pick = np.random.default_rng(seed).choice(idx.numel(), n, replace=False)
        return idx[self.torch.from_numpy(pick)]

    def get(self, keys: Any, column: str) -> int:
        """Only the asked column and its lengths, through plain-tensor views of the memmaps (as a tuned
        user would; ``rb[keys]`` copies every stored field: 2.3x the bytes of the padded column)."""
        st = self.rb.storage._storage
        plain = self.torch.Tensor
        values = st[column].as_subclass(plain)[keys]
        lengths = st[column + "_len"].as_subclass(plain)[keys]
        # logical bytes (unpadded): the padded tensor read is larger by the padding factor
        return int(lengths.sum()) * values.element_size()

    def footprint(self) -> dict[str, Any]:
        return {"rows": len(self.rb), "ram_bytes": None, "disk_bytes": _du(self.root)}

    def snapshot(self, fs: Any, url: str, workdir: Path) -> int:
        stage = Path(tempfile.mkdtemp(dir=workdir, prefix="torchrl-snap-"))
        try:
            self.rb.dumps(str(stage / "rb"))
            fs.put(str(stage / "rb"), url + "/rb", recursive=True)
            return _du(stage)
        finally:
            shutil.rmtree(stage, ignore_errors=True)

    @classmethod
    def restore(cls, fs: Any, url: str, root: Path, max_rows: int) -> TorchRLStore:
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        fs.get(url + "/rb", str(root / "rb"), recursive=True)
        store = cls(root, max_rows)
        store.rb.loads(str(root / "rb"))
        return store

    def close(self) -> None:
        del self.rb


def _du(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(dirpath, f))
            except OSError:
                pass
    return total


def getsizeof_row(row: dict[str, Any]) -> int:
    """``sys.getsizeof`` accounting of one dict row (used to check ``_ROW_OVERHEAD``)."""
    return sys.getsizeof(row) + sum(sys.getsizeof(k) + sys.getsizeof(v) for k, v in row.items())
