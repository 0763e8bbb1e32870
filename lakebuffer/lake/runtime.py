"""Exit safety for the native code under the lake (delta-rs, Arrow C++): no abort at interpreter exit.

**The symptom** (issue 14): short processes using deltalake 1.6.6 died at exit with
``terminate called without an active exception`` (SIGABRT), or with SIGSEGV / ``FATAL: exception not
rethrown``, after every lake call had returned its result.

**The cause**, shown with gdb backtraces of the dying thread (reproducer: ``tests/exit_child.py``).
When CPython finalizes (seen on 3.11.7, deltalake 1.6.6, pyarrow 26), any *other* thread that tries to take the GIL is ended with
``pthread_exit``; glibc implements that as a forced unwind of the thread's stack. Unwinding through a
C++ ``noexcept`` frame calls ``std::terminate`` and unwinding through Rust/PyO3 frames is undefined
(seen as SIGSEGV in ``_PyRuntime``). Two kinds of thread reach for the GIL that late:

1. *Arrow's IO pool releasing Python-owned buffers.* ``DeltaTable.to_pyarrow_dataset()`` /
   ``to_pyarrow_table()`` read through ``pyarrow.fs.PyFileSystem(DeltaStorageHandler)`` with
   ``pre_buffer=True``: the Parquet reader's read-ahead futures hold ``arrow::py::PyBuffer`` objects
   (bytes handed back by the Python handler) and are destroyed on an Arrow IO thread *after* the read
   returned. ``~PyBuffer`` calls ``PyGILState_Ensure``; if finalization has begun, the thread is
   pthread_exit'ed inside the destructor -> ``terminate called without an active exception``.
   Backtrace: ``std::terminate <- _Unwind_ForcedUnwind <- pthread_exit <- take_gil <-
   PyGILState_Ensure <- arrow::py::PyBuffer::~PyBuffer <- ReadRangeCache::LazyImpl::~LazyImpl``.
   Measured (loopback moto S3, 2-core box, ``python -m tests.test_exit_safety --n 40 --target s3
   --thread none [--unsafe]``): 10 of 40 processes aborted with deltalake's default read filesystem,
   0 of 40 when the same reads go through a native ``pyarrow.fs.S3FileSystem``
   (``to_pyarrow_dataset(filesystem=...)``). Local paths did not abort in our runs (0/10): the reads
   finish before the process exits, but the hazard is the same. An fsspec filesystem wrapped in
   ``PyFileSystem(FSSpecHandler(...))`` is the same kind of Python filesystem (0 of 42 aborts seen with s3fs, but not proven safe).
   It is the same mechanism as delta-io/delta-rs#2184 and apache/arrow#34314 (terminate in a
   dataset read-ahead destructor at exit), pola-rs/polars#24169 (``scan_delta(use_pyarrow=True)``).
2. *Python threads inside a delta-rs call at exit.* A daemon thread in ``DeltaTable(...)`` (GIL
   released while Rust does IO) returns after finalization began: PyO3 re-takes the GIL, CPython
   pthread_exits the thread, the forced unwind crosses Rust frames -> SIGSEGV. Backtrace: ``SIGSEGV in
   _PyRuntime <- deltalake frames <- _Unwind_ForcedUnwind <- pthread_exit <- take_gil <-
   PyEval_RestoreThread <- deltalake (end of a GIL-released section) <- DeltaTable.__init__``. Measured
   (``--n 12 --unsafe``, one daemon thread reading the table in a loop at exit, local and S3): 11 of
   12 processes died (SIGSEGV, SIGABRT ``FATAL: exception not rethrown``, ``terminate called``);
   with this module 0 of 50 (``--n 50``, including ``ReplayBuffer`` children exiting without close).
   The lancedb and PyO3 projects describe the same race for their tokio threads
   (lancedb/lancedb#4175, PyO3/pyo3-async-runtimes#40).

**The fix we own** (this module; the lake code calls it):

* ``arrow_filesystem()`` gives Arrow a *native* filesystem (``LocalFileSystem`` / ``S3FileSystem``)
  for every dataset read, so no Python object is ever owned by Arrow's IO threads. Read a Delta
  table with ``dt.to_pyarrow_dataset(filesystem=SubTreeFileSystem(root, fs))``, never with its default.
* ``native_call()`` brackets every delta-rs / Arrow call that can run on a background thread, and
  ``register_thread()`` names our background threads with a stop function. An ``atexit`` hook
  (``shutdown``) runs while the interpreter is still whole: it refuses new native calls
  (``LakeExitingError``), stops and joins registered threads and waits for calls in flight, so no
  thread is inside native code when finalization starts. Registered on first use, so it runs before
  pyarrow's own S3 finalizer (atexit is last-in, first-out).

``tests/test_exit_safety.py`` runs many short child processes doing all of this (write, commit, read,
a background thread mid-call at exit; local and S3; normal return, ``sys.exit`` and an exception) and
requires every one to exit cleanly.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

import pyarrow.fs as pafs

from ..errors import LakeError, LakeExitingError

log = logging.getLogger(__name__)
T = TypeVar("T")

EXIT_WAIT_S = float(os.environ.get("LAKEBUFFER_EXIT_WAIT_S", "60"))
"""How long the exit hook waits for native calls in flight (a hung S3 request) before giving up."""

_cond = threading.Condition()
_inflight = 0
_closing = False
_deadline: float | None = None
_installed = False
_exiting_for_real = False
_hook_done = False  # the atexit hook has returned: finalization may run at any moment
_threads: list[tuple[threading.Thread, Callable[[], None] | None]] = []
_parked: set[int] = set()  # idents of daemon threads parked for good at exit (outside native code: done for the hook)
_mine = threading.local()  # this thread's native calls in flight (nested brackets count once each)


def install() -> None:
    """Register the exit hook once (idempotent); called by every entry point of this module."""
    global _installed
    with _cond:
        if _installed:
            return
        _installed = True
    atexit.register(_at_exit)


def _at_exit() -> None:
    """The atexit hook: from here on a daemon thread asking for a native call is parked, not refused."""
    global _exiting_for_real, _hook_done
    _exiting_for_real = True
    shutdown()
    _hook_done = True


def enter_native(what: str = "lake call", refuse: bool = True) -> None:
    """Count one native call in flight (``leave_native`` ends it); see ``native_call``."""
    install()
    global _inflight
    depth = getattr(_mine, "depth", 0)
    with _cond:
        me = threading.current_thread()
        other = me is not threading.main_thread()
        # a call nested in one this thread already has in flight is part of it: the hook waits for that
        # one, so refusing or parking here would leave it counted forever (holding its locks: 60 s at exit)
        refused = refuse and _closing and other and not depth
        late = _hook_done and other and me.daemon and not depth  # even a cleanup would race finalization now
        if not (refused or late):
            _inflight += 1
            _mine.depth = depth + 1
    if refused or late:
        if _exiting_for_real and me.daemon:
            # The interpreter is exiting: an exception would unwind this thread through more native code
            # (deallocs that release the GIL) while finalization runs, which is what aborts. Park it: the
            # process ends with it blocked here, outside native code (issue 24; CPython 3.14 does the same).
            # The hook must not join it until its deadline: a parked thread is as good as stopped.
            with _cond:
                _parked.add(me.ident or 0)
                _cond.notify_all()
            threading.Event().wait()
        raise LakeExitingError(f"{what} refused: the interpreter is exiting")


def leave_native() -> None:
    global _inflight
    _mine.depth = getattr(_mine, "depth", 1) - 1
    with _cond:
        _inflight -= 1
        _cond.notify_all()


@contextlib.contextmanager
def native_call(what: str = "lake call", refuse: bool = True) -> Iterator[None]:
    """Bracket a delta-rs / Arrow / DuckDB call so the exit hook can wait for it.

    Once exit has begun, calls from other threads are refused (``LakeExitingError``); the main thread
    may still call (e.g. a ``close()`` in a later atexit hook): it finishes before finalization goes on.
    ``refuse=False`` (cleanup such as closing a connection) is counted but never refused.
    """
    enter_native(what, refuse)
    try:
        yield
    finally:
        leave_native()


class NativeLock:
    """A re-entrant lock whose holder counts as a native call in flight (``native_call``).

    Issue 24: a user's thread inside a DuckDB query when the interpreter exits aborted the process
    (``terminate called without an active exception``: pybind11 re-takes the GIL in a ``noexcept``
    destructor, CPython's finalization ``pthread_exit``s the thread, the forced unwind hits the
    ``noexcept``). Every DuckDB call of the catalog runs under its lock; with this lock the exit hook
    waits for a query in flight and refuses new ones from other threads.

    A buffer's state lock is one too, with ``refuse=False``: its holder's calls are nested in it, so a
    thread holding it at exit finishes and lets go before the hook goes on (parked inside it, it kept
    our worker, which the hook joins, waiting: 60 s), and is parked at its next call without it.
    """

    def __init__(self, what: str, refuse: bool = True) -> None:
        self._lock = threading.RLock()
        self._what = what
        self._refuse = refuse

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        enter_native(self._what, self._refuse)
        try:
            ok = self._lock.acquire(blocking, timeout)
        except BaseException:
            leave_native()
            raise
        if not ok:
            leave_native()
        return ok

    def release(self) -> None:
        self._lock.release()
        leave_native()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    # threading.Condition's hooks (``engine/budget`` waits on the buffer's state lock): a wait releases
    # every level this thread holds, and leaves them uncounted until it takes them back
    def _release_save(self) -> tuple:
        state = self._lock._release_save()  # (levels, owner)
        for _ in range(state[0]):
            leave_native()
        return state

    def _acquire_restore(self, state: tuple) -> None:
        for _ in range(state[0]):
            enter_native(self._what, self._refuse)
        self._lock._acquire_restore(state)

    def _is_owned(self) -> bool:
        return self._lock._is_owned()


def register_thread(thread: threading.Thread, stop: Callable[[], None] | None = None) -> None:
    """Have the exit hook call ``stop()`` and join ``thread`` before the interpreter finalizes."""
    install()
    with _cond:
        _threads[:] = [(t, s) for t, s in _threads if t.is_alive() or not t.ident]
        _threads.append((thread, stop))


def exiting() -> bool:
    """True once the exit hook has started: background loops should stop issuing lake calls."""
    return _closing


def interpreter_exiting() -> bool:
    """True once the process has begun to exit: the exit hook started, or Python's own shutdown did (it
    closes every ``concurrent.futures`` executor before any atexit hook runs; CPython marks that moment
    with ``threading._SHUTTING_DOWN``, read with a default so another Python only loses the early signal)."""
    return _closing or bool(getattr(threading, "_SHUTTING_DOWN", False)) or not threading.main_thread().is_alive()


def submit(pool: Executor, fn: Callable[..., T], *args: Any) -> Future[T]:
    """``pool.submit(fn, *args)``; on the main thread of an exiting process, where Python's executors
    refuse new work, ``fn`` runs here instead and the Future holds its outcome.

    So a ``close()`` in an atexit hook (``atexit.register(buf.close)``) still takes its final snapshot
    to the lake (the interpreter is whole until the hooks return). Other threads get the refusal as a
    ``LakeExitingError``: their work is cut short at exit (durable locally, redone at the next open), not
    done during finalization. A pool our own code shut down is still its ``RuntimeError``.
    """
    try:
        return pool.submit(fn, *args)
    except RuntimeError as e:
        if not interpreter_exiting():
            raise
        if threading.current_thread() is not threading.main_thread():
            raise LakeExitingError(f"{getattr(fn, '__qualname__', 'work')} refused: the interpreter is exiting") from e
    fut: Future[T] = Future()
    try:
        fut.set_result(fn(*args))
    except BaseException as e:  # noqa: BLE001 - handed over as the Future's outcome, as the pool would
        fut.set_exception(e)
    return fut


def pool_map(pool: Executor, fn: Callable[..., T], items: Iterable[Any]) -> list[T]:
    """``list(pool.map(fn, items))`` through ``submit`` (on the main thread of an exiting process, here)."""
    futures: list[Future[T]] = []
    try:
        for item in items:  # a refusal part-way (another thread, at exit) cancels what was queued
            futures.append(submit(pool, fn, item))
        return [f.result() for f in futures]
    finally:
        for f in futures:
            f.cancel()


def shutdown(timeout_s: float | None = None) -> bool:
    """The exit hook: refuse new native calls, stop and join our threads, wait for calls in flight.

    Returns True when nothing was left inside native code. Runs from ``atexit`` (the interpreter is
    still whole, so waiting threads can finish and re-take the GIL); safe to call more than once.
    """
    global _closing, _deadline
    with _cond:
        _closing = True
        if _deadline is None:  # later calls (the atexit one after an explicit call) share the first deadline
            _deadline = time.monotonic() + (EXIT_WAIT_S if timeout_s is None else timeout_s)
        deadline = _deadline
        threads = list(_threads)
    for _, stop in threads:
        if stop is not None:
            try:
                stop()
            except Exception:  # noqa: BLE001 - one failing stop must not keep the others running
                log.exception("lakebuffer: stopping a background thread at exit failed")
    me = threading.current_thread()
    for t, _ in threads:
        if t is not me and t.ident is not None:
            _join_unless_parked(t, deadline)
    with _cond:
        while _inflight and _cond.wait(max(0.0, deadline - time.monotonic())):
            pass
        left = _inflight
    alive = [t.name for t, _ in threads if t.is_alive() and t is not me and t.ident not in _parked]
    if left or alive:
        log.warning("lakebuffer: %d lake call(s) and threads %s still running at exit after %.0f s", left, alive, EXIT_WAIT_S)
    return not left and not alive


def _join_unless_parked(thread: threading.Thread, deadline: float) -> None:
    """Wait until ``thread`` ends or parks at exit (``enter_native``), or the deadline passes."""
    while thread.is_alive() and time.monotonic() < deadline:
        with _cond:
            if thread.ident in _parked:
                return
        thread.join(min(0.02, max(0.0, deadline - time.monotonic())))


# ---- native filesystems for Arrow ---------------------------------------------------------

_S3_KEYS = {
    "key": "access_key", "aws_access_key_id": "access_key", "access_key_id": "access_key",
    "secret": "secret_key", "aws_secret_access_key": "secret_key", "secret_access_key": "secret_key",
    "token": "session_token", "aws_session_token": "session_token", "session_token": "session_token",
    "endpoint_url": "endpoint", "aws_endpoint_url": "endpoint", "aws_endpoint": "endpoint", "endpoint": "endpoint",
    "region": "region", "region_name": "region", "aws_region": "region", "aws_default_region": "region",
}


def s3_settings(storage_options: dict[str, Any] | None) -> dict[str, Any]:
    """fsspec-style or object-store-style S3 options as ``access_key``, ``secret_key``, ``session_token``,
    ``region``, ``endpoint`` (whichever are given): what a native S3 client is built from."""
    flat: dict[str, Any] = {}
    for k, v in (storage_options or {}).items():
        if k == "client_kwargs" and isinstance(v, dict):
            for ck, cv in v.items():
                if ck.lower() in _S3_KEYS:
                    flat.setdefault(_S3_KEYS[ck.lower()], cv)
        elif k.lower() in _S3_KEYS and v is not None:
            flat[_S3_KEYS[k.lower()]] = v
    return flat


def s3_filesystem(storage_options: dict[str, Any] | None = None) -> pafs.S3FileSystem:
    """A native ``pyarrow.fs.S3FileSystem`` from fsspec-style (``key``, ``endpoint_url``, ``client_kwargs``)
    or object-store-style (``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``, ...) options."""
    flat = s3_settings(storage_options)
    kw: dict[str, Any] = {k: flat[k] for k in ("access_key", "secret_key", "session_token", "region") if k in flat}
    endpoint = flat.get("endpoint")
    if endpoint:
        scheme, _, rest = str(endpoint).partition("://")
        kw["endpoint_override"] = rest or scheme
        if rest:
            kw["scheme"] = scheme
    try:
        return pafs.S3FileSystem(**kw)
    except (TypeError, ValueError, OSError) as e:
        raise LakeError(f"cannot build an S3 filesystem for the lake: {e}") from e


def arrow_filesystem(url: str, storage_options: dict[str, Any] | None = None) -> tuple[pafs.FileSystem, str]:
    """(native Arrow filesystem, path) for a lake URL: what every Arrow dataset read of the lake must use.

    Native filesystems hand Arrow Arrow-owned buffers, so Arrow's IO threads never need the GIL at
    exit (cause 1 in the module docstring). Other schemes fall back to pyarrow's own URI parsing.
    """
    install()
    scheme = url.split("://", 1)[0].lower() if "://" in url else "file"
    if scheme in ("s3", "s3a"):
        return s3_filesystem(storage_options), url.split("://", 1)[1].rstrip("/")
    if scheme == "file":
        path = url.split("://", 1)[1] if "://" in url else url
        return pafs.LocalFileSystem(), os.path.abspath(path)
    try:
        return pafs.FileSystem.from_uri(url)
    except (ValueError, OSError) as e:  # ArrowInvalid is a ValueError
        raise LakeError(f"no native Arrow filesystem for lake {url!r}: {e}") from e
