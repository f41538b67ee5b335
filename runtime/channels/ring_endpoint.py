"""What both ends of a ring share: the mapping and its views, waiting, close and poison.

Waiting: an optional bounded spin (``spin_us``, default 0: on 2 cores a spinner steals the
CPU its peer needs), then a real kernel sleep: the waiter sets its own *waiting* flag,
fences, re-reads the watched word and calls FUTEX_WAIT on it; the other side, after its
store and a fence, issues FUTEX_WAKE only if a flag is set. No syscall on the fast path, no
lost wake-up. Sleeps are sliced (0.25 s); after each slice that ends without a wake-up the
waiter checks that its peer is alive (the writer, or the reader it waits for: PID + start
time, see ``procs``), so a blocked read or write ends with ``PeerDiedError`` within about a
second of a peer's death even with no monitor around; the check never runs on the fast path.
``close``/``poison`` set ``closed`` and wake every futex word, so each blocked party raises
ChannelClosedError.
"""

from __future__ import annotations

import os
import time
from typing import Any

from cgc.runtime.channels.bell import BELL_SPIN_S
from cgc.runtime.channels.errors import (
    ChannelClosedError,
    ChannelSequenceError,
    ChannelTimeoutError,
    PeerDiedError,
)
from cgc.runtime.channels.futex import HAVE_WAITV, fence, futex_wait, futex_wait2
from cgc.runtime.channels.procs import is_alive
from cgc.runtime.channels.ring_layout import (
    _CLOSED_I,
    _HDR,
    _R_BASE,
    _R_ID,
    _R_STRIDE,
    Closed,
    _layout,
    _set_closed,
)
from cgc.runtime.channels.shm import Segment

__all__ = ["RingEndpoint"]

_SLICE = 0.25  # longest single futex sleep: a safety net, and the peer-liveness period
_SPIN_MAX = 500e-6  # longest adaptive spin before a futex sleep


class RingEndpoint:
    """What writer and reader share: the mapping, views, the wait loop, close/poison."""

    _seg: Segment

    def _init_views(self, spin_us: float) -> None:
        seg = self._seg
        self._mv = seg.mv
        self._q = seg.mv.cast("Q")
        self._u = seg.mv.cast("I")
        magic, _v, self.slots, self.num_readers, self.slot_bytes = _HDR.unpack_from(seg.mv, 0)
        self._first, self._stride, _ = _layout(self.slots, self.num_readers, self.slot_bytes)
        self._spin = spin_us / 1e6
        self._spin_budget = self._spin
        self._wait_est = 0.0
        self.name = seg.name
        self._bell: tuple[Any, int, int] | None = None  # (bells u32 view, index, address)

    def _wait(self, ready: Any, watch_off: int, flag_idx: int, timeout: float | None,
              what: str, peer: int) -> None:
        u = self._u
        if self._spin > 0:
            start = time.perf_counter()
            end = start + self._spin_budget
            while True:
                now = time.perf_counter()
                if ready():
                    self._learn(now - start)
                    return
                if now >= end or u[_CLOSED_I]:
                    break  # the sleep loop below raises for a closed channel
                os.sched_yield()  # on an oversubscribed core, let the peer run instead
            self._sleep(ready, watch_off, flag_idx, timeout, what, peer)
            self._learn(time.perf_counter() - start)
            return
        self._sleep(ready, watch_off, flag_idx, timeout, what, peer)

    def _learn(self, waited: float) -> None:
        # Adaptive spin: waking a sleeping process costs ~50 us on these VMs, so a wait
        # that usually ends within a few hundred microseconds (a 1 MiB copy upstream) is
        # cheaper to spin through. Waits longer than _SPIN_MAX count as zero: for them
        # (an idle graph, slow methods) sleeping costs nothing noticeable, and the budget
        # decays back to the configured spin.
        # (Comparisons, not min/max: this runs once per wait, on the value's way out.)
        est = 0.8 * self._wait_est + 0.2 * (waited if waited <= _SPIN_MAX else 0.0)
        self._wait_est = est
        budget = 2.0 * est
        if budget < self._spin:
            budget = self._spin
        self._spin_budget = budget if budget < _SPIN_MAX else _SPIN_MAX

    def _sleep(self, ready: Any, watch_off: int, flag_idx: int, timeout: float | None,
               what: str, peer: int) -> None:
        u = self._u
        deadline = None if timeout is None else time.monotonic() + timeout
        addr = self._seg.addr + watch_off
        widx = watch_off // 4
        bell = self._bell if peer < 0 else None  # only reads are rung ahead
        try:
            while True:
                u[flag_idx] = 1
                fence()
                expected = u[widx]  # read before ready(): a change in between makes WAIT return
                if bell is not None:
                    rung = bell[0][bell[1]]
                if ready():
                    return
                if u[_CLOSED_I]:
                    self._raise_closed()
                rem = _SLICE
                if deadline is not None:
                    rem = min(deadline - time.monotonic(), _SLICE)
                    if rem <= 0:
                        raise ChannelTimeoutError(f"channel {self.name}: {what} timed out "
                                                  f"after {timeout} s")
                if bell is None:
                    if not futex_wait(addr, expected, rem):
                        self._check_peer(peer)  # a whole slice without a wake-up: peer alive?
                    continue
                woke = futex_wait2(addr, expected, bell[2], rung, rem)
                if bell[0][bell[1]] != rung and self._spin_after_bell(ready):
                    return
                if not woke:
                    self._check_peer(peer)
        finally:
            u[flag_idx] = 0  # also on an interrupt: a stale flag would cost the peer syscalls

    def _spin_after_bell(self, ready: Any) -> bool:
        """Rung ahead of the data: spin (yielding) up to ``BELL_SPIN_S`` for it to arrive.

        The waiting flag stays set meanwhile, so a writer that publishes now also wakes us
        at worst one syscall late. Returns True once ``ready()``.
        """
        end = time.perf_counter() + BELL_SPIN_S
        u = self._u
        while time.perf_counter() < end:
            if ready():
                return True
            if u[_CLOSED_I]:
                return False  # the sleep loop raises for a closed channel
            os.sched_yield()
        return ready()

    def set_bell(self, bells: Any, depth: int) -> None:
        """Also wake (and spin) when bell ``depth`` of ``bells`` rings (``bell.Bells``);
        needs ``futex_waitv`` (``HAVE_WAITV``), else ignored."""
        if HAVE_WAITV:
            addr, idx = bells.address(depth)
            self._bell = (bells.u, idx, addr)

    def _peer_identity(self, peer: int) -> tuple[int, int, int, str]:
        if peer < 0:
            pid, start, ns = self._seg.creator
            return pid, start, ns, "writer"
        pid, start, ns = _R_ID.unpack_from(self._mv, _R_BASE + _R_STRIDE * peer + 12)
        return pid, start, ns, f"reader {peer}"

    def _check_peer(self, peer: int) -> None:
        """Raise PeerDiedError (after poisoning the channel) when ``peer`` is gone:
        -1 is the writer, ``i`` reader i."""
        pid, start, ns, role = self._peer_identity(peer)
        if not is_alive(pid, start, ns):
            _set_closed(self._seg, Closed.POISONED)  # everyone else blocked on this channel learns it too
            raise PeerDiedError(self.name, pid, role)

    def _raise_closed(self) -> None:
        how = ("poisoned (a peer failed)" if self._u[_CLOSED_I] == Closed.POISONED
               else "closed")
        raise ChannelClosedError(f"channel {self.name} was {how}")

    def _corrupt(self, seq: int, got: int) -> None:
        _set_closed(self._seg, Closed.POISONED)
        raise ChannelSequenceError(f"channel {self.name}: the slot for value {seq} holds value "
                                   f"{got} (torn or overwritten); the channel is poisoned")

    def poison(self) -> None:
        """Mark the channel failed and wake every waiter (they raise ChannelClosedError)."""
        _set_closed(self._seg, Closed.POISONED)

    @property
    def closed(self) -> bool:
        """True once any side closed or poisoned the channel."""
        return bool(self._u[_CLOSED_I])

    def _release_views(self) -> None:
        for v in (self._q, self._u):
            v.release()
