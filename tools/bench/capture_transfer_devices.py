"""The device calls of ``capture_transfer.py``: one GPU (CUDA IPC, interprocess events, stream
memory operations, CUDA graphs) or, for runs without a GPU, the CPU.

``CudaDevice`` exports ``cudaMalloc``'d buffers and interprocess events and copies through
cgc's own ``CudaIpcDevice`` (what the IPC communicator uses), and
orders across processes either with interprocess events or with the driver's
``cuStreamWaitValue32_v2`` / ``cuStreamWriteValue32_v2`` (``StreamMemOps``, ctypes on
``libcuda.so.1``) on a flag word in exported device memory. Everything is queued on the
process's one stream, so it can be captured into a ``torch.cuda.CUDAGraph``.

``CpuDevice`` keeps the same interface for runs without a GPU over cgc's ``ShmIpcDevice``
(buffers are shared-memory segments named by their handles, copies are synchronous,
events do nothing); a flag wait spins on the host, and "capture" returns the function
itself.

Example::

    dev = CudaDevice()                          # in each process
    ptr, handle = dev.alloc(1 << 20)            # writer; handle goes to the reader
    peer_ptr = dev.open(handle)                 # reader
    dev.flag_wait(flag_ptr, 1); dev.copy(dst, peer_ptr, 1 << 20); dev.flag_write(flag_ptr, 0)
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from typing import Any

__all__ = ["StreamMemOps", "CudaDevice", "CpuDevice", "make_device", "DeviceError"]

CU_STREAM_WAIT_VALUE_EQ = 0x1
CU_STREAM_WRITE_VALUE_DEFAULT = 0x0  # with a memory barrier: earlier writes visible first
CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1 = 92
CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V1 = 93


class DeviceError(RuntimeError):
    """A CUDA driver call failed (the message names the call and the CUresult)."""


class StreamMemOps:
    """``cuStreamWaitValue32`` / ``cuStreamWriteValue32`` and device attributes, by ctypes.

    Raises:
        OSError: ``libcuda.so.1`` cannot be loaded. DeviceError: an entry point is missing.
    """

    def __init__(self) -> None:
        lib = self._lib = ctypes.CDLL("libcuda.so.1")
        u32, u64, P, Int = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_int  # noqa: N806
        self.entry: dict[str, str] = {}
        for what in ("cuStreamWaitValue32", "cuStreamWriteValue32"):
            for name in (what + "_v2", what):  # _v2 since CUDA 11.7; plain is an alias now
                fn = getattr(lib, name, None)
                if fn is not None:
                    fn.argtypes, fn.restype = [P, u64, u32, ctypes.c_uint], Int
                    setattr(self, "_" + what, fn)
                    self.entry[what] = name
                    break
            else:
                raise DeviceError(f"libcuda.so.1 has no {what}_v2 or {what}")
        lib.cuDeviceGetAttribute.argtypes = [ctypes.POINTER(Int), Int, Int]
        lib.cuDeviceGet.argtypes = [ctypes.POINTER(Int), Int]
        lib.cuDriverGetVersion.argtypes = [ctypes.POINTER(Int)]
        lib.cuGetErrorName.argtypes = [Int, ctypes.POINTER(ctypes.c_char_p)]
        for fn in (lib.cuDeviceGetAttribute, lib.cuDeviceGet, lib.cuDriverGetVersion,
                   lib.cuGetErrorName):
            fn.restype = Int

    def _ok(self, code: int, what: str) -> None:
        if code != 0:
            name = ctypes.c_char_p()
            self._lib.cuGetErrorName(code, ctypes.byref(name))
            raise DeviceError(f"{what}: CUresult {code} "
                              f"({(name.value or b'?').decode()})")

    def attribute(self, attr: int, ordinal: int = 0) -> int:
        dev, val = ctypes.c_int(), ctypes.c_int()
        self._ok(self._lib.cuDeviceGet(ctypes.byref(dev), ordinal), "cuDeviceGet")
        self._ok(self._lib.cuDeviceGetAttribute(ctypes.byref(val), attr, dev.value),
                 f"cuDeviceGetAttribute({attr})")
        return val.value

    def driver_version(self) -> int:
        v = ctypes.c_int()
        self._ok(self._lib.cuDriverGetVersion(ctypes.byref(v)), "cuDriverGetVersion")
        return v.value

    def wait_eq(self, stream: int, addr: int, value: int) -> None:
        """``stream`` waits until the 32-bit word at ``addr`` equals ``value``."""
        self._ok(self._cuStreamWaitValue32(stream, addr, value, CU_STREAM_WAIT_VALUE_EQ),
                 self.entry["cuStreamWaitValue32"])

    def write(self, stream: int, addr: int, value: int) -> None:
        """``stream`` writes ``value`` at ``addr`` after its earlier work (barrier)."""
        self._ok(self._cuStreamWriteValue32(stream, addr, value,
                                            CU_STREAM_WRITE_VALUE_DEFAULT),
                 self.entry["cuStreamWriteValue32"])


class CudaDevice:
    """One process's view of one GPU (``gpu``, default 0): its stream, exportable buffers,
    events, flags, graphs.

    The IPC calls are cgc's own (``cgc.runtime.comm.cuda_ipc_devices.CudaIpcDevice``), queued on
    the current stream (inside a capture that is the capture's stream)."""

    kind = "cuda"

    def __init__(self, gpu: int = 0) -> None:
        import torch
        from cupy.cuda import runtime

        from cgc.runtime.comm.cuda_ipc_devices import CudaIpcDevice

        self.torch, self.rt, self.gpu = torch, runtime, gpu
        torch.cuda.set_device(gpu)
        runtime.setDevice(gpu)
        torch.zeros(1, device="cuda")  # the primary context is current from here on
        self.stream = torch.cuda.Stream()
        self.memops = StreamMemOps()
        self.ipc = CudaIpcDevice(gpu)

    def info(self) -> dict[str, Any]:
        m = self.memops
        return {"gpu": self.torch.cuda.get_device_name(self.gpu), "torch": self.torch.__version__,
                "driver": m.driver_version(),
                "CAN_USE_STREAM_MEM_OPS(92)": m.attribute(
                    CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1),
                "CAN_USE_64_BIT_STREAM_MEM_OPS(93)": m.attribute(
                    CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V1),
                "entry points": dict(m.entry)}

    def tensor_device(self) -> str:
        return "cuda"

    def _s(self) -> int:
        return self.torch.cuda.current_stream().cuda_stream

    def alloc(self, nbytes: int) -> tuple[int, bytes]:
        ptr, handle = self.ipc.alloc(nbytes)
        self.rt.memset(ptr, 0, nbytes)  # flags start FREE (0)
        return ptr, bytes(handle)

    def open(self, handle: bytes) -> int:
        return self.ipc.open(handle)

    def new_event(self) -> tuple[Any, bytes]:
        ev, handle = self.ipc.new_event()
        return ev, bytes(handle)

    def open_event(self, handle: bytes) -> Any:
        return self.ipc.open_event(handle)

    def record(self, ev: Any) -> None:
        self.ipc.record(ev, self._s())

    def wait_event(self, ev: Any) -> None:
        self.ipc.wait(self._s(), ev)

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        self.ipc.copy(dst, src, nbytes, self._s())

    def flag_wait(self, addr: int, value: int) -> None:
        self.memops.wait_eq(self._s(), addr, value)

    def flag_write(self, addr: int, value: int) -> None:
        self.memops.write(self._s(), addr, value)

    def delay(self) -> None:
        """About 1 ms of device time on the stream (a spinning kernel; capturable)."""
        self.torch.cuda._sleep(2_000_000)  # cycles; ~1 ms at the H200's 1.98 GHz

    def capture(self, fn: Callable[[], None]) -> Callable[[], None]:
        """``fn``'s queued work as a CUDA graph; returns its replay (on the current stream).

        Raises:
            whatever capture raised (an op that cannot be captured).
        """
        torch = self.torch
        g = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        # thread_local: NCCL's helper threads may make CUDA calls while this one captures
        with torch.cuda.graph(g, capture_error_mode="thread_local"):
            fn()
        torch.cuda.synchronize()
        return g.replay

    def sync(self) -> None:
        self.torch.cuda.current_stream().synchronize()

    def release(self) -> None:
        """Nothing to do: the process's exit frees its CUDA memory and events."""


class CpuDevice:
    """``CudaDevice``'s interface on the host (see module doc): cgc's ``ShmIpcDevice``
    (segments named ``<prefix>m<rank>-<n>``, synchronous copies, no-op events) plus
    host-spinning flags."""

    kind = "cpu"

    def __init__(self, prefix: str, rank: int) -> None:
        from cgc.runtime.comm.testing.shm_ipc_device import ShmIpcDevice

        self.ipc = ShmIpcDevice(prefix, rank)
        self.alloc, self.open = self.ipc.alloc, self.ipc.open
        self.new_event, self.open_event = self.ipc.new_event, self.ipc.open_event
        self.release = self.ipc.release

    def info(self) -> dict[str, Any]:
        return {"device": "cpu (shared memory; copies synchronous, events no-ops, "
                          "capture = the function itself)"}

    def tensor_device(self) -> str:
        return "cpu"

    def record(self, ev: Any) -> None:
        return None

    def wait_event(self, ev: Any) -> None:
        return None

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        self.ipc.copy(dst, src, nbytes, 0)

    def flag_wait(self, addr: int, value: int, timeout: float = 60.0) -> None:
        word = ctypes.c_int32.from_address(addr)
        end = time.monotonic() + timeout
        while word.value != value:
            if time.monotonic() > end:
                raise TimeoutError(f"flag at {addr:#x} never became {value}")

    def flag_write(self, addr: int, value: int) -> None:
        ctypes.c_int32.from_address(addr).value = value

    def delay(self) -> None:
        time.sleep(0.002)

    def capture(self, fn: Callable[[], None]) -> Callable[[], None]:
        return fn

    def sync(self) -> None:
        return None


def make_device(kind: str, prefix: str, rank: int, gpu: int = 0) -> CudaDevice | CpuDevice:
    """``CudaDevice(gpu)`` for "cuda", ``CpuDevice(prefix, rank)`` for "cpu" (both sides
    pass the same ``prefix``: a handle opens only under it).

    Raises:
        ValueError: another kind.
    """
    if kind == "cuda":
        return CudaDevice(gpu)
    if kind == "cpu":
        return CpuDevice(prefix, rank)
    raise ValueError(f"device {kind!r}: use cuda or cpu")
