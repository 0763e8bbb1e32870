"""Scattered copies out of a file's memory map that fail with an error, never a signal (issue 24).

Why: a warm ``get`` copies a few hundred small, scattered ranges of a few files. One ``preadv`` per
range is one system call per asked row; a memory map serves them without one, but a page of a mapped
file another program truncates raises SIGBUS in whichever thread touches it. ``process_vm_readv`` of
the process's *own* address space copies many ranges in one system call, and the kernel resolves each
page with ``get_user_pages``: a page past the end of a truncated file makes the call return what it
copied so far (errno ``EFAULT``) instead of signalling. So the map is never touched by Python or
Arrow: only its address is handed to the kernel, and a short copy is ``VmReadError``.

Linux only. Where the call is refused (seccomp, another OS) ``available()`` turns False for the rest of
the process and callers read with ``preadv`` instead.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import sys

import numpy as np

#: remote ranges per call (the kernel's UIO_MAXIOV)
IOV_MAX = 1024
MADV_RANDOM = getattr(mmap, "MADV_RANDOM", 1)


class VmReadError(OSError):
    """Fewer bytes than asked were copied: the mapped file is shorter than it was (or is unreadable)."""


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.process_vm_readv.restype = ctypes.c_ssize_t
        libc.process_vm_readv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_void_p,
                                          ctypes.c_ulong, ctypes.c_ulong]
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        libc.munmap.restype = ctypes.c_int
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.madvise.restype = ctypes.c_int
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()
_MAP_FAILED = ctypes.c_void_p(-1).value
_usable = _LIBC is not None


def available() -> bool:
    """True while scattered copies from maps work in this process (False once the kernel refused one)."""
    return _usable


class Mapping:
    """A read-only shared map of ``size`` bytes of ``fd``, unmapped when the last reference goes.

    Nothing ever reads it directly (that is what could raise SIGBUS): ``copy`` hands its address to
    the kernel. ``addr`` is 0 when the map could not be made (callers then use ``preadv``).
    """

    def __init__(self, fd: int, size: int) -> None:
        self.addr, self.size = 0, size
        if _usable and size > 0:
            addr = _LIBC.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr not in (None, _MAP_FAILED):
                self.addr = addr
                # takes are random rows: a fault reads its own pages, not the disk's read-around window
                # (``read_ahead_kb``: 8 MiB on this VM, so 59 rows of a cold page cache read 422 MB;
                # BENCHMARKS.md "#23"). A failed hint changes nothing but speed.
                _LIBC.madvise(addr, size, MADV_RANDOM)

    def __del__(self) -> None:
        if self.addr and _LIBC is not None:
            _LIBC.munmap(self.addr, self.size)
            self.addr = 0


def copy(out: np.ndarray, addr: np.ndarray, n: np.ndarray) -> bool:
    """Copy ``n[i]`` bytes from address ``addr[i]`` (inside live ``Mapping``s) for each i, one after
    another, into the contiguous ``out``. False (and ``available()`` False from then on) when the kernel
    refuses the call itself; ``VmReadError`` when it copied fewer bytes (a truncated file)."""
    global _usable
    if not _usable:
        return False
    pid = os.getpid()  # per call: a forked child must read its own maps, not its parent's
    iov = np.empty((len(n), 2), np.uint64)
    iov[:, 0] = addr
    iov[:, 1] = n
    ends = np.cumsum(n)
    local = np.empty(2, np.uint64)
    at = 0
    for lo in range(0, len(n), IOV_MAX):
        hi = min(lo + IOV_MAX, len(n))
        want = int(ends[hi - 1]) - at
        local[0], local[1] = out.ctypes.data + at, want
        got = _LIBC.process_vm_readv(pid, local.ctypes.data, 1, iov[lo:hi].ctypes.data, hi - lo, 0)
        if got != want:
            err = ctypes.get_errno() if got < 0 else 0
            if got < 0 and err in (errno.EPERM, errno.ENOSYS, errno.EINVAL, errno.ESRCH):
                _usable = False  # refused (seccomp, no support): preadv from now on
                return False
            raise VmReadError(err or errno.EFAULT, f"copied {max(got, 0)} of {want} bytes from a mapped file")
        at += want
    return True
