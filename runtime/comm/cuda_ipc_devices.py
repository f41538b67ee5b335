"""The device calls of the CUDA IPC communicator (``cuda_ipc``), behind one interface.

``IpcDevice`` is what the protocol needs: exportable buffers and interprocess events named by
handles that another process opens, device copies and stream waits. ``CudaIpcDevice`` runs
them on a GPU through ``cupy.cuda.runtime``; ``ShmIpcDevice`` stands in for the GPU in CPU
tests (buffers are shared-memory segments, copies are synchronous, events do nothing), so the
protocol itself runs in CI.

Example:
    >>> dev = ShmIpcDevice("cgc-doc-ipc-", rank=0)
    >>> ptr, handle = dev.alloc(4096)
    >>> handle
    b'cgc-doc-ipc-m0-0'
    >>> dev.release()
"""

from __future__ import annotations

import abc
import ctypes
import threading
from typing import Any

from cgc.runtime.channels.errors import ChannelError
from cgc.runtime.channels.shm import Segment
from cgc.runtime.gpu.streams import SYNC_COUNTER

__all__ = ["IpcDevice", "CudaIpcDevice", "ShmIpcDevice"]


class IpcDevice(abc.ABC):
    """The device calls of the IPC protocol (pointers, streams and events are ints)."""

    @abc.abstractmethod
    def alloc(self, nbytes: int) -> tuple[int, bytes]:
        """A new exportable buffer: (pointer, handle)."""

    @abc.abstractmethod
    def free(self, ptr: int) -> None: ...

    @abc.abstractmethod
    def open(self, handle: bytes) -> int:
        """Map a peer's buffer; returns its pointer here."""

    @abc.abstractmethod
    def close(self, ptr: int) -> None: ...

    @abc.abstractmethod
    def new_event(self) -> tuple[Any, bytes]:
        """A new interprocess event: (event, handle)."""

    @abc.abstractmethod
    def open_event(self, handle: bytes) -> Any: ...

    @abc.abstractmethod
    def destroy_event(self, ev: Any) -> None: ...

    @abc.abstractmethod
    def record(self, ev: Any, stream: int) -> None: ...

    @abc.abstractmethod
    def wait(self, stream: int, ev: Any) -> None:
        """``stream`` waits for ``ev``'s latest record (no CPU wait)."""

    @abc.abstractmethod
    def copy(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        """Device-to-device copy queued on ``stream``."""

    @abc.abstractmethod
    def sync_event(self, ev: Any) -> None:
        """CPU wait for ``ev`` (rare paths only; counted in ``SYNC_COUNTER``)."""


class CudaIpcDevice(IpcDevice):
    """``IpcDevice`` over ``cupy.cuda.runtime`` on CUDA device ``device``."""

    def __init__(self, device: int) -> None:
        from cupy.cuda import runtime

        self.rt = runtime
        self.device = int(device)
        self._flags = runtime.eventDisableTiming | runtime.eventInterprocess
        self._tls = threading.local()

    def _dev(self) -> None:
        # cupy's runtime calls act on the calling thread's current device
        if getattr(self._tls, "dev", None) != self.device:
            self.rt.setDevice(self.device)
            self._tls.dev = self.device

    def alloc(self, nbytes: int) -> tuple[int, bytes]:
        self._dev()
        ptr = self.rt.malloc(nbytes)
        return ptr, self.rt.ipcGetMemHandle(ptr)

    def free(self, ptr: int) -> None:
        self._dev()
        self.rt.free(ptr)

    def open(self, handle: bytes) -> int:
        self._dev()
        return self.rt.ipcOpenMemHandle(handle)

    def close(self, ptr: int) -> None:
        self._dev()
        self.rt.ipcCloseMemHandle(ptr)

    def new_event(self) -> tuple[Any, bytes]:
        self._dev()
        ev = self.rt.eventCreateWithFlags(self._flags)
        return ev, self.rt.ipcGetEventHandle(ev)

    def open_event(self, handle: bytes) -> Any:
        self._dev()
        return self.rt.ipcOpenEventHandle(handle)

    def destroy_event(self, ev: Any) -> None:
        self.rt.eventDestroy(ev)

    def record(self, ev: Any, stream: int) -> None:
        self._dev()
        self.rt.eventRecord(ev, stream)

    def wait(self, stream: int, ev: Any) -> None:
        self._dev()
        self.rt.streamWaitEvent(stream, ev, 0)

    def copy(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        self._dev()
        self.rt.memcpyAsync(dst, src, nbytes, self.rt.memcpyDeviceToDevice, stream)

    def sync_event(self, ev: Any) -> None:
        SYNC_COUNTER.note("ipc slot regrowth")
        self.rt.eventSynchronize(ev)


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
