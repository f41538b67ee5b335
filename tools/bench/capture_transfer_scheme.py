"""The fixed-value flag handshake that orders a slot copy between two processes' CUDA graphs.

A captured graph bakes every value in, so a transfer inside a graph cannot carry a step
number or wait for "the event record of step n". The scheme here needs none: each slot
``k`` of the writer's buffers has a flag word ``F[k]`` in device memory (owned by the
writer, opened by the reader through CUDA IPC), ``FREE`` (0) or ``FULL`` (1), and each
side has one graph per slot, replayed for the steps ``n`` with ``n % slots == k``:

- writer graph ``k``: produce (compute), wait ``F[k] == FREE``, copy into slot ``k``,
  write ``F[k] = FULL`` (the write carries a memory barrier: the copy is visible first);
- reader graph ``k``: wait ``F[k] == FULL``, copy out of slot ``k``, write
  ``F[k] = FREE`` (stream order: the copy has finished reading), consume.

Why the fixed values suffice: per slot the two sides alternate strictly. The writer's
write of FULL for step ``n + slots`` follows (in its stream) its wait for FREE, which only
the reader's reset after step ``n`` satisfies; the reader's wait for FULL at step
``n + slots`` follows (in its stream) its own reset of step ``n``, so it cannot be
satisfied by the FULL of step ``n``. No value ever needs to change between replays, so
a step costs the two replays' launches and no host message.

``writer_program`` / ``reader_program`` are the op lists both the GPU benchmark
(``capture_transfer.py``) and the model checker here execute; ``simulate`` runs the two
sides as in-order streams under a random interleaving, with copies that take time (torn
while in flight), and reports every step whose reader saw another step's data.

Example:
    >>> import random
    >>> simulate(2, 50, random.Random(0)).ok
    True
    >>> bad = [simulate(2, 50, random.Random(s), reader=lambda k: reader_program(
    ...     k, wait_full=False)) for s in range(5)]
    >>> any(r.errors for r in bad)
    True
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["FREE", "FULL", "Op", "writer_program", "reader_program", "simulate", "SimResult"]

FREE, FULL = 0, 1
Op = tuple  # ("produce",) | ("wait", slot, value) | ("copy_in"|"copy_out", slot)
#             | ("write", slot, value) | ("consume",)
_TORN = "torn"


def writer_program(slot: int, *, wait_free: bool = True) -> list[Op]:
    """The writer's ops for one step on ``slot`` (``wait_free=False``: a broken control).

    Example:
        >>> writer_program(1)
        [('produce',), ('wait', 1, 0), ('copy_in', 1), ('write', 1, 1)]
    """
    # Produce first: the compute does not touch the slot, so it overlaps the reader.
    ops: list[Op] = [("produce",)]
    if wait_free:
        ops.append(("wait", slot, FREE))
    return ops + [("copy_in", slot), ("write", slot, FULL)]


def reader_program(slot: int, *, wait_full: bool = True) -> list[Op]:
    """The reader's ops for one step on ``slot`` (``wait_full=False``: a broken control).

    Example:
        >>> reader_program(0)
        [('wait', 0, 1), ('copy_out', 0), ('write', 0, 0), ('consume',)]
    """
    ops: list[Op] = [("wait", slot, FULL)] if wait_full else []
    return ops + [("copy_out", slot), ("write", slot, FREE), ("consume",)]


@dataclass
class SimResult:
    """What one simulated run saw: (step, value read) for every wrong read, and whether
    the two streams deadlocked (both blocked on a wait before the end)."""

    errors: list[tuple[int, object]] = field(default_factory=list)
    deadlock: bool = False
    reads: int = 0

    @property
    def ok(self) -> bool:
        return not self.errors and not self.deadlock


def _expand(program: list[Op], step: int) -> list[tuple]:
    """One step's ops as atomic events; a copy becomes begin + end (it takes time)."""
    out: list[tuple] = []
    for op in program:
        if op[0] in ("copy_in", "copy_out"):
            out += [(op[0] + "_begin", op[1], step), (op[0] + "_end", op[1], step)]
        else:
            out.append(op + (step,))
    return out


def simulate(slots: int, steps: int, rng: random.Random,
             writer: Callable[[int], list[Op]] = writer_program,
             reader: Callable[[int], list[Op]] = reader_program) -> SimResult:
    """Run ``steps`` steps of the two programs over ``slots`` slots, one atomic event at a
    time, the side chosen by ``rng`` among those not blocked; flags start FREE.

    Raises:
        ValueError: ``slots < 1``.
    """
    if slots < 1:
        raise ValueError("slots must be >= 1")
    flags = [FREE] * slots
    data: list[object] = [None] * slots
    queues = [[e for n in range(steps) for e in _expand(writer(n % slots), n)],
              [e for n in range(steps) for e in _expand(reader(n % slots), n)]]
    pos = [0, 0]
    seen: dict[int, object] = {}  # reader: value at copy_out begin, per slot
    got: dict[int, object] = {}  # reader: value of step n's copy
    res = SimResult()

    def runnable(side: int) -> bool:
        if pos[side] >= len(queues[side]):
            return False
        ev = queues[side][pos[side]]
        return ev[0] != "wait" or flags[ev[1]] == ev[2]

    while pos[0] < len(queues[0]) or pos[1] < len(queues[1]):
        ready = [s for s in (0, 1) if runnable(s)]
        if not ready:
            res.deadlock = True
            break
        side = rng.choice(ready)
        ev = queues[side][pos[side]]
        pos[side] += 1
        kind = ev[0]
        if kind == "write":
            flags[ev[1]] = ev[2]
        elif kind == "copy_in_begin":
            data[ev[1]] = _TORN
        elif kind == "copy_in_end":
            data[ev[1]] = ev[2]
        elif kind == "copy_out_begin":
            seen[ev[1]] = data[ev[1]]
        elif kind == "copy_out_end":
            # A copy that overlapped a write reads a mix: torn unless nothing changed.
            got[ev[2]] = seen[ev[1]] if data[ev[1]] == seen[ev[1]] else _TORN
        elif kind == "consume":
            res.reads += 1
            if got.get(ev[1]) != ev[1]:
                res.errors.append((ev[1], got.get(ev[1])))
    return res
