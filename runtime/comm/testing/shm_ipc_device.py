"""``ShmIpcDevice``: the CUDA IPC device calls without a GPU (a test stand-in).

Buffers are shared-memory segments named ``<prefix>m<rank>-<n>`` (a handle is its name),
copies are synchronous ``memmove``, events do nothing; ``CudaIpcCommunicator(...,
device=ShmIpcDevice(prefix, rank))`` runs the CUDA IPC protocol in CI.

Example:
    >>> dev = ShmIpcDevice("cgc-doc-ipc-", rank=0)
    >>> ptr, handle = dev.alloc(4096)
    >>> handle
    b'cgc-doc-ipc-m0-0'
    >>> dev.release()
"""

from __future__ import annotations

import ctypes
from typing import Any

from cgc.runtime.channels.errors import ChannelError
from cgc.runtime.channels.shm import Segment
from cgc.runtime.comm.cuda_ipc_devices import IpcDevice

__all__ = ["ShmIpcDevice"]


class ShmIpcDevice(IpcDevice):
    """``IpcDevice`` for CPU tests: buffers are shared-memory segments named
    ``<prefix>m<rank>-<n>`` (handles are their names), copies are synchronous ``memmove``,
    events do nothing."""

    def __init__(self, prefix: str, rank: int) -> None:
        self.prefix, self.rank = prefix, rank
        self._n = 0
        self._segs: dict[int, Segment] = {}

    def alloc(self, nbytes: int) -> tuple[int, bytes]:
        name = f"{self.prefix}m{self.rank}-{self._n}"
        self._n += 1
        seg = Segment.create(name, nbytes)
        self._segs[seg.addr] = seg
        return seg.addr, name.encode()

    def free(self, ptr: int) -> None:
        self._segs.pop(ptr).close()

    def open(self, handle: bytes) -> int:
        name = handle.decode()
        if not name.startswith(self.prefix):
            raise ChannelError(f"IPC handle {name!r} is not under {self.prefix!r}")
        seg = Segment.attach(name)
        self._segs[seg.addr] = seg
        return seg.addr

    close = free

    def new_event(self) -> tuple[Any, bytes]:
        return None, b""

    def open_event(self, handle: bytes) -> Any:
        return None

    def destroy_event(self, ev: Any) -> None:
        return None

    def record(self, ev: Any, stream: int) -> None:
        return None

    def wait(self, stream: int, ev: Any) -> None:
        return None

    def copy(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        ctypes.memmove(dst, src, nbytes)

    def sync_event(self, ev: Any) -> None:
        return None

    def release(self) -> None:
        """Unmap/unlink whatever is left (teardown)."""
        for seg in list(self._segs.values()):
            seg.close()
        self._segs.clear()
