"""Background work with two priorities, so persistence never blocks the trainer.

p0 holds critical work (push persistence, delete, snapshot), p1 low-priority work (eviction
write-back, populate/prefetch). When both have work, a worker takes p0 with probability 0.8 and
p1 with 0.2: neither can starve the other. A failed task is kept and re-raised on the next API
call (``check()``), never swallowed. ``submit_later`` queues best-effort work once a delay has passed
(the catalog's warm-up after writes go quiet): ``drain`` does not wait for it, ``close`` drops it.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from ..errors import BackgroundDiskFullError, DiskFullError, LakeExitingError, WorkerError

log = logging.getLogger("lakebuffer.tasks")

P0, P1 = 0, 1
_P0_SHARE = 0.8


@dataclass
class _Task:
    fn: Callable[[], Any]
    name: str
    queued_at: float
    surface: bool = True
    future: Future = field(default_factory=Future)
    seq: int = 0
    kind: str = ""


class _Latency:
    """Recent queue-wait + run latencies of one queue (a small ring, for ``stats()``)."""

    def __init__(self, size: int = 256) -> None:
        self.samples: deque[float] = deque(maxlen=size)
        self.done = 0

    def add(self, seconds: float) -> None:
        self.samples.append(seconds)
        self.done += 1

    def summary(self) -> dict[str, float]:
        if not self.samples:
            return {"done": self.done, "p50_ms": 0.0, "p99_ms": 0.0}
        s = sorted(self.samples)
        return {
            "done": self.done,
            "p50_ms": 1000 * s[len(s) // 2],
            "p99_ms": 1000 * s[min(len(s) - 1, int(len(s) * 0.99))],
        }


class TaskQueue:
    """Two FIFO queues drained by ``workers`` threads with an 80/20 priority pick."""

    def __init__(self, workers: int = 1, seed: int = 0, name: str = "lakebuffer") -> None:
        self._queues: tuple[deque[_Task], deque[_Task]] = (deque(), deque())
        self._cv = threading.Condition()
        self._rng = random.Random(seed)
        self._running = 0
        self._stopping = False
        self._error: BaseException | None = None
        self._error_task = ""
        self._latency = (_Latency(), _Latency())
        self._delayed: list[tuple[float, int, int, _Task]] = []  # (due, order, priority, task), a heap
        self._order = itertools.count()
        self._submitted = 0  # sequence number of the last task queued
        self._open: dict[int, str] = {}  # sequence number -> kind, of tasks queued or running (``barrier``)
        self._threads = [
            threading.Thread(target=self._loop, name=f"{name}-worker-{i}", daemon=True) for i in range(workers)
        ]
        for t in self._threads:
            t.start()
        from ..lake import runtime  # deferred: the lake package imports the engine's neighbours

        for t in self._threads:  # at interpreter exit, no worker may still be inside delta-rs / Arrow
            runtime.register_thread(t, self.abandon)

    def submit(self, priority: int, fn: Callable[[], Any], name: str = "", surface: bool = True,
               kind: str = "") -> Future:
        """Queue ``fn``; its Future carries the result or the exception.

        ``surface=False`` for tasks whose caller handles the failure itself (waits on the future,
        or records it), so it is not raised a second time by ``check()``.
        """
        task = _Task(fn, name or getattr(fn, "__name__", "task"), time.perf_counter(), surface, kind=kind)
        with self._cv:
            if self._stopping:
                raise WorkerError("the task queue is stopped")
            self._submitted += 1
            task.seq = self._submitted
            self._open[task.seq] = kind
            self._queues[priority].append(task)
            self._cv.notify()
        return task.future

    def submit_later(self, priority: int, fn: Callable[[], Any], delay_s: float, name: str = "",
                     surface: bool = True) -> Future:
        """Queue ``fn`` at ``priority`` once ``delay_s`` seconds have passed (as ``submit`` then).

        Best effort: ``drain`` and ``barrier`` do not wait for it, ``close`` cancels it if not yet due."""
        task = _Task(fn, name or getattr(fn, "__name__", "task"), time.perf_counter(), surface)
        with self._cv:
            if self._stopping:
                raise WorkerError("the task queue is stopped")
            heapq.heappush(self._delayed, (time.monotonic() + max(0.0, delay_s), next(self._order), priority, task))
            self._cv.notify()
        return task.future

    def _release_due(self) -> float | None:
        """Move delayed tasks that are due into their queue; seconds until the next one (None: none)."""
        now = time.monotonic()
        while self._delayed and self._delayed[0][0] <= now:
            _, _, prio, task = heapq.heappop(self._delayed)
            self._queues[prio].append(task)
        return max(0.0, self._delayed[0][0] - now) if self._delayed else None

    def _pick(self) -> tuple[int, _Task] | None:
        self._release_due()
        p0, p1 = self._queues
        if p0 and p1:
            prio = P0 if self._rng.random() < _P0_SHARE else P1
        elif p0:
            prio = P0
        elif p1:
            prio = P1
        else:
            return None
        return prio, self._queues[prio].popleft()

    def _loop(self) -> None:
        while True:
            with self._cv:
                picked = self._pick()
                while picked is None:
                    if self._stopping:
                        return
                    self._cv.wait(self._release_due())
                    picked = self._pick()
                self._running += 1
            prio, task = picked
            try:
                result = task.fn()
            except BaseException as e:  # surfaced through check() and the future
                level = logging.ERROR if task.surface else logging.WARNING
                if isinstance(e, LakeExitingError):  # the process is exiting: said once by the task itself
                    level = logging.DEBUG
                log.log(level, "background task %s failed: %s", task.name, e)
                with self._cv:
                    if self._error is None and task.surface:
                        self._error, self._error_task = e, task.name
                task.future.set_exception(e)
            else:
                task.future.set_result(result)
            finally:
                self._latency[prio].add(time.perf_counter() - task.queued_at)
                with self._cv:
                    self._running -= 1
                    self._open.pop(task.seq, None)
                    self._cv.notify_all()

    def check(self) -> None:
        """Raise the first background failure (once), so it reaches the caller's next API call."""
        with self._cv:
            err, name = self._error, self._error_task
            self._error = None
        if err is not None:
            kind = BackgroundDiskFullError if isinstance(err, DiskFullError) else WorkerError
            raise kind(f"background task {name!r} failed: {err}") from err

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until both queues are empty and no task runs; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while self._queues[0] or self._queues[1] or self._running:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def barrier(self, ignore: str | None = None, timeout: float | None = None) -> bool:
        """Wait until every task queued before this call has run, except those of kind ``ignore``
        (later ones may still be queued: unlike ``drain``, busy producers cannot keep it waiting);
        False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            last = self._submitted
            while any(seq <= last and kind != ignore for seq, kind in self._open.items()):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def stats(self) -> dict[str, Any]:
        with self._cv:
            return {
                "p0": len(self._queues[0]),
                "p1": len(self._queues[1]),
                "delayed": len(self._delayed),
                "running": self._running,
                "p0_latency": self._latency[0].summary(),
                "p1_latency": self._latency[1].summary(),
            }

    def abandon(self) -> None:
        """The exit hook's stop (``lakebuffer/lake/runtime.py``): drop queued tasks, let the running one
        finish, stop the workers. Dropped work is durable locally (WAL, warm tier) and redone at the next
        open; without this a worker could be inside native code when the interpreter finalizes."""
        with self._cv:
            dropped = [t for q in self._queues for t in q] + [d[3] for d in self._delayed]
            for q in self._queues:
                q.clear()
            self._delayed.clear()
            for t in dropped:
                self._open.pop(t.seq, None)
            self._stopping = True
            self._cv.notify_all()
        for task in dropped:
            task.future.cancel()

    def close(self) -> None:
        """Drain, then stop the workers (delayed tasks not yet due are cancelled)."""
        self.drain()
        with self._cv:
            self._stopping = True
            dropped = [d[3] for d in self._delayed]
            self._delayed.clear()
            self._cv.notify_all()
        for task in dropped:
            task.future.cancel()
        self._join()

    def stop(self) -> None:
        """Stop without draining (a failed open or close): queued tasks are dropped (their work is
        durable locally and redone at the next open), the running one finishes, the workers end."""
        self.abandon()
        self._join()

    def _join(self) -> None:
        for t in self._threads:
            if t is not threading.current_thread():
                t.join()
