"""Wait on the CPU for device work that can only be polled: a back-off loop with a deadline.

NCCL's non-blocking calls (``ncclCommGetAsyncError``) and CUDA events (``query()``) have
no wait with a timeout that also lets the caller notice a failure elsewhere, so both are
polled: sleeps that grow from ``FIRST_NAP`` (20 µs) to ``MAX_NAP`` (1 ms), the caller's
``poll()`` every ``POLL_EVERY`` (50 ms) between them - it raises to end the wait, e.g. on
an abort or an NCCL async error - and a deadline.

Example:
    >>> import time
    >>> from cgc.runtime.gpu.polling import poll_until
    >>> end = time.monotonic() + 0.01
    >>> poll_until(lambda: time.monotonic() >= end, None, None, "the clock")
"""

from __future__ import annotations

import time
from collections.abc import Callable

from cgc.runtime.channels.errors import ChannelTimeoutError

__all__ = ["FIRST_NAP", "MAX_NAP", "POLL_EVERY", "poll_until"]

FIRST_NAP = 20e-6  # first sleep, doubled after each until MAX_NAP
MAX_NAP = 1e-3
POLL_EVERY = 0.05  # seconds between the caller's poll() calls


def poll_until(done: Callable[[], bool], deadline: float | None,
               poll: Callable[[], None] | None, timeout_message: str, *,
               first_nap: float = FIRST_NAP) -> None:
    """Return once ``done()`` is true, checking it first; between checks: past
    ``deadline`` (a ``time.monotonic()`` value; None: none) raise, ``poll()`` if
    ``POLL_EVERY`` s passed since the start or its last call, then sleep (``first_nap``,
    doubling, at most ``MAX_NAP``).

    Example: ``poll_until(event.query, time.monotonic() + 5, None, "copy not done")``.

    Raises:
        ChannelTimeoutError: ``timeout_message``, once ``done()`` was still false at or
            after ``deadline``.
        Whatever ``done()`` or ``poll()`` raise (e.g. an NCCL error, an abort).
    """
    nap, last_poll = first_nap, time.monotonic()
    while not done():
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            raise ChannelTimeoutError(timeout_message)
        if poll is not None and now - last_poll >= POLL_EVERY:
            poll()
            last_poll = now
        time.sleep(nap)
        nap = min(nap * 2, MAX_NAP)
