"""Linux futex(2) on shared-memory words, through ctypes, plus a full memory fence.

The waits are *non-private* futexes (no FUTEX_PRIVATE_FLAG) because the word lives in a
shared-memory segment mapped by several processes. ``futex_wait`` releases the GIL (ctypes
CDLL calls do), so other threads of the process keep running while one sleeps.

Example:
    >>> import ctypes
    >>> from cgc.runtime.channels.futex import futex_wait, futex_wake
    >>> w = ctypes.c_uint32(0)
    >>> futex_wait(ctypes.addressof(w), 1, 0.01)  # value differs: returns at once
    True
    >>> futex_wake(ctypes.addressof(w))
    0
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
import time
from typing import Any

__all__ = ["futex_wait", "futex_wait2", "futex_wake", "fence", "fence_halves", "HAVE_WAITV"]

_SYS_FUTEX = 202  # x86_64; aarch64 uses 98
if os.uname().machine in ("aarch64", "arm64"):
    _SYS_FUTEX = 98
_FUTEX_WAIT = 0
_FUTEX_WAKE = 1
_INT_MAX = 0x7FFFFFFF

# A private CDLL handle so setting argtypes cannot clash with anyone else's use of syscall().
_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_syscall.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                     ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_tls = threading.local()


def _timespec(slot: str, seconds: float) -> int:
    """Address of this thread's ``_Timespec`` in ``slot`` set to ``seconds`` (>= 0).

    Why per thread and reused: a wait runs on every slow read; allocating a struct each
    time costs more than filling one in.
    """
    ts = getattr(_tls, slot, None)
    if ts is None:
        ts = _Timespec()
        setattr(_tls, slot, ts)
    sec = int(seconds)
    ts.tv_sec = sec
    ts.tv_nsec = int((seconds - sec) * 1e9)
    return ctypes.addressof(ts)


def _wait_result(rc: int, call: str) -> bool:
    """A futex wait's outcome from its return code: True when woken (rc >= 0, EAGAIN: the
    value already differed, EINTR: callers re-check in a loop anyway), False on timeout.

    Raises:
        OSError: any other errno (EFAULT, EINVAL: a bad address), naming ``call``.
    """
    if rc >= 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EAGAIN, errno.EINTR):
        return True
    if err == errno.ETIMEDOUT:
        return False
    raise OSError(err, f"{call} failed: {os.strerror(err)}")


def futex_wait(addr: int, expected: int, timeout: float | None) -> bool:
    """Sleep while the u32 at ``addr`` equals ``expected``, at most ``timeout`` seconds.

    Returns True when woken or the value already differed (EAGAIN), False on timeout.
    EINTR counts as a wake-up (callers re-check their condition in a loop anyway).

    Raises:
        OSError: any other futex error (EFAULT, EINVAL: a bad address).
    """
    ts_ptr = None if timeout is None else _timespec("ts", max(timeout, 0.0))
    rc = _syscall(_SYS_FUTEX, addr, _FUTEX_WAIT, expected & 0xFFFFFFFF, ts_ptr, None, 0)
    return _wait_result(rc, "futex wait")


def futex_wake(addr: int, count: int = _INT_MAX) -> int:
    """Wake up to ``count`` waiters on the word at ``addr``; returns how many woke.

    Raises:
        OSError: the futex call failed (bad address).
    """
    rc = _syscall(_SYS_FUTEX, addr, _FUTEX_WAKE, count, None, None, 0)
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"futex wake failed: {os.strerror(err)}")
    return rc


_SYS_FUTEX_WAITV = 449  # Linux >= 5.16, same number on x86_64 and aarch64
_FUTEX2_SIZE_U32 = 0x02
_CLOCK_MONOTONIC = 1


_waitv = ctypes.CDLL(None, use_errno=True).syscall  # its own handle: its own argtypes
_waitv.restype = ctypes.c_long
_waitv.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint,
                   ctypes.c_void_p, ctypes.c_int]


class _Waitv(ctypes.Structure):
    _fields_ = [("val", ctypes.c_uint64), ("uaddr", ctypes.c_uint64),
                ("flags", ctypes.c_uint32), ("reserved", ctypes.c_uint32)]


def _probe_waitv() -> bool:
    # An empty wait list is EINVAL where futex_waitv exists, ENOSYS where it does not.
    rc = _waitv(_SYS_FUTEX_WAITV, None, 0, 0, None, 0)
    return not (rc < 0 and ctypes.get_errno() == errno.ENOSYS)


HAVE_WAITV = _probe_waitv()


def futex_wait2(addr: int, expected: int, addr2: int, expected2: int,
                timeout: float | None) -> bool:
    """Sleep while the u32 at ``addr`` equals ``expected`` *and* the one at ``addr2``
    equals ``expected2`` (``futex_waitv``; check ``HAVE_WAITV`` first).

    Returns True when woken on either word or a value already differed, False on timeout.

    Raises:
        OSError: a futex error other than EAGAIN / EINTR / ETIMEDOUT.
    """
    ws = getattr(_tls, "waitv", None)
    if ws is None:
        ws = _tls.waitv = (_Waitv * 2)()
        ws[0].flags = ws[1].flags = _FUTEX2_SIZE_U32
    ws[0].uaddr, ws[0].val = addr, expected & 0xFFFFFFFF
    ws[1].uaddr, ws[1].val = addr2, expected2 & 0xFFFFFFFF
    ts_ptr = None
    if timeout is not None:  # futex_waitv takes an absolute CLOCK_MONOTONIC deadline
        ts_ptr = _timespec("ts2", time.clock_gettime(time.CLOCK_MONOTONIC) + max(timeout, 0.0))
    rc = _waitv(_SYS_FUTEX_WAITV, ctypes.addressof(ws), 2, 0, ts_ptr, _CLOCK_MONOTONIC)
    return _wait_result(rc, "futex_waitv")


_fence_lock = threading.Lock()


def fence() -> None:
    """Full memory barrier (store→load ordering across processes).

    Why: the waiter-flag protocol is Dekker-style (publish, then check the other side's
    flag); x86 may reorder a store with a later load. A lock acquire/release executes a
    ``lock``-prefixed instruction (CPython's lock is a compare-and-swap), which is a full
    fence on x86, for ~0.1 µs. This argument holds on x86-64 only; the ring refuses other
    architectures (``ring.require_ring_support``), the futex calls themselves work there.
    """
    _fence_lock.acquire()
    _fence_lock.release()


def fence_halves() -> tuple[Any, Any]:
    """``(acquire, release)`` of the fence's lock: ``a(); r()`` is ``fence()`` without a
    Python call, for the channels' per-value paths (~0.1 µs each, twice per hop).

    >>> acquire, release = fence_halves()
    >>> acquire(); release()
    True

    Raises:
        Nothing.
    """
    return _fence_lock.acquire, _fence_lock.release
