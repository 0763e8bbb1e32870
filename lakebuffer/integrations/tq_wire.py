"""The fast path to the store actor: ZeroMQ over a Unix socket on the store's node, Arrow buffers out of band.

A Ray actor call that carries a put's ~1 MB Arrow stream goes through Ray's object store (put,
seal, fetch) and its scheduler: measured 3-4 ms per call beyond the store's own work on a 2-core
machine, more than the durable push itself (``benchmarks/profile_tq_put.py``). TransferQueue's own
SimpleStorage moves its tensors over ZeroMQ; so does this: the store actor serves its methods on a
``ROUTER`` socket in a thread, a client on the same node sends ``(method, args)`` pickled with
protocol 5, every Arrow buffer as its own frame (no copy into a pickle, none out of it).

Crash handling stays Ray's: the store is restarted by Ray (``max_restarts=-1``) and binds a new
socket. A client that has waited a while for a reply asks Ray whether the store is the process it
sent to; if it was restarted (the request died with it), the client reconnects and sends again -
every store call is idempotent (a put retried after a crash it survived is stored once). A client on
another node (a Unix socket is local) keeps using Ray calls.
"""

from __future__ import annotations

import functools
import os
import pickle
import tempfile
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import zmq

from ..errors import LakeBufferError

UNLOCKED = ("endpoint", "pid", "path")  # answer while another call runs (a client's liveness check)
WAIT_SLICE_S = 2.0  # a reply not here by then: check that the store is still the process asked


def ipc_buffer(table: pa.Table) -> pa.Buffer:
    """``table`` as one Arrow IPC stream in an Arrow buffer (sent out of band, never copied into bytes)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue()


def _dumps(obj: Any) -> list[Any]:
    bufs: list[pickle.PickleBuffer] = []
    head = pickle.dumps(obj, protocol=5, buffer_callback=bufs.append)
    return [head, *(b.raw() for b in bufs)]


def _loads(frames: list[Any]) -> Any:
    return pickle.loads(frames[0].buffer, buffers=[f.buffer for f in frames[1:]])


def _node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def serialized(cls: type) -> type:
    """Every public method of ``cls`` under one lock: the actor's Ray calls (one thread) and the
    socket thread take turns, as Ray calls alone did."""
    for name, fn in list(vars(cls).items()):
        if callable(fn) and not name.startswith("_") and name not in UNLOCKED:
            @functools.wraps(fn)
            def locked(self: Any, *a: Any, _fn: Callable[..., Any] = fn, **k: Any) -> Any:
                with self._lock:
                    return _fn(self, *a, **k)
            setattr(cls, name, locked)
    return cls


def remove_stale_sockets(directory: str | None = None) -> list[str]:
    """Unlink the socket files of stores whose process is gone (a SIGKILLed store cannot remove its own);
    a live process's file, or one whose pid cannot be checked, stays. Returns the paths removed."""
    directory = directory or tempfile.gettempdir()
    removed = []
    for name in os.listdir(directory):
        parts = name.split("-")
        if not (name.startswith("lakebuffer-") and name.endswith(".sock") and len(parts) == 3 and parts[1].isdigit()):
            continue
        try:
            os.kill(int(parts[1]), 0)
            continue  # alive (or pid reused: leave it)
        except ProcessLookupError:
            pass
        except OSError:
            continue  # another user's process: not ours to judge
        try:
            os.unlink(os.path.join(directory, name))
            removed.append(os.path.join(directory, name))
        except FileNotFoundError:
            pass
    return removed


class WireServer:
    """Serves ``target``'s methods on a Unix socket, in a daemon thread of the store actor."""

    def __init__(self, target: Any) -> None:
        self.target = target
        remove_stale_sockets()  # what stores killed before us left behind
        self.ctx = zmq.Context(1)
        self.path = os.path.join(tempfile.gettempdir(), f"lakebuffer-{os.getpid()}-{uuid.uuid4().hex[:8]}.sock")
        self.address = f"ipc://{self.path}"
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(self.address)
        self.thread = threading.Thread(target=self._serve, name="lakebuffer-wire", daemon=True)
        self.thread.start()

    def endpoint(self) -> tuple[str, str, int]:
        return _node_id(), self.address, os.getpid()

    def _serve(self) -> None:
        while True:
            try:
                ident, _, *frames = self.sock.recv_multipart(copy=False)
            except zmq.ContextTerminated:
                self.sock.close(linger=0)
                return
            try:
                method, args = _loads(frames)
                if method.startswith("_"):
                    raise LakeBufferError(f"the store has no call {method!r}")
                reply = [b"ok", *_dumps(getattr(self.target, method)(*args))]
            except BaseException as e:  # noqa: BLE001 - the caller gets the error, the server goes on
                try:
                    err = pickle.dumps(e)
                    pickle.loads(err)  # an exception that cannot be rebuilt is sent as text
                except Exception:  # noqa: BLE001
                    err = pickle.dumps(LakeBufferError(f"{type(e).__name__}: {e}"))
                reply = [b"err", err]
            try:
                self.sock.send_multipart([ident, b"", *reply], copy=False)
            except zmq.ContextTerminated:
                self.sock.close(linger=0)
                return

    def close(self) -> None:
        """Stop serving. The socket belongs to the serving thread, which may be waiting for the store's
        lock that our caller holds: the context ends in the background (its thread closes the socket)."""
        threading.Thread(target=self.ctx.term, name="lakebuffer-wire-close", daemon=True).start()
        try:
            os.unlink(self.path)
        except OSError:
            pass


class WireClient:
    """Calls the store actor's methods over its socket (one ``REQ`` socket per calling thread),
    or through Ray when the store runs on another node. ``ray_call(method, *args)`` is the Ray
    path (with its own wait through restarts), used for the endpoint and as the fallback."""

    def __init__(self, store: Any, ray_call: Callable[..., Any]) -> None:
        self.store = store
        self.ray_call = ray_call
        self.ctx = zmq.Context.instance()
        self.local = threading.local()
        self._refresh()

    def _refresh(self) -> None:
        node, address, pid = self.ray_call("endpoint")
        if (address, pid) != (getattr(self, "address", None), getattr(self, "pid", None)):
            self.address, self.pid, self.remote = address, pid, node != _node_id()
            self.generation = getattr(self, "generation", 0) + 1  # every thread's socket is reconnected

    def _socket(self) -> Any:
        sock = getattr(self.local, "sock", None)
        if sock is None or self.local.generation != self.generation:
            if sock is not None:
                sock.close(linger=0)
            sock = self.ctx.socket(zmq.REQ)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(self.address)
            self.local.sock, self.local.generation = sock, self.generation
        return sock

    def call(self, method: str, *args: Any) -> Any:
        if self.remote:
            return self.ray_call(method, *args)
        while True:
            sock = self._socket()
            sock.send_multipart(_dumps((method, args)), copy=False)
            while not sock.poll(int(WAIT_SLICE_S * 1000)):
                if self._restarted():
                    break
            else:
                status, *frames = sock.recv_multipart(copy=False)
                if status.bytes == b"ok":
                    return _loads(frames)
                raise pickle.loads(frames[0].buffer)
            self.local.sock = None  # the request died with the old store: send it again to the new one
            sock.close(linger=0)

    def _restarted(self) -> bool:
        """Whether the store is another process than the one asked (Ray restarted it): then reconnect.
        The Ray call waits through a restart and raises ``StoreUnavailableError`` past its deadline."""
        address, pid = self.address, self.pid
        self._refresh()
        return (self.address, self.pid) != (address, pid)
