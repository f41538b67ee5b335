"""Forwarding pass-through buffers by reference instead of copying them again.

An actor that read an array zero-copy holds a view of the upstream writer's data block.
When it writes that array on unchanged (returned as is, a slice of it, or inside a
container), copying it into its own block would be a wasted copy: the bytes already sit
in shared memory that the next reader can map. So every zero-copy mapping a reader hands
out is *registered* here with its address range and the segment it comes from; a writer
asks ``find`` for each large out-of-band buffer it is about to copy, and for a registered
one it writes a small *reference record* (segment name + byte offset) instead of the bytes.

Lifetime (why the bytes stay valid): the value then travels in a data block of the
forwarding writer's own ring, so each downstream reader holds a busy word in *that* block
for as long as any view of the forwarded bytes lives (its views count as borrows of the
block, exactly like local zero-copy views). The forwarding writer keeps the buffers it
forwarded (and so its own upstream borrow) alive until the block is free again
(``BlockPool.hold``): a chain of holds, each released when the next one is.

Records: ``<Q file offset><H name length><name bytes>`` in the block's data area; the
table entry of such a buffer has ``FOREIGN`` set in its offset word.

Example:
    >>> import numpy as np
    >>> a = np.zeros(8, np.uint8)
    >>> tok = register(a, "cgc-doc-seg.d1", 4096)
    >>> find(memoryview(a)[2:6])
    ('cgc-doc-seg.d1', 4098)
    >>> unregister(tok); find(memoryview(a)) is None
    True
"""

from __future__ import annotations

import itertools
import struct
import threading
from typing import Any

import numpy as np

from cgc.runtime.channels.errors import ShmSecurityError
from cgc.runtime.channels.shm import Segment

__all__ = ["FOREIGN", "register", "unregister", "find", "pack_record", "record_size",
           "unpack_record", "ForeignCache"]

FOREIGN = 1 << 63  # set in a buffer's table offset: the entry is a reference record
_REC = struct.Struct("<QH")

_lock = threading.RLock()  # why reentrant: a GC callback (unregister) may run inside find
_ranges: dict[int, tuple[int, int, str, int]] = {}  # token -> (start, end, segment, offset)
_tokens = itertools.count(1)


def _address(buf: Any) -> int:
    # Why not ``.ctypes.data``: building the ctypes helper costs ~2 us more per call.
    return np.frombuffer(buf, np.uint8).__array_interface__["data"][0]


def register(carrier: np.ndarray, segment: str, file_offset: int,
             address: int | None = None) -> int:
    """Record that ``carrier``'s bytes are bytes ``file_offset..`` of ``segment``.

    ``address``: the carrier's first byte in memory when the caller knows it already
    (mapping base + offset: cheaper than asking numpy).

    Returns a token for ``unregister`` (call it when the carrier dies).
    """
    start = _address(carrier) if address is None else address
    tok = next(_tokens)
    with _lock:
        _ranges[tok] = (start, start + carrier.nbytes, segment, file_offset)
    return tok


def unregister(token: int) -> None:
    """Forget a registered mapping (its carrier died)."""
    with _lock:
        _ranges.pop(token, None)


def find(buf: Any) -> tuple[str, int] | None:
    """``(segment, file offset)`` of a contiguous buffer that lies in a registered mapping.

    Why it is safe to hand out: ``buf`` keeps its carrier alive, and the carrier's
    registration lasts as long as the carrier.
    """
    if not _ranges:
        return None
    a = _address(buf)
    end = a + memoryview(buf).nbytes
    with _lock:
        for start, stop, seg, off in _ranges.values():
            if start <= a and end <= stop:
                return seg, off + (a - start)
    return None


def record_size(segment: str) -> int:
    """Bytes of the reference record for ``segment``."""
    return _REC.size + len(segment.encode())


def pack_record(mv: memoryview, at: int, segment: str, file_offset: int) -> None:
    """Write a reference record at ``mv[at:]``."""
    name = segment.encode()
    _REC.pack_into(mv, at, file_offset, len(name))
    mv[at + _REC.size:at + _REC.size + len(name)] = name


def unpack_record(mv: memoryview, at: int) -> tuple[str, int]:
    """``(segment, file offset)`` of the record at ``mv[at:]``."""
    off, n = _REC.unpack_from(mv, at)
    return bytes(mv[at + _REC.size:at + _REC.size + n]).decode(), off


class ForeignCache:
    """Reader side: mappings of other rings' data blocks named by reference records.

    Why cached: a forwarding writer's upstream reuses its blocks, so the same few names
    come back every execution, and mapping (plus first-touch page faults) is not free.
    """

    def __init__(self, limit: int = 16) -> None:
        self.limit = limit
        self._maps: dict[str, Segment] = {}

    def view(self, segment: str, file_offset: int, nbytes: int,
             block_magic: int) -> tuple[np.ndarray, int]:
        """A uint8 array over ``nbytes`` at ``file_offset`` of ``segment``, and the address
        of its first byte in this process.

        Raises:
            FileNotFoundError: the segment is gone (its writer closed).
            ShmSecurityError: not a data block of ours, or the range lies outside it.
        """
        seg = self._maps.get(segment)
        if seg is None:
            seg = Segment.attach(segment)
            if struct.unpack_from("<I", seg.mv, 0)[0] != block_magic:
                seg.close()
                raise ShmSecurityError(f"{segment} is not a cgc data block: refused")
            if len(self._maps) >= self.limit:
                self._maps.pop(next(iter(self._maps))).close()  # views keep their mapping
            self._maps[segment] = seg
        if file_offset < seg.HEADER or file_offset + nbytes > len(seg.mm):
            raise ShmSecurityError(f"reference to bytes {file_offset}+{nbytes} outside "
                                   f"{segment}")
        view = np.frombuffer(seg.mm, np.uint8, count=nbytes, offset=file_offset)
        return view, seg.addr - seg.HEADER + file_offset

    def close(self) -> None:
        """Drop every mapping (views still in use keep theirs)."""
        for seg in self._maps.values():
            seg.close()
        self._maps.clear()
