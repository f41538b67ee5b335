"""Pooled data blocks for values that do not fit a ring slot or are read zero-copy.

A block is its own /dev/shm segment ``<ring name>.d<id>`` (ids are never reused, so a
reader's cached mapping can never point at a different block). Its header holds one
*busy* word per reader: the writer sets all of them when it puts a value in the block;
reader ``i`` clears word ``i`` when it no longer needs the memory (right after unpickling,
or, for zero-copy results, when the last view of the block dies). Each word has a single
writer at a time, so no atomic read-modify-write is needed across processes.

The writer never waits for a borrowed block: it takes another free block or creates one.
Free blocks beyond ``keep_free`` are unlinked, so memory follows what readers still hold.

Example:
    >>> from cgc.runtime.channels.pool import BlockPool
    >>> p = BlockPool("cgc-doc-pool", num_readers=1)
    >>> b = p.acquire(1000); b.cap >= 1000
    True
    >>> p.close()
"""

from __future__ import annotations

import struct
import time

from .errors import ChannelTimeoutError
from .shm import Segment

__all__ = ["BlockPool", "BlockCache", "block_data_offset"]

_BLOCK_MAGIC = 0x4B424743  # "CGBK"
_MIN_BLOCK = 64 * 1024


def block_data_offset(num_readers: int) -> int:
    """Byte offset of the data area in a block segment (header + busy words, 64-aligned)."""
    return (64 + 4 * num_readers + 63) & ~63


def _size_class(n: int) -> int:
    # Round up to 1/8 of the next power of two: <= 12.5% waste, few distinct sizes to reuse.
    n = max(n, _MIN_BLOCK)
    granule = max(_MIN_BLOCK, 1 << max(n.bit_length() - 4, 0))
    return (n + granule - 1) // granule * granule


class _Block:
    __slots__ = ("id", "seg", "cap", "busy", "data_off")

    def __init__(self, bid: int, seg: Segment, cap: int, num_readers: int) -> None:
        self.id = bid
        self.seg = seg
        self.cap = cap
        self.data_off = block_data_offset(num_readers)
        self.busy = seg.mv[64:64 + 4 * num_readers]


class BlockPool:
    """Writer side: owns (creates, reuses, unlinks) the data blocks of one ring."""

    def __init__(self, prefix: str, num_readers: int, keep_free: int = 4,
                 max_bytes: int | None = None) -> None:
        self.prefix = prefix
        self.num_readers = num_readers
        self.keep_free = keep_free
        self.max_bytes = max_bytes
        self._blocks: dict[int, _Block] = {}
        self._next_id = 1
        self._ones = b"\x01\x00\x00\x00" * num_readers
        self._zeros = bytes(4 * num_readers)
        self.total_bytes = 0

    def _free(self) -> list[_Block]:
        z = self._zeros
        return [b for b in self._blocks.values() if b.busy == z]

    def acquire(self, nbytes: int, timeout: float | None = None) -> _Block:
        """A block with >= ``nbytes`` of data space, marked busy for every reader.

        Raises:
            ChannelTimeoutError: ``max_bytes`` is reached and nothing was freed in time.
            OSError: /dev/shm is full.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            free = self._free()
            fit = [b for b in free if b.cap >= nbytes]
            if fit:
                blk = min(fit, key=lambda b: b.cap)
                break
            cap = _size_class(nbytes)
            # Why: unlink free blocks that are too small before growing, so /dev/shm holds
            # only what is in use plus a few reusable blocks.
            for b in sorted(free, key=lambda b: b.cap)[: max(len(free) - self.keep_free + 1, 0)]:
                self._retire(b)
            if self.max_bytes is not None and self.total_bytes + cap > self.max_bytes:
                for b in self._free():
                    self._retire(b)
                if self.total_bytes + cap > self.max_bytes:
                    if deadline is not None and time.monotonic() >= deadline:
                        raise ChannelTimeoutError(
                            f"channel {self.prefix}: {self.total_bytes} bytes of data blocks "
                            f"are borrowed by readers (max {self.max_bytes})")
                    time.sleep(0.001)  # rare: a reader holds every block; poll for a release
                    continue
            blk = self._create(cap)
            break
        blk.busy[:] = self._ones
        self._trim()
        return blk

    def _create(self, cap: int) -> _Block:
        bid = self._next_id
        self._next_id += 1
        off = block_data_offset(self.num_readers)
        seg = Segment.create(f"{self.prefix}.d{bid}", off + cap)
        struct.pack_into("<IIQ", seg.mv, 0, _BLOCK_MAGIC, self.num_readers, cap)
        blk = _Block(bid, seg, cap, self.num_readers)
        self._blocks[bid] = blk
        self.total_bytes += cap
        return blk

    def _trim(self) -> None:
        free = self._free()
        if len(free) > self.keep_free:
            for b in sorted(free, key=lambda b: b.cap)[: len(free) - self.keep_free]:
                self._retire(b)

    def _retire(self, b: _Block) -> None:
        del self._blocks[b.id]
        self.total_bytes -= b.cap
        b.busy.release()
        b.seg.close()

    def live_blocks(self) -> int:
        """How many blocks exist now (in use or free)."""
        return len(self._blocks)

    def close(self) -> None:
        """Unlink and unmap every block (readers' existing views stay valid)."""
        for b in list(self._blocks.values()):
            self._retire(b)


class BlockCache:
    """Reader side: a bounded cache of mapped blocks, by id (mapping costs ~20 µs)."""

    def __init__(self, prefix: str, limit: int = 16) -> None:
        self.prefix = prefix
        self.limit = limit
        self._maps: dict[int, Segment] = {}

    def get(self, bid: int) -> Segment:
        """The mapped block ``bid``.

        Raises:
            FileNotFoundError: the block is gone (the writer closed the channel).
        """
        seg = self._maps.get(bid)
        if seg is None:
            seg = Segment.attach(f"{self.prefix}.d{bid}")
            if len(self._maps) >= self.limit:
                # Why: retired blocks are never named again; dropping the oldest mapping
                # lets its memory go (a live zero-copy view keeps its own mapping alive).
                old = next(iter(self._maps))
                self._maps.pop(old).close()
            self._maps[bid] = seg
        return seg

    def close(self) -> None:
        """Drop every mapping (views still in use keep theirs)."""
        for seg in self._maps.values():
            seg.close()
        self._maps.clear()
