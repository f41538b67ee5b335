"""Doorbells: wake an actor's waiting reader *before* its data arrives (wake-ahead).

Why: a reader whose wait outlasts its spin budget sleeps on a futex, and waking a sleeping
process costs ~50-100 µs on a many-core host - once per hop, so a long chain of idle
actors pays it N times per execution. The plan says who comes after whom: each actor has a
*depth* (hops from the driver), and one shared u32 word per depth is its doorbell. Ringing
a bell (bump the word, FUTEX_WAKE) wakes the sleeping readers at that depth without data;
they then spin (yielding) for a bounded time, so the data finds them awake. The driver
rings depths 2..1+K when it submits an execution, and an actor at depth d rings d+K when
it starts its work: a window of K readers ahead of the data stays awake while the data
moves, and nothing rings while the graph is idle (idle actors sleep as before).

A reader waits on its ring word *and* its bell at once (``futex_waitv``); without it
(Linux < 5.16) there is no wake-ahead and waits are as before.

Example:
    >>> b = Bells.create("cgc-doc-bell", depths=4)
    >>> b.ring(2); b.value(2)
    1
    >>> b.close()
"""

from __future__ import annotations

from cgc.runtime.channels.futex import futex_wake
from cgc.runtime.channels.shm import Segment

__all__ = ["Bells", "BELL_SPIN_S"]

_LINE_BYTES = 64  # each bell on its own cache line
_LINE = _LINE_BYTES // 4  # u32 words per line
BELL_SPIN_S = 1e-3  # how long a reader rung ahead spins before sleeping again


class Bells:
    """One doorbell word per depth ``0..depths`` in one shared segment."""

    seg: Segment
    u: memoryview  # the segment as u32 words
    depths: int  # the deepest bell (bells 1..depths ring; 0 is unused)

    @classmethod
    def create(cls, name: str, depths: int) -> Bells:
        """Create the segment (the driver does, before the actors attach)."""
        self = cls()
        self.seg = Segment.create(name, _LINE_BYTES * (depths + 1))
        self._init()
        return self

    @classmethod
    def attach(cls, name: str) -> Bells:
        """Map the segment an actor's driver created.

        Raises:
            FileNotFoundError: no such segment (e.g. the actor runs on another node).
        """
        self = cls()
        self.seg = Segment.attach(name)
        self._init()
        return self

    def _init(self) -> None:
        self.u = self.seg.mv.cast("I")
        self.depths = self.seg.size // _LINE_BYTES - 1

    def address(self, depth: int) -> tuple[int, int]:
        """(address of the word, its index in ``u``) of bell ``depth``."""
        return self.seg.addr + _LINE_BYTES * depth, depth * _LINE

    def value(self, depth: int) -> int:
        """The bell's current count."""
        return self.u[depth * _LINE]

    def ring(self, depth: int) -> None:
        """Wake every reader sleeping at ``depth`` (a no-op outside ``1..depths``)."""
        if 0 < depth <= self.depths:
            i = depth * _LINE
            self.u[i] = (self.u[i] + 1) & 0xFFFFFFFF
            futex_wake(self.seg.addr + _LINE_BYTES * depth)

    def close(self) -> None:
        """Unmap (and unlink, for the creator)."""
        try:
            self.u.release()
        except (AttributeError, ValueError):
            pass
        self.seg.close()
