"""The kernel's page cache, asked and told: whether a file's bytes are in it, which bytes a read will want.

Why one module: the warm tier's reads (``tiers/ipcread``, ``tiers/chunkcheck``) and the lake's row reader
(``lake/rowpages``) both decide by a probe whether a take waits for the disk, and then announce its
ranges (``POSIX_FADV_WILLNEED``) so the disk serves them at once instead of one after another.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

#: ``preadv``'s flag for a read that returns ``EAGAIN`` instead of waiting for the disk (Linux >= 4.14)
NOWAIT: int | None = getattr(os, "RWF_NOWAIT", None)
_PROBE = bytearray(1)  # where a probe's byte goes (its value is never read)


def in_page_cache(fd: int, offset: int) -> bool:
    """Whether the byte at ``offset`` of ``fd`` is in the page cache (``RWF_NOWAIT``); True where the
    kernel cannot tell, so nothing is announced there."""
    if NOWAIT is None:
        return True
    try:
        os.preadv(fd, [_PROBE], offset, NOWAIT)
    except BlockingIOError:
        return False
    except OSError:
        return True  # a filesystem without RWF_NOWAIT
    return True


def will_need(spans: Iterable[tuple[int, int, int]]) -> None:
    """Announce (file descriptor, offset, length) spans a read will want (``POSIX_FADV_WILLNEED``): the
    kernel starts reading those not in the page cache now. A hint only: errors are the read's to say."""
    advise, will = os.posix_fadvise, os.POSIX_FADV_WILLNEED
    try:
        for fd, offset, length in spans:
            if length:
                advise(fd, offset, length, will)
    except OSError:
        pass
