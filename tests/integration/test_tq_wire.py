"""The store's socket files: a SIGKILLed store leaves its ``lakebuffer-<pid>-*.sock``; the next store removes it."""

from __future__ import annotations

import os
import subprocess
import sys

from lakebuffer.integrations.tq_wire import remove_stale_sockets


def test_socket_files_of_dead_stores_are_removed_and_live_ones_kept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)  # exited: its pid is free (reuse within this test is not expected)
    gone = tmp_path / f"lakebuffer-{dead_pid}-abcd1234.sock"
    mine = tmp_path / f"lakebuffer-{os.getpid()}-abcd1234.sock"
    other = tmp_path / "lakebuffer-notapid-x.sock"
    for p in (gone, mine, other):
        p.write_bytes(b"")
    assert remove_stale_sockets(str(tmp_path)) == [str(gone)]
    assert not gone.exists() and mine.exists() and other.exists()
