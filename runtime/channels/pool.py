"""Pooled data blocks for values that do not fit a ring slot or are read zero-copy.

A block is its own segment ``<ring name>.d<id>`` (ids are never reused, so a reader's
cached mapping can never point at a different block). Its header holds the sequence number
of the value in it (the reader checks it), a *single-use* flag, and one *busy* word per
reader: the writer sets all of them when it puts a value in the block; reader ``i`` clears
word ``i`` when it no longer needs the memory (right after unpickling, or, for zero-copy
results, when the last view of the block dies). Each word has a single writer at a time,
so no atomic read-modify-write is needed across processes.

Memory held is bounded: the writer keeps at most ``keep_free`` reusable blocks of at most
``keep_free_bytes`` in all. A block beyond that (needed only because readers still hold
others) is *single-use*: the writer never reuses it, and the last reader to release it
gives its pages back to the system at once (``Segment.punch``, MADV_REMOVE) - so results a
user drops free their memory when dropped, not at the writer's next write. A block the
writer retires is punched too when nobody uses it, so stale reader mappings hold nothing.

The writer never waits for a borrowed block: it takes another free block or creates one.

Example:
    >>> from cgc.runtime.channels.pool import BlockPool
    >>> p = BlockPool("cgc-doc-pool", num_readers=1)
    >>> b = p.acquire(1000, seq=0); b.cap >= 1000
    True
    >>> p.close()
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable

from cgc.runtime.channels.errors import ChannelTimeoutError, ShmSecurityError
from cgc.runtime.channels.futex import fence
from cgc.runtime.channels.shm import Segment

__all__ = ["BlockPool", "BlockCache", "BLOCK_MAGIC", "block_data_offset", "release_block",
           "DEFAULT_KEEP_FREE", "DEFAULT_KEEP_FREE_BYTES"]

BLOCK_MAGIC = 0x4B424743  # "CGBK": the first word of every data block
_MIN_BLOCK = 64 * 1024
_B_SEQ = 16  # u64: sequence number of the value in the block
_B_SINGLE = 24 // 4  # u32 index: single-use (punch when the last reader releases it)
_B_BUSY = 64 // 4  # u32 index of reader 0's busy word
DEFAULT_KEEP_FREE = 4  # why 4: a pass-through chain of k stages rotates k + 1 blocks
DEFAULT_KEEP_FREE_BYTES = 64 << 20
_CHECK_EVERY = 0.25  # s between peer-liveness checks while waiting for a block


def block_data_offset(num_readers: int) -> int:
    """Byte offset of the data area in a block (header + busy words, 64-aligned)."""
    return (64 + 4 * num_readers + 63) & ~63


def release_block(seg: Segment, u: memoryview, index: int, num_readers: int) -> None:
    """Reader ``index`` is done with block ``seg`` (``u``: its u32 view); a single-use
    block whose last reader this is gives its memory back now."""
    u[_B_BUSY + index] = 0
    if u[_B_SINGLE]:
        fence()  # our clear before the others' words are read (two readers racing: >= 1 sees all clear)
        if not any(u[_B_BUSY + k] for k in range(num_readers)):
            seg.punch(block_data_offset(num_readers))


# Holds of closed pools whose blocks readers still used: (busy view, all-clear bytes,
# segment, held objects). Why kept past close: dropping them would release our borrow of
# an upstream block that a reader down a pass-through chain still views (a single-use
# block is punched on its last release). Swept when this process next acquires a block.
_orphans: list[tuple[memoryview, bytes, Segment, list]] = []


def _sweep_orphans() -> None:
    keep = []
    for busy, zeros, seg, objs in _orphans:
        if busy == zeros:
            busy.release()
            seg.close()
        else:
            keep.append((busy, zeros, seg, objs))
    _orphans[:] = keep


def _size_class(n: int) -> int:
    # Round up to 1/8 of the next power of two: <= 12.5% waste, few distinct sizes to reuse.
    n = max(n, _MIN_BLOCK)
    granule = max(_MIN_BLOCK, 1 << max(n.bit_length() - 4, 0))
    return (n + granule - 1) // granule * granule


class _Block:
    __slots__ = ("id", "seg", "cap", "busy", "u", "data_off", "single")

    def __init__(self, bid: int, seg: Segment, cap: int, num_readers: int) -> None:
        self.id = bid
        self.seg = seg
        self.cap = cap
        self.data_off = block_data_offset(num_readers)
        self.busy = seg.mv[64:64 + 4 * num_readers]
        self.u = seg.mv[:64].cast("I")
        self.single = False


class BlockPool:
    """Writer side: owns (creates, reuses, punches, unlinks) the data blocks of one ring."""

    def __init__(self, prefix: str, num_readers: int, keep_free: int = DEFAULT_KEEP_FREE,
                 max_bytes: int | None = None,
                 keep_free_bytes: int = DEFAULT_KEEP_FREE_BYTES) -> None:
        self.prefix = prefix
        self.num_readers = num_readers
        self.keep_free = keep_free
        self.keep_free_bytes = keep_free_bytes
        self.max_bytes = max_bytes
        self._blocks: dict[int, _Block] = {}
        # block id -> objects kept alive while the block is busy (forwarded buffers)
        self._held: dict[int, list] = {}
        self._next_id = 1
        self._ones = b"\x01\x00\x00\x00" * num_readers
        self._zeros = bytes(4 * num_readers)
        self.total_bytes = 0

    def _scan(self) -> list[_Block]:
        """Free reusable blocks; free single-use ones are retired on the way."""
        z = self._zeros
        free = []
        for b in list(self._blocks.values()):
            if b.busy == z:
                if self._held:
                    self._held.pop(b.id, None)  # the readers are done: let them go
                if b.single:
                    self._retire(b)
                else:
                    free.append(b)
        return free

    def acquire(self, nbytes: int, seq: int, timeout: float | None = None,
                check: Callable[[], None] | None = None) -> _Block:
        """A block with >= ``nbytes`` of data space for value ``seq``, busy for every reader.

        ``check`` is called about every 0.25 s while waiting for ``max_bytes`` to allow a
        new block (it raises when a reader died).

        Raises:
            ChannelTimeoutError: ``max_bytes`` is reached and nothing was freed in time.
            OSError: /dev/shm is full.
        """
        if _orphans:
            _sweep_orphans()
        deadline = None if timeout is None else time.monotonic() + timeout
        next_check = time.monotonic() + _CHECK_EVERY
        while True:
            free = self._scan()
            fit = [b for b in free if b.cap >= nbytes]
            if fit:
                blk = min(fit, key=lambda b: b.cap)
                break
            cap = _size_class(nbytes)
            # Why: unlink free blocks that are too small before growing, so the reusable
            # set follows the sizes in use.
            for b in sorted(free, key=lambda b: b.cap)[: max(len(free) - self.keep_free + 1, 0)]:
                self._retire(b)
            if self.max_bytes is not None and self.total_bytes + cap > self.max_bytes:
                for b in self._scan():
                    self._retire(b)
                if self.total_bytes + cap > self.max_bytes:
                    now = time.monotonic()
                    if deadline is not None and now >= deadline:
                        raise ChannelTimeoutError(
                            f"channel {self.prefix}: {self.total_bytes} bytes of data blocks "
                            f"are borrowed by readers (max {self.max_bytes})")
                    if check is not None and now >= next_check:
                        check()
                        next_check = now + _CHECK_EVERY
                    time.sleep(0.001)  # rare: a reader holds every block; poll for a release
                    continue
            blk = self._create(cap)
            pool = [b for b in self._blocks.values() if not b.single and b is not blk]
            if (len(pool) + 1 > self.keep_free
                    or sum(b.cap for b in pool) + blk.cap > self.keep_free_bytes):
                blk.single = True
                blk.u[_B_SINGLE] = 1
            break
        struct.pack_into("<Q", blk.seg.mv, _B_SEQ, seq)
        blk.busy[:] = self._ones
        return blk

    def let_go(self) -> None:
        """Drop the holds of blocks every reader has released (what ``acquire`` would do
        first). Why a separate step: a writer calls it right after publishing, so the
        release chain (upstream borrows, their callbacks) runs while the next value is
        still on its way, not on the next write's critical path."""
        if not self._held:
            return
        z = self._zeros
        blocks = self._blocks
        for bid in [bid for bid in self._held if bid not in blocks or blocks[bid].busy == z]:
            del self._held[bid]

    def unuse(self, blk: _Block) -> None:
        """Give back a block acquired for a value that was never published."""
        self._held.pop(blk.id, None)
        blk.busy[:] = self._zeros

    def hold(self, blk: _Block, objs: list) -> None:
        """Keep ``objs`` alive until every reader has released ``blk`` (noticed at a later
        ``acquire`` or at ``close``): the buffers a value in it refers to by reference."""
        self._held[blk.id] = objs

    def _create(self, cap: int) -> _Block:
        bid = self._next_id
        self._next_id += 1
        off = block_data_offset(self.num_readers)
        seg = Segment.create(f"{self.prefix}.d{bid}", off + cap)
        struct.pack_into("<IIQ", seg.mv, 0, BLOCK_MAGIC, self.num_readers, cap)
        blk = _Block(bid, seg, cap, self.num_readers)
        self._blocks[bid] = blk
        self.total_bytes += cap
        return blk

    def _retire(self, b: _Block, punch: bool = True) -> None:
        del self._blocks[b.id]
        held = self._held.pop(b.id, None)
        self.total_bytes -= b.cap
        free = b.busy == self._zeros
        if punch and free:
            b.seg.punch(b.data_off)  # nobody reads it: stale reader mappings hold nothing
        if held and not free:  # readers still view what it refers to: keep that alive
            b.seg.unlink()
            _orphans.append((b.busy, self._zeros, b.seg, held))
            b.u.release()
            return
        b.busy.release()
        b.u.release()
        b.seg.close()

    def live_blocks(self) -> int:
        """How many blocks exist now (in use or free)."""
        return len(self._blocks)

    def close(self) -> None:
        """Unlink and unmap every block (readers' existing views stay valid).

        Why no punch here: a block our readers released may still be viewed further down
        a pass-through chain (``forward``: the holds that kept it busy end with this
        close); its pages go when the last mapping does.
        """
        for b in list(self._blocks.values()):
            self._retire(b, punch=False)


class BlockCache:
    """Reader side: a bounded cache of mapped blocks, by id (mapping costs ~20 µs), and
    the count of live zero-copy borrows per block."""

    def __init__(self, prefix: str, limit: int = 16) -> None:
        self.prefix = prefix
        self.limit = limit
        self._maps: dict[int, tuple[Segment, memoryview]] = {}
        self.lock = threading.Lock()  # borrow counts change from GC callbacks in any thread

    def get(self, bid: int) -> tuple[Segment, memoryview]:
        """The mapped block ``bid`` and its u32 header view.

        Raises:
            FileNotFoundError: the block is gone (the writer closed the channel).
            ShmSecurityError: the name is not a segment of ours.
        """
        got = self._maps.get(bid)
        if got is None:
            seg = Segment.attach(f"{self.prefix}.d{bid}")
            magic, nr = struct.unpack_from("<II", seg.mv, 0)
            if magic != BLOCK_MAGIC or block_data_offset(nr) > seg.size:
                seg.close()
                raise ShmSecurityError(f"{seg.name} is not a data block of this channel")
            got = (seg, seg.mv[:block_data_offset(nr)].cast("I"))
            if len(self._maps) >= self.limit:
                # Why: retired blocks are never named again; dropping the oldest mapping
                # lets its memory go (a live zero-copy view keeps its own mapping alive).
                old = next(iter(self._maps))
                _close_mapped(self._maps.pop(old))
            self._maps[bid] = got
        return got

    def close(self) -> None:
        """Drop every mapping (views still in use keep theirs)."""
        for m in self._maps.values():
            _close_mapped(m)
        self._maps.clear()


def _close_mapped(m: tuple[Segment, memoryview]) -> None:
    # Why the header view is not released: a zero-copy borrow's callback may still hold it
    # to clear its busy word; the mapping then lives until that view is gone too.
    m[0].close()
