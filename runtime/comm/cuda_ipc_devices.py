"""The device calls of the CUDA IPC communicator (``cuda_ipc``), behind one interface.

``IpcDevice`` is what the protocol needs: exportable buffers and interprocess events named by
handles that another process opens, device copies and stream waits. ``CudaIpcDevice`` runs
them on a GPU through ``cupy.cuda.runtime``; the test stand-in that runs the protocol in CI
without a GPU is ``cgc.runtime.comm.testing.shm_ipc_device.ShmIpcDevice``.

Example::

    dev = CudaIpcDevice(0)
    ptr, handle = dev.alloc(4096)      # another process: dev.open(handle)
"""

from __future__ import annotations

import abc
import threading
from typing import Any

from cgc.runtime.gpu.streams import SYNC_COUNTER

__all__ = ["IpcDevice", "CudaIpcDevice"]


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

    @abc.abstractmethod
    def release(self) -> None:
        """Release whatever the device still holds (teardown, after every buffer, mapping
        and event the transport knows of was freed)."""


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

    def release(self) -> None:
        """Nothing: the transport freed every buffer, mapping and event already."""
