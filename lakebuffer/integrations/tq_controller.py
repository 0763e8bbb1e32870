"""TransferQueue's controller made durable: every key, tag and clear it acknowledges is journaled.

TransferQueue 0.1.11 keeps the keys, the tags (``custom_meta``), the key -> global index map and
the per-field row keys only in its ``TransferQueueController`` actor; tag-only updates go from the
client straight to it. So durability has to be taken where those mutations happen: in the
controller. ``tq.init`` creates the controller and then calls the backend's bootstrap hook, which
calls :func:`install` here: through Ray's ``__ray_call__`` it runs :func:`_install` *inside* the
controller process, which

1. restores the journaled state (the same global indexes, keys, tags, fields and row keys), and
2. wraps the controller's three mutating entry points that end an acknowledged operation:
   ``set_custom_meta`` (every put ends with it, tag-only updates are only it), ``clear_meta`` and
   ``clear_partition``. Each wrapper runs TransferQueue's own method, then writes the resulting
   state of the touched samples to the store's journal and returns only when it is durable; the
   controller answers the client after that, so there is no loss window.

This is the one module that depends on TransferQueue's internals (attribute and method names of
``TransferQueueController``, ``DataPartitionStatus``, ``FieldMeta`` and ``PartitionIndexManager``);
:func:`check_internals` says what changed if a release moves them, and
``tests/integration/test_tq_durable.py::test_transferqueue_internals_this_backend_relies_on`` runs it.
"""

from __future__ import annotations

import functools
import inspect
import json
import threading
import time
from collections import defaultdict
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import LakeBufferError

# the journal's record columns (the store adds tq_seq and the rollout schema's neutral values)
JOURNAL_SCHEMA = pa.schema([
    pa.field("tq_op", pa.string()),  # "state" (the sample as it is now), "clear", "clear_partition"
    pa.field("tq_partition", pa.string()),
    pa.field("tq_index", pa.int64()),  # the global index (-1 for clear_partition)
    pa.field("tq_key", pa.string()),  # the user's key (kv API); null for the BatchMeta API
    pa.field("tq_tags", pa.string()),  # the sample's custom_meta as JSON
    pa.field("tq_rows", pa.string()),  # JSON {field: row key}: where each field's value is stored
    pa.field("tq_schema", pa.string()),  # JSON {field: [dtype, shape (null if nested), is_nested, is_non_tensor]}
    pa.field("tq_shapes", pa.string()),  # JSON {field: this sample's shape} of its nested fields
    pa.field("tq_consumed", pa.string()),  # JSON [task, ...]: the get_meta tasks that consumed the sample
])
WRAPPED = ("set_custom_meta", "clear_meta", "clear_partition", "get_metadata", "reset_consumption", "load_checkpoint")
_BEFORE = object()  # the phase marker: a record builder called before TransferQueue's method runs


class JournalError(LakeBufferError, RuntimeError):
    """The controller's journal could not be written: the operation is not acknowledged."""


class InternalsChangedError(LakeBufferError, RuntimeError):
    """TransferQueue's controller no longer has what the durable journal relies on."""


def install(controller: Any, store_name: str, namespace: str, journal: bytes, retry_s: float) -> int:
    """Restore ``journal`` (Arrow IPC of folded state records) into ``controller`` and make it journal
    every later acknowledged mutation to the store actor ``store_name``; returns the samples restored."""
    import ray

    return ray.get(controller.__ray_call__.remote(_install, store_name, namespace, journal, retry_s))


def check_internals() -> None:
    """Raise :class:`InternalsChangedError` naming what moved if TransferQueue's controller changed."""
    from transfer_queue import controller as c

    ctrl_cls = c.TransferQueueController.__ray_metadata__.modified_class
    problems = [f"TransferQueueController.{m}" for m in (*WRAPPED, "_get_partition")
                if not callable(getattr(ctrl_cls, m, None))]
    init_src = inspect.getsource(ctrl_cls.__init__)
    problems += [f"TransferQueueController.{a}" for a in ("self.partitions", "self.index_manager") if a not in init_src]
    want = {"set_custom_meta": ["self", "partition_custom_meta"],
            "clear_meta": ["self", "global_indexes", "partition_ids", "clear_consumption"],
            "clear_partition": ["self", "partition_id", "clear_consumption"],
            "get_metadata": ["self", "data_fields", "partition_id", "mode", "task_name", "batch_size",
                             "sampling_config", "args", "kwargs"],
            "reset_consumption": ["self", "partition_id", "task_name"],
            "load_checkpoint": ["self", "path"]}
    for name, params in want.items():
        fn = getattr(ctrl_cls, name, None)
        if fn is not None and [p for p in inspect.signature(fn).parameters if not p.startswith("_ray")] != params:
            problems.append(f"TransferQueueController.{name}{inspect.signature(fn)}")
    part_fields = {f.name for f in c.DataPartitionStatus.__dataclass_fields__.values()}
    problems += [f"DataPartitionStatus.{a}" for a in ("global_indexes", "field_metadata", "field_custom_backend_meta",
                                                      "custom_meta", "keys_mapping", "revert_keys_mapping",
                                                      "consumption_status")
                 if a not in part_fields]
    problems += [f"DataPartitionStatus.{m}()" for m in ("update_production_status", "ensure_samples_capacity",
                                                        "set_custom_meta", "mark_consumed")
                 if not hasattr(c.DataPartitionStatus, m)]
    fm_fields = {f.name for f in c.FieldMeta.__dataclass_fields__.values()}
    problems += [f"FieldMeta.{a}" for a in ("global_indexes", "dtype", "shape", "is_nested", "is_non_tensor",
                                            "per_sample_shapes") if a not in fm_fields]
    im = c.PartitionIndexManager()
    problems += [f"PartitionIndexManager.{a}" for a in ("partition_to_indexes", "reusable_indexes",
                                                        "global_index_counter", "allocated_indexes")
                 if not hasattr(im, a)]
    if problems:
        raise InternalsChangedError(
            "this TransferQueue release changed controller internals the LakeBuffer backend journals "
            f"({', '.join(problems)}); pin transferqueue==0.1.11 or update lakebuffer.integrations.tq_controller")


# inside the controller process -----------------------------------------------------------------
def _install(ctrl: Any, store_name: str, namespace: str, journal: bytes, retry_s: float) -> int:
    import ray

    from ..index import read_ipc

    if getattr(ctrl, "_lakebuffer_journal", None) is not None:
        return 0  # a reused controller: already restored and journaling
    restored = restore(ctrl, read_ipc(journal))
    store = ray.get_actor(store_name, namespace=namespace)

    def ray_call(method: str, *args: Any) -> Any:
        deadline = time.monotonic() + retry_s
        while True:  # the store may be restarting (Ray restarts it after a crash)
            try:
                return ray.get(getattr(store, method).remote(*args))
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as e:
                if time.monotonic() > deadline:
                    raise JournalError(f"the lakebuffer store {store_name!r} is unreachable; the operation "
                                       f"is not acknowledged: {e}") from e
                time.sleep(0.2)

    from .tq_wire import WireClient

    wire = WireClient(store, ray_call)
    write = _segment_writer(store, ray_call) if not wire.remote else _store_writer(wire, ray_call)

    def after(method: Any, records_of: Any) -> Any:
        signature = inspect.signature(method)  # once: inspect.signature costs ~30 us per call

        @functools.wraps(method)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            given = {k: v for k, v in bound.arguments.items() if not k.startswith("_ray")}
            before = records_of(ctrl, **given, _before=_BEFORE)
            out = method(*args, **kwargs)
            write(records_of(ctrl, **given, _before=before))
            return out
        return wrapper

    for name, records_of in (("set_custom_meta", _tag_records), ("clear_meta", _clear_records),
                             ("clear_partition", _partition_records), ("get_metadata", _consume_records),
                             ("reset_consumption", _reset_records), ("load_checkpoint", _load_records)):
        setattr(ctrl, name, after(getattr(ctrl, name), records_of))
    ctrl._lakebuffer_journal = store_name
    return restored


def _segment_writer(store: Any, ray_call: Any) -> Any:
    """On the store's node: the controller appends its records to segments of its own
    (``tq_journal_log``): no round trip to the store before it answers (~1 ms of each put and tag update)."""
    from pathlib import Path

    from .tq_journal_log import SegmentWriter

    directory, next_seq, sync = ray_call("journal_target")
    log = SegmentWriter(Path(directory), next_seq, sync)

    def write(records: list[dict[str, Any]]) -> None:
        if not records:
            return
        try:
            closed = log.append(pa.Table.from_pylist(records, schema=JOURNAL_SCHEMA))
        except OSError as e:
            raise JournalError(f"the journal segment {log.path} cannot be written; the operation is not "
                               f"acknowledged: {e}") from e
        if closed:
            store.journal_drain.remote()  # into the store's journal buffer, in the background
    return write


def _store_writer(wire: Any, ray_call: Any) -> Any:
    """On another node than the store: each record is sent to the store, which appends it to its log."""
    from .tq_journal_log import Sequencer
    from .tq_wire import ipc_buffer  # 9 string columns: streamed, cheaper than pickled array by array

    seq = Sequencer(ray_call("journal_target")[1])
    lock = threading.Lock()  # numbered in the order they are sent

    def write(records: list[dict[str, Any]]) -> None:
        if records:
            with lock:
                wire.call("journal", ipc_buffer(seq.number(pa.Table.from_pylist(records, schema=JOURNAL_SCHEMA))))
    return write


def _tag_records(ctrl: Any, partition_custom_meta: dict, _before: Any) -> list[dict[str, Any]]:
    if _before is _BEFORE:
        return []
    out = []
    for pid, meta in partition_custom_meta.items():
        part = ctrl._get_partition(pid)
        if part is not None:
            out += [_state(part, pid, int(i)) for i in meta]
    return out


def _clear_records(ctrl: Any, global_indexes: list[int], partition_ids: list[str], clear_consumption: bool = True,
                   _before: Any = None) -> Any:
    if _before is _BEFORE:  # clear_meta ignores samples a partition does not hold: journal the ones it cleared
        held = []
        for gi, pid in zip(global_indexes, partition_ids, strict=True):
            part = ctrl._get_partition(pid)
            if part is not None and gi in part.global_indexes:
                held.append((pid, int(gi)))
        return held
    return [_record("clear", pid, gi) for pid, gi in _before]


def _partition_records(ctrl: Any, partition_id: str, clear_consumption: bool = True, _before: Any = None) -> Any:
    if _before is _BEFORE:
        return ctrl._get_partition(partition_id) is not None
    return [_record("clear_partition", partition_id, -1)] if _before else []


def _consume_records(ctrl: Any, partition_id: str, mode: str = "fetch", task_name: str | None = None,
                     _before: Any = None, **_: Any) -> Any:
    """get_meta in fetch mode marks what it hands out consumed by the task: journal the newly consumed."""
    part = ctrl._get_partition(partition_id)
    if mode != "fetch" or task_name is None or part is None:
        return None if _before is _BEFORE else []
    now = part.consumption_status.get(task_name)
    if _before is _BEFORE:
        return None if now is None else now.clone()
    if now is None:
        return []
    was = np.zeros(len(now), dtype=bool)
    if _before is not None:
        was[:len(_before)] = _before.numpy()[:len(now)] == 1
    newly = np.flatnonzero((now.numpy() == 1) & ~was)
    return [_state(part, partition_id, int(gi)) for gi in newly if int(gi) in part.global_indexes]


def _reset_records(ctrl: Any, partition_id: str, task_name: str | None = None, _before: Any = None) -> Any:
    if _before is _BEFORE:
        return None
    part = ctrl._get_partition(partition_id)
    return [] if part is None else [_state(part, partition_id, int(gi)) for gi in sorted(part.global_indexes)]


def _load_records(ctrl: Any, path: str, _before: Any = None) -> Any:
    """tq.load_checkpoint replaces the controller's state: the journal says so (every partition cleared,
    then every sample as loaded), so a later restore gives back the loaded state, not the one before."""
    if _before is _BEFORE:
        return set(ctrl.partitions)
    out = [_record("clear_partition", pid, -1) for pid in sorted(_before | set(ctrl.partitions))]
    for pid, part in ctrl.partitions.items():
        out += [_state(part, pid, int(gi)) for gi in sorted(part.global_indexes)]
    return out


def _record(op: str, pid: str, gi: int, key: str | None = None, tags: str = "{}", rows: str = "{}",
            schema: str = "{}", shapes: str = "{}", consumed: str = "[]") -> dict[str, Any]:
    return {"tq_op": op, "tq_partition": pid, "tq_index": gi, "tq_key": key, "tq_tags": tags, "tq_rows": rows,
            "tq_schema": schema, "tq_shapes": shapes, "tq_consumed": consumed}


def _state(part: Any, pid: str, gi: int) -> dict[str, Any]:
    """One sample as the controller holds it now: key, tags, fields with their schema and row keys."""
    rows = part.field_custom_backend_meta.get(gi, {})
    schema, shapes = {}, {}
    for name, fm in part.field_metadata.items():
        if gi not in fm.global_indexes:
            continue
        if fm.is_nested:
            shape = fm.per_sample_shapes.get(gi)
            shapes[name] = None if shape is None else [int(d) for d in shape]
        schema[name] = [None if fm.dtype is None else str(fm.dtype),
                        None if fm.is_nested or fm.shape is None else [int(d) for d in fm.shape],
                        bool(fm.is_nested), bool(fm.is_non_tensor)]
    return _record("state", pid, gi, part.revert_keys_mapping.get(gi),
                   _json(part.custom_meta.get(gi, {})), json.dumps({f: rows[f] for f in schema if f in rows}),
                   json.dumps(schema, sort_keys=True), json.dumps(shapes),
                   json.dumps([task for task, t in part.consumption_status.items() if gi < len(t) and int(t[gi]) == 1]))


def _json(value: Any) -> str:
    def plain(v: Any) -> Any:
        if hasattr(v, "tolist"):  # numpy / torch scalars and arrays
            return v.tolist()
        raise TypeError(f"a TransferQueue tag value of type {type(v).__name__} is not JSON")
    return json.dumps(value, default=plain)


def fold(journal: pa.Table) -> pa.Table:
    """The live samples of a journal: the newest state record of each (partition, index) that no
    later clear or partition clear supersedes."""
    if journal.num_rows == 0:
        return journal
    t = journal.sort_by([("tq_seq", "ascending")])
    ops = t.column("tq_op").to_pylist()
    parts = t.column("tq_partition").to_pylist()
    idx = t.column("tq_index").to_numpy()
    latest: dict[tuple[str, int], int] = {}
    for row, (op, pid, gi) in enumerate(zip(ops, parts, idx.tolist(), strict=True)):
        if op == "clear_partition":
            for k in [k for k in latest if k[0] == pid]:
                del latest[k]
        elif op == "clear":
            latest.pop((pid, gi), None)
        else:
            latest[(pid, gi)] = row
    return t.take(pa.array(sorted(latest.values()), pa.int64()))


def restore(ctrl: Any, state: pa.Table) -> int:
    """Put folded state records back into a fresh controller, at the same global indexes."""
    if state.num_rows == 0:
        return 0
    import torch
    from transfer_queue.controller import DataPartitionStatus

    by_part: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for rec in state.select(["tq_partition", "tq_index", "tq_key", "tq_tags", "tq_rows", "tq_schema",
                             "tq_shapes", "tq_consumed"]).to_pylist():
        by_part[rec["tq_partition"]].append(rec)
    signatures: dict[str, dict[str, Any]] = {}  # a field signature is parsed once, not once per sample
    for text in set(state.column("tq_schema").to_pylist()):
        signatures[text] = {f: {"dtype": _dtype(torch, dt), "shape": None if nested or non_tensor else torch.Size(shape),
                                "is_nested": nested, "is_non_tensor": non_tensor}
                            for f, (dt, shape, nested, non_tensor) in json.loads(text).items()}
    im = ctrl.index_manager
    for pid, recs in by_part.items():
        if ctrl._get_partition(pid) is None:  # not create_partition: it pre-allocates an index a live key may hold
            ctrl.partitions[pid] = DataPartitionStatus(partition_id=pid)
        part = ctrl._get_partition(pid)
        idxs = [r["tq_index"] for r in recs]
        part.ensure_samples_capacity(max(idxs) + 1)
        part.global_indexes.update(idxs)
        im.partition_to_indexes[pid].update(idxs)
        im.allocated_indexes.update(idxs)
        groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in recs:
            if r["tq_key"] is not None:
                part.keys_mapping[r["tq_key"]] = r["tq_index"]
                part.revert_keys_mapping[r["tq_index"]] = r["tq_key"]
            groups[r["tq_schema"]].append(r)
        for text, members in groups.items():
            field_schema = {f: dict(fs) for f, fs in signatures[text].items()}
            if not field_schema:
                continue
            nested = [f for f, fs in field_schema.items() if fs["is_nested"]]
            if nested:
                shapes = [json.loads(m["tq_shapes"]) for m in members]
                for f in nested:
                    field_schema[f]["per_sample_shapes"] = {m["tq_index"]: tuple(sh[f]) for m, sh in
                                                            zip(members, shapes, strict=True) if sh.get(f) is not None}
            rows = {m["tq_index"]: json.loads(m["tq_rows"]) for m in members}
            if not part.update_production_status([m["tq_index"] for m in members], list(field_schema), field_schema,
                                                 rows):
                raise JournalError(f"TransferQueue refused the restored fields of partition {pid!r}")
        part.set_custom_meta({r["tq_index"]: json.loads(r["tq_tags"]) for r in recs if r["tq_tags"] != "{}"})
        consumed: dict[str, list[int]] = defaultdict(list)
        for r in recs:
            if r["tq_consumed"] not in (None, "[]"):
                for task in json.loads(r["tq_consumed"]):
                    consumed[task].append(r["tq_index"])
        for task, gis in consumed.items():
            part.mark_consumed(task, gis)
    top = int(np.max(state.column("tq_index").to_numpy())) + 1
    im.global_index_counter = max(im.global_index_counter, top)
    im.reusable_indexes = [i for i in range(im.global_index_counter) if i not in im.allocated_indexes]
    return state.num_rows


def _dtype(torch: Any, name: str | None) -> Any:
    if name is None:
        return None
    found = getattr(torch, name.removeprefix("torch."), None)
    return found if isinstance(found, torch.dtype) else name
