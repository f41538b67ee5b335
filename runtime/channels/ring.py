"""Shared-memory ring channel: one writer, N readers on one node, one write serves all.

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

Positions and failures (no desync, ever): ``reader.position`` is the shared cursor itself,
the one place that says how many values this reader consumed. A value whose decoding
raises is delivered as a ``decode_error`` value for its position (exactly one slot consumed). An
interrupt (KeyboardInterrupt, any BaseException) before the cursor store leaves the value
unread - the next ``read`` returns it; one after the store (the value is consumed but was
never returned) shows as ``position`` having moved: ``read_at(p)`` for that ``p`` then
returns a ``lost_value`` error value instead of the next value. So a caller that asks for
value ``p`` with ``read_at(p)`` gets value ``p`` or an error value for ``p``, never another.

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

Payload: pickle protocol 5. Small values (and small out-of-band buffers, copied out by the
reader) live inline in the slot, so the slot is free again as soon as ``read`` returns.
Values with an out-of-band buffer >= ``zero_copy_min`` bytes, or too large for a slot, go
to a pooled data block (see ``pool``); the slot only names the block.

Borrowing: a zero-copy result views its block, never a ring slot, so holding it can never
block the ring. The reader clears its busy word of the block when the last view dies (a
weakref callback on the numpy "carrier" array that all buffer views hang off); the writer
never waits on a borrowed block: it reuses a free block or creates one. A held result is
therefore never overwritten and never deadlocks later executions.

Forwarding: a large buffer being written that is itself a zero-copy view of a data block
(a value read from another ring and passed on unchanged) is written as a reference to that
block, not copied again; see ``forward`` for how its lifetime is kept.
"""

from __future__ import annotations

import enum
import os
import pickle
import struct
import time
import weakref
from typing import Any

import numpy as np

from .bell import BELL_SPIN_S
from .errors import (
    ChannelClosedError,
    ChannelSequenceError,
    ChannelTimeoutError,
    PeerDiedError,
    ShmSecurityError,
    UnsupportedPlatformError,
    decode_error,
    lost_value,
)
from .forward import FOREIGN, ForeignCache, pack_record, record_size, unpack_record
from .forward import find as find_ref
from .forward import register as register_ref
from .forward import unregister as unregister_ref
from .futex import HAVE_WAITV, fence, fence_halves, futex_wait, futex_wait2, futex_wake
from .parallel_copy import copy_into
from .pool import (
    BLOCK_MAGIC,
    DEFAULT_KEEP_FREE_BYTES,
    BlockCache,
    BlockPool,
    block_data_offset,
    release_block,
)
from .procs import identity, is_alive
from .serial import Serializer, loads
from .shm import Segment

__all__ = ["ShmRingWriter", "ShmRingReader", "ring_supported", "require_ring_support"]


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
_SLICE = 0.25  # longest single futex sleep: a safety net, and the peer-liveness period
_BORROWS: dict[int, weakref.ref] = {}  # keeps borrow callbacks alive past their reader
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


_SPIN_MAX = 500e-6  # longest adaptive spin before a futex sleep


class _Endpoint:
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
        how = ("poisoned (a peer failed)" if self._u[_H_CLOSED // 4] == Closed.POISONED
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
        return bool(self._u[_H_CLOSED // 4])

    def _release_views(self) -> None:
        for v in (self._q, self._u):
            v.release()


def _set_closed(seg: Segment, code: Closed) -> None:
    u = seg.mv.cast("I")
    try:
        if u[_H_CLOSED // 4] != Closed.POISONED:  # poisoned stays poisoned
            u[_H_CLOSED // 4] = code
        fence()
        nr = u[_H_NREADERS // 4]
        futex_wake(seg.addr + _H_WSEQ)
        for i in range(nr):
            futex_wake(seg.addr + _R_BASE + _R_STRIDE * i)
    finally:
        u.release()


class ShmRingWriter(_Endpoint):
    """The writing end; create it before readers attach. One thread uses it at a time."""

    # Set by ``create`` (instances are built by the classmethod, not ``__init__``).
    _zc_min: int
    _ser: Serializer
    _pool: BlockPool
    _rflags: list[int]
    _rseqs: list[int]
    _final_pos: int

    @classmethod
    def create(cls, name: str, slots: int = 4, slot_bytes: int = 1 << 20, num_readers: int = 1,
               spin_us: float = 0.0, zero_copy_min: int = 64 * 1024,
               max_data_bytes: int | None = None,
               keep_free_bytes: int = DEFAULT_KEEP_FREE_BYTES) -> ShmRingWriter:
        """Create segment ``name`` (unique and unguessable: ``endpoints`` builds it).

        Args:
            slots: values buffered before the writer blocks on the slowest reader.
            slot_bytes: inline payload bytes per slot; larger values use data blocks.
            num_readers: readers ``0..num_readers-1``; each must read every value.
            spin_us: busy-wait before sleeping (0 is best on small machines).
            zero_copy_min: out-of-band buffers this large are read zero-copy (via blocks);
                smaller ones are copied out of the slot.
            max_data_bytes: cap on data-block bytes (None: limited by /dev/shm only).
            keep_free_bytes: most bytes of free data blocks kept for reuse; blocks beyond
                it are freed as soon as the readers release them.

        Example:
            >>> w = ShmRingWriter.create("cgc-doc-ring", slots=2, slot_bytes=4096)
            >>> r = ShmRingReader.attach("cgc-doc-ring", 0)
            >>> w.write({"a": 1}); r.read()
            {'a': 1}
            >>> r.close(); w.close()

        Raises:
            ValueError: bad sizes. SegmentExistsError (a FileExistsError): the name is
            taken. UnsupportedPlatformError: not x86_64. ShmSecurityError: the segment
            directory is unsafe.
        """
        require_ring_support()
        if slots < 1 or num_readers < 1 or slot_bytes < 64:
            raise ValueError("need slots >= 1, num_readers >= 1, slot_bytes >= 64")
        _, _, size = _layout(slots, num_readers, slot_bytes)
        self = cls()
        self._seg = Segment.create(name, size)
        mv = self._seg.mv
        struct.pack_into("<Q", mv, _H_ZC, zero_copy_min)
        _HDR.pack_into(mv, 0, 0, _VERSION, slots, num_readers, slot_bytes)
        self._init_views(spin_us)
        self._u[0] = _MAGIC  # last: readers attach only to a fully initialised header
        self._zc_min = zero_copy_min
        self._ser = Serializer()
        self._pool = BlockPool(name, num_readers, max_bytes=max_data_bytes,
                               keep_free_bytes=keep_free_bytes)
        self._rflags = [(_R_BASE + _R_STRIDE * i + 8) // 4 for i in range(num_readers)]
        self._rseqs = [(_R_BASE + _R_STRIDE * i) // 8 for i in range(num_readers)]
        self._final_pos = 0
        return self

    @property
    def position(self) -> int:
        """Values published so far (the shared ``wseq``)."""
        seg = getattr(self, "_seg", None)
        return self._final_pos if seg is None else self._q[_H_WSEQ // 8]

    def _lay_out(self, raws: list[memoryview],
                 plen: int) -> tuple[list[int], list[Any], int, bool]:
        """(offsets, references, total bytes, needs a block) of a value's out-of-band
        buffers after its ``plen`` pickle bytes."""
        off = 16 * len(raws) + plen
        offs = []
        big = False
        # A large buffer that is a zero-copy view of another block travels as a reference
        # to it (see ``forward``); the value then needs a block of ours to track its readers.
        refs = [find_ref(r) if r.nbytes >= self._zc_min else None for r in raws]
        for r, ref in zip(raws, refs, strict=True):
            off = _a64(off)
            offs.append(off)
            if ref is not None:
                off += record_size(ref[0])
                big = True
                continue
            off += r.nbytes
            if r.nbytes >= self._zc_min:
                big = True
        return offs, refs, off, big

    def write(self, value: Any, timeout: float | None = None) -> None:
        """Publish ``value`` to every reader; blocks while the slowest is ``slots`` behind.

        An interrupt before the publishing store leaves nothing published (``position``
        unchanged): writing again is safe.

        Raises:
            ChannelTimeoutError: no room within ``timeout`` seconds (None: wait forever).
            ChannelClosedError: the channel was closed or poisoned.
            PeerDiedError: a reader the write waits for died.
            pickle.PicklingError, TypeError: the value cannot be serialized (nothing is
                written; the channel stays usable).
        """
        if self._seg is None:
            raise ChannelClosedError(f"channel {self.name} was closed here")
        u = self._u
        if u[_CLOSED_I]:
            self._raise_closed()
        data, raws = self._ser.dumps(value)
        n = len(raws)
        plen = len(data)
        if n:
            offs, refs, total, big = self._lay_out(raws, plen)
        else:  # the common small value: no out-of-band buffers to place
            total, big = plen, False
        q = self._q
        seq = q[_WSEQ_Q]
        low = seq - self.slots  # every reader must have consumed value `low`
        if low >= 0:
            for ri in self._rseqs:
                if q[ri] <= low:
                    self._wait(lambda ri=ri: q[ri] > low, ri * 8, _H_WWAIT // 4, timeout,
                               "write", self._rseqs.index(ri))
        base = self._first + (seq % self.slots) * self._stride
        blk = None
        kept_any = False
        if not big and total <= self.slot_bytes:
            layout, bid, mv, p = _INLINE, 0, self._mv, base + _SLOT_HDR_SIZE
        else:
            blk = self._pool.acquire(total, seq, timeout, self._check_readers)
            layout, bid, mv, p = _BLOCK, blk.id, blk.seg.mv, blk.data_off
        try:
            if n:
                table: list[int] = []
                kept = []
                for o, r, ref in zip(offs, raws, refs, strict=True):
                    if ref is None:
                        table += (o, r.nbytes)
                        copy_into(mv, p + o, r, r.nbytes)
                    else:
                        table += (o | FOREIGN, r.nbytes)
                        pack_record(mv, p + o, ref[0], ref[1])
                        kept.append(r)  # keeps our own upstream borrow alive
                struct.pack_into(f"<{2 * n}Q", mv, p, *table)
                if kept and blk is not None:
                    self._pool.hold(blk, kept)
                    kept_any = True
            mv[p + 16 * n:p + 16 * n + plen] = data
            _SLOT_HDR.pack_into(self._mv, base, layout, n, seq, plen, bid, total)
        except BaseException:
            if blk is not None:
                self._pool.unuse(blk)
            raise
        q[_WSEQ_Q] = seq + 1  # publish (x86: ordered after the payload stores)
        _fence_a()  # fence()
        _fence_r()
        for fi in self._rflags:
            if u[fi]:
                futex_wake(self._seg.addr + _H_WSEQ)
                break
        if kept_any:
            self._pool.let_go()  # the previous pass-through's holds, off the next write's path

    def _check_readers(self) -> None:
        for i in range(self.num_readers):
            self._check_peer(i)

    def _linger(self, linger: float) -> None:
        q, end = self._q, time.monotonic() + linger
        wseq = q[_H_WSEQ // 8]
        for i, ri in enumerate(self._rseqs):
            rem = end - time.monotonic()
            if q[ri] >= wseq or rem <= 0:
                continue
            try:
                self._wait(lambda ri=ri: q[ri] >= wseq, ri * 8, _H_WWAIT // 4, rem, "close", i)
            except (ChannelTimeoutError, ChannelClosedError):
                return

    @staticmethod
    def poison_by_name(name: str) -> bool:
        """Poison channel ``name`` from any process (e.g. a monitor that saw a peer die).

        Returns False when no such channel exists.

        Example:
            >>> ShmRingWriter.poison_by_name("cgc-no-such-channel")
            False

        Raises:
            ShmSecurityError: the name is not a segment of ours.
        """
        try:
            seg = Segment.attach(name)
        except FileNotFoundError:
            return False
        try:
            _set_closed(seg, Closed.POISONED)
        finally:
            seg.close()
        return True

    def data_blocks(self) -> int:
        """Data blocks currently allocated (in use or pooled) - for tests and stats."""
        return self._pool.live_blocks()

    def close(self, linger: float = 0.0) -> None:
        """Close: wake all waiters with ChannelClosedError, unlink ring and blocks. Idempotent.

        Args:
            linger: first wait up to this many seconds for every reader to consume what was
                written (stops early if any side closes or poisons the channel) - so values
                in data blocks are not unlinked under a reader that is about to read them.
        """
        if getattr(self, "_seg", None) is None:
            return
        if linger > 0:
            self._linger(linger)
        # Detach before waking anyone: a reader woken by the close may make this thread's
        # owner call write() at once, which must see a closed writer, not released views.
        self._final_pos = self._q[_H_WSEQ // 8]
        seg, self._seg = self._seg, None  # type: ignore[assignment]
        _set_closed(seg, Closed.CLOSED)
        self._pool.close()
        self._release_views()
        seg.close()


class ShmRingReader(_Endpoint):
    """Reader ``reader_index`` of a ring; one thread uses it at a time.

    ``position``: values consumed so far; ``last_nbytes``: payload bytes of the last value
    read (pickle + buffers, including buffers forwarded by reference from an upstream
    block), so a caller can bound what it buffers in bytes; ``last_forwarded_bytes``: the
    part of those that arrived as references (not copied through this ring).
    """

    # Set by ``attach`` (instances are built by the classmethod, not ``__init__``).
    index: int
    _cur: int
    _flag: int
    _blocks: BlockCache
    _foreign: ForeignCache | None
    _holds: dict[int, int]
    _me: weakref.ref[ShmRingReader]
    _slot_hold: tuple[int, int] | None
    _final_pos: int
    last_nbytes: int
    last_forwarded_bytes: int

    @classmethod
    def attach(cls, name: str, reader_index: int, spin_us: float = 0.0,
               timeout: float = 10.0) -> ShmRingReader:
        """Attach to ring ``name``, waiting up to ``timeout`` s for the writer to create it.

        Raises:
            ChannelTimeoutError: the segment did not appear in time.
            ShmSecurityError: something else is under that name (a symlink, another
                owner, a wrong mode, not a cgc ring): refused at once, never mapped.
            UnsupportedPlatformError: not x86_64.
            ValueError: ``reader_index`` out of range.
        """
        require_ring_support()
        deadline = time.monotonic() + timeout
        while True:
            try:
                seg = Segment.attach(name)
                if seg.size >= _R_BASE:
                    magic, version = struct.unpack_from("<II", seg.mv, 0)
                    if magic == _MAGIC and version == _VERSION:
                        break
                    if magic != 0:
                        seg.close()
                        raise ShmSecurityError(f"{name} is not a cgc ring (magic {magic:#x}, "
                                               f"version {version}): refused")
                seg.close()
            except FileNotFoundError:
                pass
            if time.monotonic() >= deadline:
                raise ChannelTimeoutError(f"channel {name} did not appear within {timeout} s")
            time.sleep(0.001)
        self = cls()
        self._seg = seg
        self._init_views(spin_us)
        if not 0 <= reader_index < self.num_readers:
            self._release_views()
            seg.close()
            raise ValueError(f"reader_index {reader_index} not in 0..{self.num_readers - 1}")
        self.index = reader_index
        self._cur = (_R_BASE + _R_STRIDE * reader_index) // 8
        self._flag = (_R_BASE + _R_STRIDE * reader_index + 8) // 4
        self._blocks = BlockCache(name, limit=2 * self.slots + 8)
        self._foreign = None  # blocks of other rings, by reference
        self._holds = {}  # block id -> live zero-copy carriers
        self._me = weakref.ref(self)  # what borrow callbacks hold (never the reader itself)
        self._slot_hold = None  # (seq, block id) read, not consumed
        self._final_pos = 0
        self.last_nbytes = 0
        self.last_forwarded_bytes = 0
        _R_ID.pack_into(seg.mv, _R_BASE + _R_STRIDE * reader_index + 12, *identity())
        return self

    @property
    def position(self) -> int:
        """Values consumed so far (the shared cursor: the one source of truth)."""
        seg = getattr(self, "_seg", None)
        return self._final_pos if seg is None else self._q[self._cur]

    def read_at(self, position: int, timeout: float | None = None) -> Any:
        """The value at ``position`` (0 = the first value ever written to this reader).

        Returns the value, a ``decode_error`` value for it, or - when a read interrupted after it
        consumed ``position`` lost that value - a ``lost_value`` for it.

        Raises:
            ChannelSequenceError: ``position`` is ahead of the next unread value.
            The errors of ``read``.
        """
        if self._seg is not None and position == self._q[self._cur]:
            return self.read(timeout)  # the common case, without the property's lookups
        pos = self.position
        if position == pos:
            return self.read(timeout)
        if position < pos:
            return lost_value(self.name, position)
        raise ChannelSequenceError(f"channel {self.name}: value {position} asked for, but the "
                                   f"next unread one is {pos}")

    def read(self, timeout: float | None = None) -> Any:
        """Take the next value (blocks until one is written).

        Returns the value, or a ``decode_error`` value (an ``ErrorValue``) when it could not be
        decoded here; either way exactly one value is consumed.

        Raises:
            ChannelTimeoutError: nothing arrived within ``timeout`` s (None: wait forever).
            ChannelClosedError: closed or poisoned and no value is left to read.
            PeerDiedError: the writer died while this read waited.
            ChannelSequenceError: the slot does not hold the value expected (poisoned).
        """
        if self._seg is None:
            raise ChannelClosedError(f"channel {self.name} was closed here")
        q = self._q
        seq = q[self._cur]
        sh = self._slot_hold
        if sh is not None and sh[0] != seq:  # an interrupt came between consume and unhold
            self._unhold_slot(sh)
        if q[_WSEQ_Q] <= seq:
            self._wait(lambda: q[_WSEQ_Q] > seq, _H_WSEQ, self._flag, timeout, "read", -1)
        base = self._first + (seq % self.slots) * self._stride
        layout, n, hseq, plen, bid, total = _SLOT_HDR.unpack_from(self._mv, base)
        if hseq != seq:
            self._corrupt(seq, hseq)
        self.last_nbytes = total
        self.last_forwarded_bytes = 0
        if layout == _INLINE:
            mv = self._mv
            p = base + _SLOT_HDR_SIZE
            try:
                if n:
                    t = struct.unpack_from(f"<{2 * n}Q", mv, p)
                    bufs = [bytearray(mv[p + t[2 * k]:p + t[2 * k] + t[2 * k + 1]])
                            for k in range(n)]
                    value = loads(mv[p + 16 * n:p + 16 * n + plen], bufs)
                else:  # no buffers: what serial.loads does then, a call less per read
                    value = pickle.loads(mv[p:p + plen])
            except Exception as e:  # noqa: BLE001 - any decode failure becomes this value's error
                value = decode_error(self.name, seq, e)
            self._advance(seq)
            return value
        if sh is None or sh[0] != seq:
            self._slot_hold = (seq, bid)
        try:
            seg, u = self._blocks.get(bid)
        except FileNotFoundError:
            raise ChannelClosedError(f"channel {self.name}: writer is gone") from None
        got = u[_U_BSEQ] | u[_U_BSEQ + 1] << 32
        if got != seq:
            self._corrupt(seq, got)
        value = self._load_block(seq, seg, u, bid, n, plen, total)
        self._advance(seq)
        with self._blocks.lock:
            self._slot_hold = None
            if self._holds.get(bid, 0):
                return value  # live zero-copy views: the last one to die releases the block
        _release(seg, u, self.index, self.num_readers)
        return value

    def _load_block(self, seq: int, seg: Segment, u: memoryview, bid: int, n: int, plen: int,
                    total: int) -> Any:
        p = block_data_offset(self.num_readers)
        mv = seg.mv
        try:
            if not n:
                return loads(mv[p:p + plen], [])
            t = struct.unpack_from(f"<{2 * n}Q", mv, p)
            cmv = None
            bufs = []
            for k in range(n):
                o, nb = t[2 * k], t[2 * k + 1]
                if not o & FOREIGN:
                    if cmv is None:
                        # Why made here, not up front: a value made only of references
                        # (a pass-through) views no bytes of this block; the foreign
                        # views' borrows hold the block instead.
                        carrier = np.frombuffer(seg.mm, dtype=np.uint8, count=total,
                                                offset=seg.HEADER + p)
                        self._borrow(carrier, seg, u, bid, (seg.name, seg.HEADER + p),
                                     seg.addr + p)
                        cmv = carrier.data  # a memoryview that keeps the carrier alive
                    bufs.append(cmv[o:o + nb])
                    continue
                # Forwarded by reference: view the upstream block; our busy word in *this*
                # block keeps the forwarder's hold on it until the view dies.
                name, foff = unpack_record(mv, p + (o & ~FOREIGN))
                if self._foreign is None:
                    self._foreign = ForeignCache()
                fc, faddr = self._foreign.view(name, foff, nb, BLOCK_MAGIC)
                self._borrow(fc, seg, u, bid, (name, foff), faddr)
                bufs.append(fc.data)
                # The value holds these bytes too (upstream): count them, so a caller
                # bounding what it buffers in bytes sees the real size.
                self.last_nbytes += nb
                self.last_forwarded_bytes += nb
            return loads(mv[p + 16 * n:p + 16 * n + plen], bufs)
        except Exception as e:  # noqa: BLE001 - any decode failure becomes this value's error
            return decode_error(self.name, seq, e)

    def _borrow(self, carrier: np.ndarray, seg: Segment, u: memoryview, bid: int,
                where: tuple[str, int], address: int) -> None:
        """Count ``carrier`` as a live view of block ``bid`` until it dies (``u`` stays
        valid while referenced: the cache never releases it, see ``BlockCache``).

        ``where`` (segment name, file offset of the carrier's first byte) registers the
        carrier for forwarding, so writing it on unchanged sends a reference; ``address``
        is that first byte's address in this process.
        """
        blocks = self._blocks
        me = self._me
        with blocks.lock:
            self._holds[bid] = self._holds.get(bid, 0) + 1
        token = register_ref(carrier, *where, address)

        def _released(ref: weakref.ref) -> None:
            _BORROWS.pop(id(ref), None)
            unregister_ref(token)
            rd = me()
            if rd is None:
                return
            with blocks.lock:
                left = rd._holds.get(bid, 1) - 1
                if left:
                    rd._holds[bid] = left
                    return
                rd._holds.pop(bid, None)
                if rd._slot_hold is not None and rd._slot_hold[1] == bid:
                    return  # its slot is not consumed yet: _unhold_slot releases it
                _release(seg, u, rd.index, rd.num_readers)

        ref = weakref.ref(carrier, _released)
        _BORROWS[id(ref)] = ref

    def _unhold_slot(self, sh: tuple[int, int]) -> None:
        bid = sh[1]
        with self._blocks.lock:
            self._slot_hold = None
            if self._holds.get(bid, 0):
                return  # live zero-copy views: the last one to die releases the block
        try:
            seg, u = self._blocks.get(bid)
        except FileNotFoundError:
            return
        _release(seg, u, self.index, self.num_readers)

    def _advance(self, seq: int) -> None:
        self._q[self._cur] = seq + 1
        _fence_a()  # fence()
        _fence_r()
        if self._u[_H_WWAIT // 4]:
            futex_wake(self._seg.addr + self._cur * 8)

    def close(self) -> None:
        """Close the channel for everyone (wakes the writer) and unmap. Idempotent."""
        if getattr(self, "_seg", None) is None:
            return
        _set_closed(self._seg, Closed.CLOSED)
        self.detach()

    def detach(self) -> None:
        """Unmap without closing the channel for the others."""
        if getattr(self, "_seg", None) is None:
            return
        self._final_pos = self._q[self._cur]
        with self._blocks.lock:
            self._blocks.close()
            if self._foreign is not None:
                self._foreign.close()
        self._release_views()
        self._seg.close()
        self._seg = None  # type: ignore[assignment]


def _release(seg: Segment, u: memoryview, index: int, num_readers: int) -> None:
    try:
        release_block(seg, u, index, num_readers)
    except ValueError:
        pass  # the reader detached meanwhile: its mapping (and busy word) no longer matter
