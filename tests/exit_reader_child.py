"""A process that leaves a reader thread inside the buffer when it exits; used by test_exit_safety.

Issue 24 item 9: a parent that spawned and killed buffer processes printed ``terminate called without
an active exception`` at its own exit. The cause: a daemon thread inside a DuckDB call (``sql``,
``sample``, a ``scan`` fetch, or a DuckDB object's destructor) when the interpreter finalizes:
re-taking the GIL there ``pthread_exit``s the thread through a ``noexcept`` C++ frame.

usage: python -m tests.exit_reader_child DIR sql|scan|sample|spawn_kill|held
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import lakebuffer as lb
from tests.rollouts import make_rollouts


def main() -> None:
    root, what = sys.argv[1], sys.argv[2]
    path, lake = os.path.join(root, "buf"), os.path.join(root, "lake")
    if what == "spawn_kill":  # what the parent did: a buffer process killed mid-push, then reopened here
        worker = subprocess.Popen([sys.executable, "-m", "tests.crash_worker", path, "1", lake],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        worker.stdout.readline()
        worker.send_signal(signal.SIGKILL)
        worker.wait()
    buf = lb.ReplayBuffer.open(path, memory_limit_mb=8, snapshot_interval_s=0.05, lake=lake, takeover=True)
    for i in range(12):
        buf.push(make_rollouts(64, tokens=256, seed=i))

    def loop(first: bool) -> None:
        if what == "held" and first:  # inside a read's critical section (the state lock) when exit begins, as a scan's setup
            with buf._state.lock:
                buf._state.tasks.submit(0, lambda: buf._state.lock.acquire() and buf._state.lock.release(),
                                        name="needs the state lock")  # as a periodic snapshot's step does
                time.sleep(0.6)
                buf.sql("SELECT count(*) FROM rollouts")
        while True:
            if what in ("sql", "spawn_kill"):
                buf.sql("SELECT sum(len(response_ids)) FROM rollouts")
            elif what in ("scan", "held"):
                for _ in buf.scan(columns=["response_ids"]):
                    pass
            else:
                buf.get(buf.sample(64, return_keys=True), columns=["response_ids"])

    for i in range(2):
        threading.Thread(target=loop, args=(i == 0,), daemon=True).start()
    time.sleep(0.3)
    print("exiting", flush=True)  # with the threads inside the buffer and the buffer not closed


if __name__ == "__main__":
    main()
