"""``engine/deadline``: a call or stream bounded by a deadline leaves no helper thread behind once it
has ended (``close()`` is checked for leftover threads right after it returns: ``test_open_release``),
and a stalled one is given up at the deadline without waiting for it."""

from __future__ import annotations

import threading
import time

import pytest

from lakebuffer.engine.deadline import bounded_call, bounded_iter


class Overdue(Exception):
    pass


def _helpers(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name and t.is_alive()]


def test_a_bounded_call_joins_its_helper_before_it_returns() -> None:
    for i in range(200):  # the helper used to end just after the call returned: a race, so many tries
        assert bounded_call(lambda i=i: i * 2, time.monotonic() + 10, Overdue, name="t-call") == i * 2
        assert not _helpers("t-call")


def test_a_failing_call_raises_its_error_and_leaves_no_helper() -> None:
    def fail() -> None:
        raise KeyError("x")

    for _ in range(50):
        with pytest.raises(KeyError):
            bounded_call(fail, time.monotonic() + 10, Overdue, name="t-fail")
        assert not _helpers("t-fail")


def test_a_stream_read_to_its_end_leaves_no_helper() -> None:
    for _ in range(50):
        assert list(bounded_iter(iter(range(5)), time.monotonic() + 10, Overdue, name="t-iter")) == list(range(5))
        assert not _helpers("t-iter")


def test_a_stalled_call_is_overdue_at_its_deadline() -> None:
    release = threading.Event()
    t0 = time.monotonic()
    with pytest.raises(Overdue):
        bounded_call(lambda: release.wait(30), time.monotonic() + 0.3, Overdue, name="t-stall")
    assert time.monotonic() - t0 < 5
    release.set()  # the helper, still in the call, then ends on its own
