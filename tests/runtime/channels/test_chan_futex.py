"""The futex wrappers' outcomes: woken / value differed -> True, timeout -> False, a bad
address -> OSError naming the call (one shared errno mapping for both waits)."""

from __future__ import annotations

import ctypes
import threading
import time

import pytest

from cgc.runtime.channels.futex import HAVE_WAITV, futex_wait, futex_wait2, futex_wake

needs_waitv = pytest.mark.skipif(not HAVE_WAITV, reason="futex_waitv needs Linux >= 5.16")
_BAD = 8  # an unmapped address: EFAULT


def _word() -> tuple[ctypes.c_uint32, int]:
    w = ctypes.c_uint32(0)
    return w, ctypes.addressof(w)


def test_wait_value_differs_timeout_and_wake():
    w, a = _word()
    assert futex_wait(a, 1, 0.01) is True  # EAGAIN: the value already differed
    assert futex_wait(a, 0, 0.01) is False  # ETIMEDOUT
    threading.Timer(0.05, lambda: futex_wake(a)).start()
    assert futex_wait(a, 0, 5.0) is True  # woken (a timeout would return False)


def test_wait_bad_address_raises():
    with pytest.raises(OSError, match="futex wait failed"):
        futex_wait(_BAD, 0, 0.01)


@needs_waitv
def test_wait2_either_word():
    w, a = _word()
    v, b = _word()
    assert futex_wait2(a, 0, b, 1, 0.01) is True  # the second word already differed
    assert futex_wait2(a, 0, b, 0, 0.01) is False
    threading.Timer(0.05, lambda: futex_wake(b)).start()
    assert futex_wait2(a, 0, b, 0, 5.0) is True


@needs_waitv
def test_wait2_bad_address_raises():
    with pytest.raises(OSError, match="futex_waitv failed"):
        futex_wait2(_BAD, 0, _BAD + 64, 0, 0.01)


def test_timeouts_are_honoured():
    """Both waits sleep about their timeout (futex_wait's is relative, futex_waitv's an
    absolute deadline: both filled into a per-thread timespec)."""
    w, a = _word()
    v, b = _word()
    waits = [lambda: futex_wait(a, 0, 0.2)]
    if HAVE_WAITV:
        waits.append(lambda: futex_wait2(a, 0, b, 0, 0.2))
    for wait in waits:
        t0 = time.monotonic()
        assert wait() is False
        assert time.monotonic() - t0 >= 0.15  # never early (late is the scheduler's)
