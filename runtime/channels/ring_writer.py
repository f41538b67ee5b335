"""The writing end of a shared-memory ring (format and protocol: ``ring_layout``).

Payload: pickle protocol 5. Small values (and small out-of-band buffers, copied out by the
reader) live inline in the slot, so the slot is free again as soon as ``read`` returns.
Values with an out-of-band buffer >= ``zero_copy_min`` bytes, or too large for a slot, go
to a pooled data block (see ``pool``); the slot only names the block.

Forwarding: a large buffer being written that is itself a zero-copy view of a data block
(a value read from another ring and passed on unchanged) is written as a reference to that
block, not copied again; see ``forward`` for how its lifetime is kept.
"""

from __future__ import annotations

import struct
import time
from typing import Any

from cgc.runtime.channels.errors import ChannelClosedError, ChannelTimeoutError
from cgc.runtime.channels.forward import FOREIGN, pack_record, record_size
from cgc.runtime.channels.forward import find as find_ref
from cgc.runtime.channels.futex import futex_wake
from cgc.runtime.channels.parallel_copy import copy_into
from cgc.runtime.channels.pool import DEFAULT_KEEP_FREE_BYTES, BlockPool
from cgc.runtime.channels.ring_endpoint import RingEndpoint
from cgc.runtime.channels.ring_layout import (
    _BLOCK,
    _CLOSED_I,
    _H_WSEQ,
    _H_WWAIT,
    _H_ZC,
    _HDR,
    _INLINE,
    _MAGIC,
    _R_BASE,
    _R_STRIDE,
    _SLOT_HDR,
    _SLOT_HDR_SIZE,
    _VERSION,
    _WSEQ_Q,
    Closed,
    _a64,
    _fence_a,
    _fence_r,
    _set_closed,
    require_ring_support,
    ring_segment_size,
)
from cgc.runtime.channels.serial import Serializer
from cgc.runtime.channels.shm import Segment

__all__ = ["ShmRingWriter"]


class ShmRingWriter(RingEndpoint):
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
            >>> from cgc.runtime.channels import ShmRingReader
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
        self = cls()
        self._seg = Segment.create(name, ring_segment_size(slots, num_readers, slot_bytes))
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
        return self._final_pos if seg is None else self._q[_WSEQ_Q]

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
        offs: list[int] = []
        refs: list[Any] = []
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

    def wait_taken(self, timeout: float | None = None) -> None:
        """Block until every reader consumed every value written so far (the reader's
        cursor store after its decode is the acknowledgement: no message travels back).

        Example: ``w.write(v); w.wait_taken(5.0)`` - a rendezvous write.

        Raises:
            ChannelTimeoutError: a reader is still behind after ``timeout`` s (None: wait
                forever).
            ChannelClosedError: the channel was closed here, or closed / poisoned by any
                side while a value was still unread (one read before the close counts).
            PeerDiedError: a reader this waits for died.
        """
        if self._seg is None:
            raise ChannelClosedError(f"channel {self.name} was closed here")
        q = self._q
        seq = q[_WSEQ_Q]
        for i, ri in enumerate(self._rseqs):
            if q[ri] < seq:
                self._wait(lambda ri=ri: q[ri] >= seq, ri * 8, _H_WWAIT // 4, timeout,
                           "wait for the reader to take the value", i)

    def _check_readers(self) -> None:
        for i in range(self.num_readers):
            self._check_peer(i)

    def _linger(self, linger: float) -> None:
        q, end = self._q, time.monotonic() + linger
        wseq = q[_WSEQ_Q]
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
        self._final_pos = self._q[_WSEQ_Q]
        seg, self._seg = self._seg, None  # type: ignore[assignment]
        _set_closed(seg, Closed.CLOSED)
        self._pool.close()
        self._release_views()
        seg.close()
