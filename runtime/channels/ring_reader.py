"""The reading end of a shared-memory ring (format and protocol: ``ring_layout``).

Positions and failures (no desync, ever): ``reader.position`` is the shared cursor itself,
the one place that says how many values this reader consumed. A value whose decoding
raises is delivered as a ``decode_error`` value for its position (exactly one slot consumed). An
interrupt (KeyboardInterrupt, any BaseException) before the cursor store leaves the value
unread - the next ``read`` returns it; one after the store (the value is consumed but was
never returned) shows as ``position`` having moved: ``read_at(p)`` for that ``p`` then
returns a ``lost_value`` error value instead of the next value. So a caller that asks for
value ``p`` with ``read_at(p)`` gets value ``p`` or an error value for ``p``, never another.

Borrowing: a zero-copy result views its block, never a ring slot, so holding it can never
block the ring. The reader clears its busy word of the block when the last view dies (a
weakref callback on the numpy "carrier" array that all buffer views hang off); the writer
never waits on a borrowed block: it reuses a free block or creates one. A held result is
therefore never overwritten and never deadlocks later executions.
"""

from __future__ import annotations

import pickle
import struct
import time
import weakref
from typing import Any

import numpy as np

from cgc.runtime.channels.errors import (
    ChannelClosedError,
    ChannelSequenceError,
    ChannelTimeoutError,
    ShmSecurityError,
    decode_error,
    lost_value,
)
from cgc.runtime.channels.forward import FOREIGN, ForeignCache, unpack_record
from cgc.runtime.channels.forward import register as register_ref
from cgc.runtime.channels.forward import unregister as unregister_ref
from cgc.runtime.channels.futex import futex_wake
from cgc.runtime.channels.pool import BLOCK_MAGIC, BlockCache, block_data_offset, release_block
from cgc.runtime.channels.procs import identity
from cgc.runtime.channels.ring_endpoint import RingEndpoint
from cgc.runtime.channels.ring_layout import (
    _H_WSEQ,
    _H_WWAIT,
    _INLINE,
    _MAGIC,
    _R_BASE,
    _R_ID,
    _R_STRIDE,
    _SLOT_HDR,
    _SLOT_HDR_SIZE,
    _U_BSEQ,
    _VERSION,
    _WSEQ_Q,
    Closed,
    _fence_a,
    _fence_r,
    _set_closed,
    require_ring_support,
)
from cgc.runtime.channels.serial import loads
from cgc.runtime.channels.shm import Segment

__all__ = ["ShmRingReader"]

_BORROWS: dict[int, weakref.ref] = {}  # keeps borrow callbacks alive past their reader


class ShmRingReader(RingEndpoint):
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
