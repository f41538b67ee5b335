"""Shared-memory ring channel: one writer, N readers on one node, one write serves all.

Segment layout (``/dev/shm/<name>``, created by the writer)::

    header   magic, version, slots, num_readers, slot_bytes, closed, writer_waiting
    wseq     u64 values published (own cache line; readers futex-wait on its low half)
    reader i u64 rseq_i (values reader i consumed), u32 waiting_i   (one cache line each)
    slot k   32-byte slot header + ``slot_bytes`` payload, k = seq % slots

Flow: the writer may fill slot ``seq % slots`` when every ``rseq_i > seq - slots``; it
publishes by storing ``wseq = seq + 1``. Each word has exactly one writer process, so
plain aligned stores suffice (x86 TSO orders store→store and load→load).

Waiting: an optional bounded spin (``spin_us``, default 0: on 2 cores a spinner steals the
CPU its peer needs), then a real kernel sleep: the waiter sets its own *waiting* flag,
fences, re-reads the watched word and calls FUTEX_WAIT on it; the other side, after its
store and a fence, issues FUTEX_WAKE only if a flag is set. No syscall on the fast path, no
lost wake-up (Dekker pattern with full fences); sleeps are sliced (0.25 s) as a safety net,
which keeps an idle reader at ~0% CPU. ``close``/``poison`` set ``closed`` and wake every
futex word, so each blocked party raises ChannelClosedError.

Payload: pickle protocol 5. Small values (and small out-of-band buffers, copied out by the
reader) live inline in the slot, so the slot is free again as soon as ``read`` returns.
Values with an out-of-band buffer >= ``zero_copy_min`` bytes, or too large for a slot, go
to a pooled data block (see ``pool``); the slot only names the block.

Borrowing: a zero-copy result views its block, never a ring slot, so holding it can never
block the ring. The reader clears its busy word of the block when the last view dies (a
weakref callback on the numpy "carrier" array that all buffer views hang off); the writer
never waits on a borrowed block: it reuses a free block or creates one. A held result is
therefore never overwritten and never deadlocks later executions.
"""

from __future__ import annotations

import os
import struct
import time
import weakref
from typing import Any

import numpy as np

from .errors import ChannelClosedError, ChannelTimeoutError
from .futex import fence, futex_wait, futex_wake
from .pcopy import copy_into
from .pool import BlockCache, BlockPool, block_data_offset
from .serial import Serializer, loads
from .shm import Segment

__all__ = ["ShmRingWriter", "ShmRingReader"]

_MAGIC = 0x52474743  # "CGGR"
_VERSION = 1
_HDR = struct.Struct("<IIIIQ")  # magic, version, slots, num_readers, slot_bytes
_H_CLOSED = 24  # u32: 0 open, 1 closed, 2 poisoned
_H_WWAIT = 28  # u32: the writer sleeps on a reader cursor
_H_WPID = 32
_H_ZC = 40  # u64 zero_copy_min (informational)
_H_WSEQ = 64
_R_BASE = 128
_R_STRIDE = 64
_SLOT_HDR = struct.Struct("<IIQQQ")  # layout, nbufs, pickle_len, block_id, payload_len
_SLOT_HDR_SIZE = 32
_INLINE, _BLOCK = 1, 2
_SLICE = 0.25  # longest single futex sleep (safety net against any missed wake-up)
_BORROWS: dict[int, weakref.ref] = {}  # keeps borrow callbacks alive past their reader


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

    def _wait(self, ready: Any, watch_off: int, flag_idx: int, timeout: float | None,
              what: str) -> None:
        u = self._u
        if self._spin > 0:
            start = time.perf_counter()
            end = start + self._spin_budget
            while True:
                now = time.perf_counter()
                if ready():
                    self._learn(now - start)
                    return
                if now >= end or u[_H_CLOSED // 4]:
                    break  # the sleep loop below raises for a closed channel
                os.sched_yield()  # on an oversubscribed core, let the peer run instead
            self._sleep(ready, watch_off, flag_idx, timeout, what)
            self._learn(time.perf_counter() - start)
            return
        self._sleep(ready, watch_off, flag_idx, timeout, what)

    def _learn(self, waited: float) -> None:
        # Adaptive spin: waking a sleeping process costs ~50 us on these VMs, so a wait
        # that usually ends within a few hundred microseconds (a 1 MiB copy upstream) is
        # cheaper to spin through. Waits longer than _SPIN_MAX count as zero: for them
        # (an idle graph, slow methods) sleeping costs nothing noticeable, and the budget
        # decays back to the configured spin.
        sample = waited if waited <= _SPIN_MAX else 0.0
        self._wait_est = 0.8 * self._wait_est + 0.2 * sample
        self._spin_budget = min(_SPIN_MAX, max(self._spin, 2.0 * self._wait_est))

    def _sleep(self, ready: Any, watch_off: int, flag_idx: int, timeout: float | None,
               what: str) -> None:
        u = self._u
        deadline = None if timeout is None else time.monotonic() + timeout
        addr = self._seg.addr + watch_off
        widx = watch_off // 4
        while True:
            u[flag_idx] = 1
            fence()
            expected = u[widx]  # read before ready(): a change in between makes WAIT return
            if ready():
                u[flag_idx] = 0
                return
            if u[_H_CLOSED // 4]:
                u[flag_idx] = 0
                self._raise_closed()
            rem = _SLICE
            if deadline is not None:
                rem = min(deadline - time.monotonic(), _SLICE)
                if rem <= 0:
                    u[flag_idx] = 0
                    raise ChannelTimeoutError(f"channel {self.name}: {what} timed out "
                                              f"after {timeout} s")
            futex_wait(addr, expected, rem)
            u[flag_idx] = 0

    def _raise_closed(self) -> None:
        how = "poisoned (a peer failed)" if self._u[_H_CLOSED // 4] == 2 else "closed"
        raise ChannelClosedError(f"channel {self.name} was {how}")

    def poison(self) -> None:
        """Mark the channel failed and wake every waiter (they raise ChannelClosedError)."""
        _set_closed(self._seg, 2)

    @property
    def closed(self) -> bool:
        """True once any side closed or poisoned the channel."""
        return bool(self._u[_H_CLOSED // 4])

    def _release_views(self) -> None:
        for v in (self._q, self._u):
            v.release()


def _set_closed(seg: Segment, code: int) -> None:
    u = seg.mv.cast("I")
    try:
        if u[_H_CLOSED // 4] != 2:
            u[_H_CLOSED // 4] = code
        fence()
        nr = u[12 // 4]
        futex_wake(seg.addr + _H_WSEQ)
        for i in range(nr):
            futex_wake(seg.addr + _R_BASE + _R_STRIDE * i)
    finally:
        u.release()


class ShmRingWriter(_Endpoint):
    """The writing end; create it before readers attach. One thread uses it at a time."""

    @classmethod
    def create(cls, name: str, slots: int = 4, slot_bytes: int = 1 << 20, num_readers: int = 1,
               spin_us: float = 0.0, zero_copy_min: int = 64 * 1024,
               max_data_bytes: int | None = None) -> ShmRingWriter:
        """Create the segment ``/dev/shm/<name>`` (``name`` unique, e.g. graph prefix + id).

        Args:
            slots: values buffered before the writer blocks on the slowest reader.
            slot_bytes: inline payload bytes per slot; larger values use data blocks.
            num_readers: readers ``0..num_readers-1``; each must read every value.
            spin_us: busy-wait before sleeping (0 is best on small machines).
            zero_copy_min: out-of-band buffers this large are read zero-copy (via blocks);
                smaller ones are copied out of the slot.
            max_data_bytes: cap on data-block bytes (None: limited by /dev/shm only).

        Example:
            >>> w = ShmRingWriter.create("cgc-doc-ring", slots=2, slot_bytes=4096)
            >>> r = ShmRingReader.attach("cgc-doc-ring", 0)
            >>> w.write({"a": 1}); r.read()
            {'a': 1}
            >>> r.close(); w.close()

        Raises:
            ValueError: bad sizes. FileExistsError: the name is taken.
        """
        if slots < 1 or num_readers < 1 or slot_bytes < 64:
            raise ValueError("need slots >= 1, num_readers >= 1, slot_bytes >= 64")
        _, _, size = _layout(slots, num_readers, slot_bytes)
        self = cls()
        self._seg = Segment.create(name, size)
        mv = self._seg.mv
        struct.pack_into("<II", mv, _H_WPID, os.getpid(), 0)
        struct.pack_into("<Q", mv, _H_ZC, zero_copy_min)
        _HDR.pack_into(mv, 0, 0, _VERSION, slots, num_readers, slot_bytes)
        self._init_views(spin_us)
        self._u[0] = _MAGIC  # last: readers attach only to a fully initialised header
        self._seq = 0
        self._zc_min = zero_copy_min
        self._ser = Serializer()
        self._pool = BlockPool(name, num_readers, keep_free=2, max_bytes=max_data_bytes)
        self._rflags = [(_R_BASE + _R_STRIDE * i + 8) // 4 for i in range(num_readers)]
        self._rseqs = [(_R_BASE + _R_STRIDE * i) // 8 for i in range(num_readers)]
        return self

    def write(self, value: Any, timeout: float | None = None) -> None:
        """Publish ``value`` to every reader; blocks while the slowest is ``slots`` behind.

        Raises:
            ChannelTimeoutError: no room within ``timeout`` seconds (None: wait forever).
            ChannelClosedError: the channel was closed or poisoned.
            pickle.PicklingError, TypeError: the value cannot be serialized (nothing is
                written; the channel stays usable).
        """
        if self._seg is None:
            raise ChannelClosedError(f"channel {self.name} was closed here")
        u = self._u
        if u[_H_CLOSED // 4]:
            self._raise_closed()
        data, raws = self._ser.dumps(value)
        n = len(raws)
        plen = len(data)
        off = 16 * n + plen
        offs = []
        big = False
        for r in raws:
            off = _a64(off)
            offs.append(off)
            off += r.nbytes
            if r.nbytes >= self._zc_min:
                big = True
        total = off
        seq = self._seq
        q = self._q
        low = seq - self.slots  # every reader must have consumed value `low`
        if low >= 0:
            for ri in self._rseqs:
                if q[ri] <= low:
                    self._wait(lambda ri=ri: q[ri] > low, ri * 8, _H_WWAIT // 4, timeout,
                               "write")
        base = self._first + (seq % self.slots) * self._stride
        if not big and total <= self.slot_bytes:
            layout, bid, mv, p = _INLINE, 0, self._mv, base + _SLOT_HDR_SIZE
        else:
            blk = self._pool.acquire(total, timeout)
            layout, bid, mv, p = _BLOCK, blk.id, blk.seg.mv, blk.data_off
        if n:
            table = []
            for o, r in zip(offs, raws, strict=True):
                table += (o, r.nbytes)
                copy_into(mv, p + o, r, r.nbytes)
            struct.pack_into(f"<{2 * n}Q", mv, p, *table)
        mv[p + 16 * n:p + 16 * n + plen] = data
        _SLOT_HDR.pack_into(self._mv, base, layout, n, plen, bid, total)
        q[_H_WSEQ // 8] = seq + 1  # publish (x86: ordered after the payload stores)
        self._seq = seq + 1
        fence()
        for fi in self._rflags:
            if u[fi]:
                futex_wake(self._seg.addr + _H_WSEQ)
                break

    def _linger(self, linger: float) -> None:
        q, end = self._q, time.monotonic() + linger
        for ri in self._rseqs:
            rem = end - time.monotonic()
            if q[ri] >= self._seq or rem <= 0:
                continue
            try:
                self._wait(lambda ri=ri: q[ri] >= self._seq, ri * 8, _H_WWAIT // 4, rem, "close")
            except (ChannelTimeoutError, ChannelClosedError):
                return

    @staticmethod
    def poison_by_name(name: str) -> bool:
        """Poison channel ``name`` from any process (e.g. a monitor that saw a peer die).

        Returns False when no such channel exists.

        Example:
            >>> ShmRingWriter.poison_by_name("cgc-no-such-channel")
            False
        """
        try:
            seg = Segment.attach(name)
        except FileNotFoundError:
            return False
        try:
            _set_closed(seg, 2)
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
        seg, self._seg = self._seg, None  # type: ignore[assignment]
        _set_closed(seg, 1)
        self._pool.close()
        self._release_views()
        seg.close()


class ShmRingReader(_Endpoint):
    """Reader ``reader_index`` of a ring; one thread uses it at a time."""

    @classmethod
    def attach(cls, name: str, reader_index: int, spin_us: float = 0.0,
               timeout: float = 10.0) -> ShmRingReader:
        """Attach to ring ``name``, waiting up to ``timeout`` s for the writer to create it.

        Raises:
            ChannelTimeoutError: the segment did not appear in time.
            ValueError: ``reader_index`` out of range.
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                seg = Segment.attach(name)
                if seg.size >= 64 and struct.unpack_from("<I", seg.mv, 0)[0] == _MAGIC:
                    break
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
        self._seq = self._q[self._cur]
        self._blocks = BlockCache(name, limit=2 * self.slots + 8)
        struct.pack_into("<I", seg.mv, _R_BASE + _R_STRIDE * reader_index + 12, os.getpid())
        return self

    def read(self, timeout: float | None = None) -> Any:
        """Take the next value (blocks until one is written).

        Raises:
            ChannelTimeoutError: nothing arrived within ``timeout`` s (None: wait forever).
            ChannelClosedError: closed or poisoned and no value is left to read.
        """
        if self._seg is None:
            raise ChannelClosedError(f"channel {self.name} was closed here")
        seq = self._seq
        q = self._q
        if q[_H_WSEQ // 8] <= seq:
            self._wait(lambda: q[_H_WSEQ // 8] > seq, _H_WSEQ, self._flag, timeout, "read")
        base = self._first + (seq % self.slots) * self._stride
        layout, n, plen, bid, total = _SLOT_HDR.unpack_from(self._mv, base)
        if layout == _INLINE:
            mv = self._mv
            p = base + _SLOT_HDR_SIZE
            try:
                bufs = []
                if n:
                    t = struct.unpack_from(f"<{2 * n}Q", mv, p)
                    bufs = [bytearray(mv[p + t[2 * k]:p + t[2 * k] + t[2 * k + 1]])
                            for k in range(n)]
                return loads(mv[p + 16 * n:p + 16 * n + plen], bufs)
            finally:
                self._advance(seq)
        self._advance(seq)  # the slot only named the block: free it for the writer now
        try:
            seg = self._blocks.get(bid)
        except FileNotFoundError:
            raise ChannelClosedError(f"channel {self.name}: writer is gone") from None
        busy = seg.mv[64 + 4 * self.index:68 + 4 * self.index]
        try:
            return self._load_block(seg, n, plen, total, busy)
        except BaseException:
            busy[:] = b"\0\0\0\0"
            raise

    def _load_block(self, seg: Segment, n: int, plen: int, total: int, busy: memoryview) -> Any:
        p = block_data_offset(self.num_readers)
        mv = seg.mv
        if not n:
            v = loads(mv[p:p + plen], [])
            busy[:] = b"\0\0\0\0"
            return v
        t = struct.unpack_from(f"<{2 * n}Q", mv, p)
        carrier = np.frombuffer(seg.mm, dtype=np.uint8, count=total, offset=p)
        cmv = memoryview(carrier)
        bufs = [cmv[t[2 * k]:t[2 * k] + t[2 * k + 1]] for k in range(n)]

        def _released(ref: weakref.ref, busy: memoryview = busy) -> None:
            _BORROWS.pop(id(ref), None)
            try:
                busy[:] = b"\0\0\0\0"  # the block is free again as far as we are concerned
            except ValueError:
                pass

        ref = weakref.ref(carrier, _released)
        _BORROWS[id(ref)] = ref
        return loads(mv[p + 16 * n:p + 16 * n + plen], bufs)

    def _advance(self, seq: int) -> None:
        self._q[self._cur] = seq + 1
        self._seq = seq + 1
        fence()
        if self._u[_H_WWAIT // 4]:
            futex_wake(self._seg.addr + self._cur * 8)

    def close(self) -> None:
        """Close the channel for everyone (wakes the writer) and unmap. Idempotent."""
        if getattr(self, "_seg", None) is None:
            return
        _set_closed(self._seg, 1)
        self.detach()

    def detach(self) -> None:
        """Unmap without closing the channel for the others."""
        if getattr(self, "_seg", None) is None:
            return
        self._blocks.close()
        self._release_views()
        self._seg.close()
        self._seg = None  # type: ignore[assignment]
