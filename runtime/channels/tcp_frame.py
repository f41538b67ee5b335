"""The TCP channel's frame format after set-up, and the state of a frame being received.

Frames, little-endian; ``session`` (8 bytes from the handshake, different per connection),
``seq``, the body length and the trailer are checked on every frame, so a stream out of
step (gap, duplicate, bytes lost) is a ``ChannelSequenceError``, never a value::

    u32 magic | u32 kind | u64 seq | u64 pickle_len | u32 nbufs | u32 0 | u64 session |
    u64 body_len | nbufs x u64 len | pickle bytes | buffer 0 | buffer 1 | ... | u64 trailer

Example:
    >>> from cgc.runtime.channels.tcp_frame import HDR, FRAME_MAGIC, DATA_FRAME, trailer
    >>> len(HDR.pack(FRAME_MAGIC, DATA_FRAME, 0, 3, 0, 0, 42, 3 + 8)), trailer(42, 0)
    (48, 42)
"""

from __future__ import annotations

import socket
import struct
from typing import Any

__all__ = ["FRAME_MAGIC", "HDR", "TRL", "DATA_FRAME", "CLOSE_FRAME", "POISON_FRAME",
           "MAX_BUFS", "trailer", "send_all", "Rx"]

FRAME_MAGIC = 0x54434743  # "CGCT"
HDR = struct.Struct("<IIQQIIQQ")  # magic, kind, seq, plen, nbufs, 0, session, body bytes
TRL = struct.Struct("<Q")  # after the body: trailer(session, seq)
DATA_FRAME, CLOSE_FRAME, POISON_FRAME = 1, 2, 3  # the kinds
MAX_BUFS = 1 << 16  # most out-of-band buffers in one frame
_IOV_MAX = 512
_M64 = (1 << 64) - 1


def trailer(session: int, seq: int) -> int:
    """The u64 that ends frame ``seq`` of ``session``: a frame that does not end where its
    header says shows as a mismatch here."""
    return (session ^ (seq * 0x9E3779B97F4A7C15)) & _M64



def send_all(sock: socket.socket, parts: list[Any]) -> None:
    """Send every byte of ``parts`` (a frame's pieces) with as few ``sendmsg`` calls as the
    kernel allows: no copy into one buffer."""
    views = [memoryview(p).cast("B") for p in parts if len(memoryview(p))]
    while views:
        sent = sock.sendmsg(views[:_IOV_MAX])
        while sent:
            n = views[0].nbytes
            if sent >= n:
                sent -= n
                views.pop(0)
            else:
                views[0] = views[0][sent:]
                sent = 0

class Rx:
    """One frame being received: every field is filled in place, so an interrupted read
    resumes; ``done`` holds a complete frame not yet returned."""

    __slots__ = ("off", "hdr", "head", "table", "parts", "trl", "done")

    def __init__(self) -> None:
        self.off = 0  # bytes of this frame taken off the stream (header included)
        self.hdr = bytearray(HDR.size)
        self.head: tuple[int, int, int, int] | None = None  # seq, pickle_len, nbufs, body
        self.table: bytearray | None = None
        self.parts: list[bytearray] | None = None
        self.trl = bytearray(TRL.size)
        self.done: tuple[int, bytearray, list[bytearray], int] | None = None
