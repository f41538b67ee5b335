"""Shared-memory ring channel: the segment format, the protocol over it, and where it runs.

One writer, N readers on one node, one write serves all: ``ring_writer.ShmRingWriter``
and ``ring_reader.ShmRingReader`` (both importable from ``cgc.runtime.channels``), over the
wait loop they share (``ring_endpoint.RingEndpoint``). The underscore names below are the
format's offsets and records, shared by those modules only.

Segment layout (data view of ``<segment dir>/<name>``, created by the writer)::

    header   magic, version, slots, num_readers, slot_bytes, closed, writer_waiting
    wseq     u64 values published (own cache line; readers futex-wait on its low half)
    reader i u64 rseq_i (values reader i consumed), u32 waiting_i, u32 pid, u64 start,
             u64 pid namespace                                   (one cache line each)
    slot k   64-byte slot header (layout, nbufs, seq, pickle_len, block_id, payload_len)
             + ``slot_bytes`` payload, k = seq % slots

Flow: the writer may fill slot ``seq % slots`` when every ``rseq_i > seq - slots``; it
writes the payload, then the slot header (with ``seq``), then publishes by storing
``wseq = seq + 1``. Reader i takes value ``rseq_i``: it checks the slot header's ``seq``
(one integer compare: a torn or overwritten slot is poison, never a value), decodes, and
only then stores ``rseq_i + 1``. Each word has exactly one writer process.

Memory ordering (why x86_64 only): the protocol needs (1) the payload and slot-header
stores to be visible before the ``wseq`` store that publishes them, and the cursor store to
come after the reader's last load of the slot (release); (2) the reader's loads of the slot
to come after its load of ``wseq`` (acquire); (3) full fences for the Dekker-style waiter
flags (store my flag, then load the other side's word). On x86_64 (TSO) every plain store
is a release and every plain load an acquire, in hardware; CPython cannot reorder them
either: each store here is a separate C call (memoryview item/slice assignment,
``struct.pack_into``) whose effects the compiler must keep in program order across opaque
calls; aligned 8-byte stores are single ``mov`` instructions, so never torn. (3) is
``futex.fence()``: a lock acquire/release, i.e. ``lock``-prefixed instructions, each a full
barrier on x86. On weakly ordered CPUs (aarch64, ppc64le) (1) and (2) do not hold for plain
stores and loads, and Python has no portable release store on a shared mapping: the only
PyPI library giving atomics on a buffer (``atomics``) is GPL-3.0 (this project is
Apache-2.0), and a compiled helper built at import time is fragile. So the ring refuses to
start elsewhere (``UnsupportedPlatformError``): use ``host_transport="tcp"`` there (TCP
channels are correct on every architecture), never a silent race.

Example (where the first slot starts, the slot stride, the segment's size)::

    >>> _layout(slots=4, num_readers=2, slot_bytes=4096)
    (256, 4160, 16896)
"""

from __future__ import annotations

import enum
import os
import struct

from cgc.runtime.channels.errors import UnsupportedPlatformError
from cgc.runtime.channels.futex import fence, fence_halves, futex_wake
from cgc.runtime.channels.shm import Segment

__all__ = ["Closed", "ring_supported", "require_ring_support", "ring_segment_size"]


class Closed(enum.IntEnum):
    """The ring's state word at ``_H_CLOSED``."""

    OPEN = 0
    CLOSED = 1  # an end closed it: readers drain what is left, then stop
    POISONED = 2  # a peer failed: every waiter raises at once

_MAGIC = 0x52474743  # "CGGR"
_VERSION = 2
_HDR = struct.Struct("<IIIIQ")  # magic, version, slots, num_readers, slot_bytes
_H_CLOSED = 24  # u32: a Closed value
_H_NREADERS = 12  # u32 num_readers, inside _HDR
_H_WWAIT = 28  # u32: the writer sleeps on a reader cursor
_H_ZC = 40  # u64 zero_copy_min (informational)
_H_WSEQ = 64
# Their indexes in the u32 / u64 views, for the hot paths (a global's // is not folded).
_CLOSED_I = _H_CLOSED // 4
_WSEQ_Q = _H_WSEQ // 8
# fence() in two C calls, for the per-value paths (publish, advance): a Python call less.
_fence_a, _fence_r = fence_halves()
_R_BASE = 128
_R_STRIDE = 64
_R_ID = struct.Struct("<IQQ")  # at +12 of a reader record: pid, start ticks, pid namespace
_SLOT_HDR = struct.Struct("<IIQQQQ")  # layout, nbufs, seq, pickle_len, block_id, payload_len
_SLOT_HDR_SIZE = 64
_INLINE, _BLOCK = 1, 2
_U_BSEQ = 16 // 4  # u32 index of a block's value sequence number (low half, then high)
_TSO_MACHINES = frozenset({"x86_64", "amd64", "AMD64"})


def ring_supported() -> bool:
    """Whether this CPU orders memory strongly enough for the ring (x86_64, see above)."""
    return os.uname().machine in _TSO_MACHINES


def require_ring_support() -> None:
    """Refuse to run the ring where its memory ordering is not proven.

    Raises:
        UnsupportedPlatformError: not x86_64 (use host_transport="tcp" there).
    """
    if not ring_supported():
        raise UnsupportedPlatformError(
            f"the shared-memory ring channel relies on x86-64 memory ordering and is not "
            f"proven on {os.uname().machine}; start the graph with host_transport='tcp' "
            "(TCP channels work on every architecture)")


def _a64(n: int) -> int:
    return (n + 63) & ~63


def _layout(slots: int, num_readers: int, slot_bytes: int) -> tuple[int, int, int]:
    first = _a64(_R_BASE + _R_STRIDE * num_readers)
    stride = _a64(_SLOT_HDR_SIZE + slot_bytes)
    return first, stride, first + stride * slots


def ring_segment_size(slots: int, num_readers: int, slot_bytes: int) -> int:
    """Data bytes of a ring's segment (the header, reader cursors and ``slots`` slots of
    ``slot_bytes``): what ``RingWriter.create`` asks ``Segment.create`` for, and what the
    start check of /dev/shm space counts (``cgc.runtime.driver.shm_space``).

    Example:
        >>> ring_segment_size(slots=4, num_readers=2, slot_bytes=4096)
        16896
    """
    return _layout(slots, num_readers, slot_bytes)[2]


def _set_closed(seg: Segment, code: Closed) -> None:
    u = seg.mv.cast("I")
    try:
        if u[_CLOSED_I] != Closed.POISONED:  # poisoned stays poisoned
            u[_CLOSED_I] = code
        fence()
        nr = u[_H_NREADERS // 4]
        futex_wake(seg.addr + _H_WSEQ)
        for i in range(nr):
            futex_wake(seg.addr + _R_BASE + _R_STRIDE * i)
    finally:
        u.release()
