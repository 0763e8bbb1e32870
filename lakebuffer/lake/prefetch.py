"""Per-file metadata read ahead of a take, a few files at a time.

Why: a cold get touching tens of files paid one footer read (on S3 a request or two) per file, one
after another. The row reader's layouts and DataFusion's registrations are both read this way.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from . import runtime

T = TypeVar("T")


def prefetch(todo: list[T], load: Callable[[T], object], threads: int, name: str,
             ignore: tuple[type[BaseException], ...]) -> None:
    """Call ``load`` on every item of ``todo``, ``threads`` at a time (nothing for fewer than two).
    Errors of the ``ignore`` kinds are dropped: the caller's own read of that file reports them."""
    if len(todo) < 2:
        return

    def one(item: T) -> None:
        try:
            load(item)
        except ignore:
            pass

    with ThreadPoolExecutor(min(threads, len(todo)), thread_name_prefix=name) as pool:
        runtime.pool_map(pool, one, todo)
