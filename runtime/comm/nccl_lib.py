"""Two bindings of the NCCL C API behind one small interface: ctypes (default) and cupy.

``NcclLib`` is what ``nccl.NcclTransport`` calls: unique id, init with a deadline, grouped
p2p, the four collectives, async-error checks, abort and destroy, on raw device pointers
and raw CUDA stream handles.

**CtypesNccl** (``binding="ctypes"``) loads ``libnccl.so.2`` itself - the copy torch
already loaded (dlopen by soname returns it), or ``$CGC_NCCL_LIBRARY``, or the
``nvidia/nccl/lib`` of an installed wheel - and creates communicators with
``ncclCommInitRankConfig`` and ``config.blocking = 0`` (NCCL >= 2.14). That is what makes
deadlines real: init returns at once, the caller polls ``ncclCommGetAsyncError`` until the
state leaves ``ncclInProgress``, and on the deadline calls ``ncclCommAbort``, which for a
non-blocking communicator joins NCCL's init thread before freeing anything (NCCL
``init.cc``: ``ncclCommAbort`` -> ``ncclCommEnsureReady`` -> ``ncclGroupJobAbort``). Every
call on a communicator holds its lock; ``abort`` takes the same lock, so an abort from
another thread never frees a communicator under a running call (non-blocking calls
return in microseconds, so the lock is never held long). The price: in non-blocking mode
every group end starts an NCCL helper thread and returns ``ncclInProgress`` (NCCL
``group.cc``), which this binding polls to completion - tens of microseconds per op.
``blocking=True`` (``$CGC_NCCL_BLOCKING=1``) trades that back for unabortable init (see
below).

**CupyNccl** (``binding="cupy"``) uses ``cupy.cuda.nccl`` (cupy-cuda12x or cupy-cuda13x,
whichever is installed). cupy only has blocking ``ncclCommInitRank``. A blocking init that
fails frees the communicator inside the init call (``ncclCommInitRankDev``'s ``fail:``
path), so an ``ncclCommAbort`` from another thread during a blocking init can use freed
memory: there is no safe way to end a hung blocking init. So for blocking inits
(cupy, or ctypes with ``blocking=True``) ``init``:

1. relies on the caller's pre-init barrier (``NcclCommunicator`` runs one over the
   side-channels: every member is alive and about to init, or the barrier times out with
   no NCCL call made) - that removes the usual cause of init hangs (a member that never
   arrives);
2. runs the blocking init in a helper daemon thread and waits for it with the deadline;
3. on the deadline raises ``SetupError`` and leaves that thread blocked (it holds the
   bootstrap sockets until the process exits; the actor should be restarted).

After init, ``abort`` on a blocking communicator calls ``ncclCommAbort`` without the lock
(a device-side hang leaves no CPU call running; this is what torch's watchdog does).

Example::

    lib = nccl_lib()                       # CtypesNccl if libnccl.so.2 loads, else CupyNccl
    uid = lib.unique_id()                  # rank 0; hand the 128 bytes to the others
    h = lib.init(world, uid, rank, deadline=time.monotonic() + 60)
    lib.group_start(); lib.send(h, ptr, nbytes, UINT8, peer, stream); lib.group_end(h)
"""

from __future__ import annotations

import abc
import ctypes
import glob
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from cgc.runtime.channels.errors import ChannelClosedError, ChannelError, ChannelTimeoutError
from cgc.runtime.errors import SetupError
from cgc.runtime.gpu.polling import poll_until

__all__ = ["NcclLib", "CtypesNccl", "CupyNccl", "NcclError", "NcclHandle", "nccl_lib",
           "UNIQUE_ID_BYTES", "DTYPES", "OPS", "UINT8", "SUCCESS", "IN_PROGRESS"]

UNIQUE_ID_BYTES = 128
SUCCESS, IN_PROGRESS = 0, 7
# ncclDataType_t (nccl.h); ncclFloat8e4m3/e5m2 need NCCL >= 2.19
DTYPES = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5,
          "float16": 6, "float32": 7, "float64": 8, "bfloat16": 9, "float8_e4m3fn": 10,
          "float8_e5m2": 11}
UINT8 = DTYPES["uint8"]
OPS = {"sum": 0, "product": 1, "max": 2, "min": 3, "avg": 4}  # ncclRedOp_t
_ERRORS = {1: "ncclUnhandledCudaError", 2: "ncclSystemError", 3: "ncclInternalError",
           4: "ncclInvalidArgument", 5: "ncclInvalidUsage", 6: "ncclRemoteError",
           7: "ncclInProgress", 8: "ncclTimeout"}
_POLL = 20e-6  # first sleep while polling a non-blocking communicator


class NcclError(ChannelError):
    """An NCCL call or an asynchronous NCCL failure (``code`` is the ncclResult_t)."""

    def __init__(self, code: int, what: str, detail: str = "") -> None:
        self.code = code
        name = _ERRORS.get(code, f"ncclResult {code}")
        super().__init__(f"{what}: {name}" + (f" ({detail})" if detail else ""))


class NcclHandle:
    """One communicator of a binding: the raw comm, its lock, and how it was made."""

    def __init__(self, comm: Any, blocking: bool, rank: int, world: int) -> None:
        self.comm = comm
        self.blocking = blocking
        self.rank, self.world = rank, world
        self.lock = threading.Lock()
        self.aborted = False


class NcclLib(abc.ABC):
    """The NCCL calls ``NcclTransport`` makes (see module doc). Pointers and streams are
    ints (``tensor.data_ptr()``, ``torch.cuda.Stream.cuda_stream``)."""

    name = "nccl"
    blocking = True

    @abc.abstractmethod
    def version(self) -> int:
        """NCCL's version code (e.g. 22809)."""

    @abc.abstractmethod
    def unique_id(self) -> bytes:
        """A fresh ncclUniqueId (128 bytes); the calling process hosts the bootstrap root."""

    @abc.abstractmethod
    def init(self, world: int, uid: bytes, rank: int, deadline: float,
             poll: Callable[[], None] | None = None, device: int | None = None) -> NcclHandle:
        """Join the communicator ``uid`` as ``rank`` of ``world`` by ``deadline``
        (``time.monotonic()``) on CUDA ``device`` (default: the current one); ``poll()``
        runs while waiting (it raises to give up).

        Raises:
            SetupError: not done by the deadline. NcclError: NCCL failed.
        """

    @abc.abstractmethod
    def group_start(self) -> None: ...

    @abc.abstractmethod
    def group_end(self, h: NcclHandle) -> None:
        """End the group (and, non-blocking, wait until NCCL has queued it)."""

    @abc.abstractmethod
    def send(self, h: NcclHandle, ptr: int, count: int, dtype: int, peer: int,
             stream: int) -> None: ...

    @abc.abstractmethod
    def recv(self, h: NcclHandle, ptr: int, count: int, dtype: int, peer: int,
             stream: int) -> None: ...

    @abc.abstractmethod
    def allreduce(self, h: NcclHandle, sptr: int, rptr: int, count: int, dtype: int, op: int,
                  stream: int) -> None: ...

    @abc.abstractmethod
    def allgather(self, h: NcclHandle, sptr: int, rptr: int, sendcount: int, dtype: int,
                  stream: int) -> None: ...

    @abc.abstractmethod
    def reducescatter(self, h: NcclHandle, sptr: int, rptr: int, recvcount: int, dtype: int,
                      op: int, stream: int) -> None: ...

    @abc.abstractmethod
    def check(self, h: NcclHandle) -> None:
        """Raise ``NcclError`` if the communicator failed asynchronously."""

    @abc.abstractmethod
    def abort(self, h: NcclHandle) -> None:
        """``ncclCommAbort`` (from any thread; idempotent)."""

    @abc.abstractmethod
    def destroy(self, h: NcclHandle, deadline: float) -> None:
        """Release a communicator whose work completed (aborts when past ``deadline``)."""


def _closed(h: NcclHandle) -> ChannelClosedError:
    return ChannelClosedError(f"NCCL communicator rank {h.rank}/{h.world} was aborted")


def _set_device(device: int | None) -> None:
    """Make ``device`` current in this thread (inits may run in a helper thread)."""
    if device is not None:
        import torch

        torch.cuda.set_device(device)


def _blocking_init(start: Callable[[], Any], deadline: float,
                   poll: Callable[[], None] | None, what: str) -> Any:
    """Run a blocking init in a daemon thread; give up (leaving it) at ``deadline``."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["comm"] = start()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            box["error"] = exc

    th = threading.Thread(target=run, name="cgc-nccl-init", daemon=True)
    th.start()
    while th.is_alive():
        left = deadline - time.monotonic()
        if left <= 0:
            raise SetupError(
                f"{what}: NCCL init did not finish by its deadline; a blocking init cannot "
                "be aborted safely, so its thread stays blocked until the process exits "
                "(restart this actor; the ctypes binding's non-blocking init aborts instead)")
        th.join(min(left, 0.05))
        if th.is_alive() and poll is not None:
            poll()
    if "error" in box:
        raise box["error"]
    return box["comm"]


# --------------------------------------------------------------------------- ctypes

class _UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_ubyte * UNIQUE_ID_BYTES)]


class _Config(ctypes.Structure):
    # The first fields of ncclConfig_t, as in NCCL 2.17. NCCL copies ``size`` bytes over
    # its defaults and resets every field newer than ``version`` (init.cc parseCommConfig),
    # so this prefix is valid for NCCL 2.17 .. 2.30.
    _fields_ = [("size", ctypes.c_size_t), ("magic", ctypes.c_uint),
                ("version", ctypes.c_uint), ("blocking", ctypes.c_int),
                ("cgaClusterSize", ctypes.c_int), ("minCTAs", ctypes.c_int),
                ("maxCTAs", ctypes.c_int), ("netName", ctypes.c_char_p)]


_UNDEF_INT = -(2 ** 31)  # NCCL_CONFIG_UNDEF_INT
_CONFIG_VERSION = 21700  # NCCL_VERSION(2, 17, 0)


def find_libnccl() -> str:
    """Path (or soname) of the libnccl to load: ``$CGC_NCCL_LIBRARY``, the one already in
    the process (torch links it), else an installed ``nvidia-nccl-*`` wheel's.

    Raises:
        OSError: none found.
    """
    env = os.environ.get("CGC_NCCL_LIBRARY")
    if env:
        return env
    try:
        ctypes.CDLL("libnccl.so.2", mode=ctypes.RTLD_GLOBAL)
        return "libnccl.so.2"
    except OSError:
        pass
    for base in sys.path:
        for pat in ("nvidia/nccl/lib/libnccl.so*", "nvidia/*/lib/libnccl.so*"):
            hits = sorted(glob.glob(os.path.join(base or ".", pat)))
            if hits:
                return hits[0]
    raise OSError("libnccl.so.2 not found (install torch with CUDA, nvidia-nccl-cu12/13, "
                  "or set CGC_NCCL_LIBRARY)")


class CtypesNccl(NcclLib):
    """NCCL through ctypes, non-blocking communicators by default (see module doc)."""

    name = "ctypes"

    def __init__(self, path: str | None = None, *, blocking: bool = False) -> None:
        if "torch" not in sys.modules:
            try:  # torch links libnccl: load its copy first so there is one NCCL per process
                import torch  # noqa: F401
            except ImportError:
                pass
        self.path = path or find_libnccl()
        lib = self._lib = ctypes.CDLL(self.path, mode=ctypes.RTLD_GLOBAL)
        self.blocking = blocking
        self._tls = threading.local()  # group depth per thread
        P, Int, S = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t  # noqa: N806
        sig = {
            "ncclGetVersion": [ctypes.POINTER(Int)],
            "ncclGetUniqueId": [ctypes.POINTER(_UniqueId)],
            "ncclCommInitRankConfig": [ctypes.POINTER(P), Int, _UniqueId, Int,
                                       ctypes.POINTER(_Config)],
            "ncclCommGetAsyncError": [P, ctypes.POINTER(Int)],
            "ncclCommAbort": [P],
            "ncclCommDestroy": [P],
            "ncclCommFinalize": [P],
            "ncclGroupStart": [],
            "ncclGroupEnd": [],
            "ncclSend": [P, S, Int, Int, P, P],
            "ncclRecv": [P, S, Int, Int, P, P],
            "ncclAllReduce": [P, P, S, Int, Int, P, P],
            "ncclAllGather": [P, P, S, Int, P, P],
            "ncclReduceScatter": [P, P, S, Int, Int, P, P],
        }
        for fn, args in sig.items():
            f = getattr(lib, fn)
            f.argtypes, f.restype = args, Int
        lib.ncclGetErrorString.argtypes, lib.ncclGetErrorString.restype = [Int], ctypes.c_char_p
        try:
            lib.ncclGetLastError.argtypes = [P]
            lib.ncclGetLastError.restype = ctypes.c_char_p
            self._last: Any = lib.ncclGetLastError
        except AttributeError:  # NCCL < 2.13
            self._last = None
        v = self.version()
        if v < 21700:
            raise OSError(f"{self.path}: NCCL {v} is too old (cgc needs >= 2.17)")

    def _detail(self, comm: Any) -> str:
        if self._last is None:
            return ""
        msg = self._last(comm)
        return msg.decode(errors="replace") if msg else ""

    def _ok(self, code: int, what: str, comm: Any = None) -> int:
        if code not in (SUCCESS, IN_PROGRESS):
            raise NcclError(code, what, self._detail(comm))
        return code

    def version(self) -> int:
        v = ctypes.c_int()
        self._ok(self._lib.ncclGetVersion(ctypes.byref(v)), "ncclGetVersion")
        return v.value

    def unique_id(self) -> bytes:
        uid = _UniqueId()
        self._ok(self._lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        return bytes(uid.internal)

    def _state(self, h: NcclHandle) -> int:
        st = ctypes.c_int(SUCCESS)
        with h.lock:
            if h.comm is None:
                raise _closed(h)
            self._ok(self._lib.ncclCommGetAsyncError(h.comm, ctypes.byref(st)),
                     "ncclCommGetAsyncError", h.comm)
        return st.value

    def _wait_ready(self, h: NcclHandle, what: str, deadline: float | None = None,
                    poll: Callable[[], None] | None = None) -> None:
        """Poll a non-blocking communicator until its last call completed."""
        def done() -> bool:
            st = self._state(h)
            if st != SUCCESS and st != IN_PROGRESS:
                raise NcclError(st, what, self._detail(h.comm))
            return st == SUCCESS

        poll_until(done, deadline, poll, f"{what}: NCCL still in progress at its deadline",
                   first_nap=_POLL)

    def init(self, world: int, uid: bytes, rank: int, deadline: float,
             poll: Callable[[], None] | None = None, device: int | None = None) -> NcclHandle:
        if len(uid) != UNIQUE_ID_BYTES:
            raise ValueError(f"an NCCL unique id has {UNIQUE_ID_BYTES} bytes, not {len(uid)}")
        u = _UniqueId()
        ctypes.memmove(u.internal, uid, UNIQUE_ID_BYTES)
        cfg = _Config(ctypes.sizeof(_Config), 0xCAFEBEEF, _CONFIG_VERSION,
                      1 if self.blocking else 0, _UNDEF_INT, _UNDEF_INT, _UNDEF_INT, None)
        what = f"ncclCommInitRankConfig(rank {rank} of {world})"

        def start() -> Any:
            _set_device(device)  # NCCL binds the communicator to the current device
            comm = ctypes.c_void_p()
            self._ok(self._lib.ncclCommInitRankConfig(ctypes.byref(comm), world, u, rank,
                                                      ctypes.byref(cfg)), what)
            return comm

        if self.blocking:
            return NcclHandle(_blocking_init(start, deadline, poll, what), True, rank, world)
        h = NcclHandle(start(), False, rank, world)
        try:
            self._wait_ready(h, what, deadline, poll)
        except ChannelTimeoutError:
            self.abort(h)
            raise SetupError(f"{what}: not done by its deadline; aborted (a member did not "
                             "join, or the network between members is blocked)") from None
        except BaseException:
            self.abort(h)
            raise
        return h

    def _call(self, h: NcclHandle, what: str, fn: Any, args: tuple[Any, ...],
              stream: int) -> None:
        with h.lock:
            if h.comm is None:
                raise _closed(h)
            code = self._ok(fn(*args, h.comm, stream), what, h.comm)
        # Inside a group NCCL only queues the call; the group end is what may be pending.
        if code == IN_PROGRESS and not getattr(self._tls, "depth", 0):
            self._wait_ready(h, what)

    def group_start(self) -> None:
        self._ok(self._lib.ncclGroupStart(), "ncclGroupStart")
        self._tls.depth = getattr(self._tls, "depth", 0) + 1

    def group_end(self, h: NcclHandle) -> None:
        self._tls.depth = max(getattr(self._tls, "depth", 1) - 1, 0)
        with h.lock:
            if h.comm is None:
                self._lib.ncclGroupEnd()  # close the group NCCL opened for this thread
                raise _closed(h)
            code = self._ok(self._lib.ncclGroupEnd(), "ncclGroupEnd", h.comm)
        if code == IN_PROGRESS or not h.blocking:
            self._wait_ready(h, "ncclGroupEnd")

    def send(self, h: NcclHandle, ptr: int, count: int, dtype: int, peer: int,
             stream: int) -> None:
        self._call(h, "ncclSend", self._lib.ncclSend, (ptr, count, dtype, peer), stream)

    def recv(self, h: NcclHandle, ptr: int, count: int, dtype: int, peer: int,
             stream: int) -> None:
        self._call(h, "ncclRecv", self._lib.ncclRecv, (ptr, count, dtype, peer), stream)

    def allreduce(self, h: NcclHandle, sptr: int, rptr: int, count: int, dtype: int, op: int,
                  stream: int) -> None:
        self._call(h, "ncclAllReduce", self._lib.ncclAllReduce,
                   (sptr, rptr, count, dtype, op), stream)

    def allgather(self, h: NcclHandle, sptr: int, rptr: int, sendcount: int, dtype: int,
                  stream: int) -> None:
        self._call(h, "ncclAllGather", self._lib.ncclAllGather,
                   (sptr, rptr, sendcount, dtype), stream)

    def reducescatter(self, h: NcclHandle, sptr: int, rptr: int, recvcount: int, dtype: int,
                      op: int, stream: int) -> None:
        self._call(h, "ncclReduceScatter", self._lib.ncclReduceScatter,
                   (sptr, rptr, recvcount, dtype, op), stream)

    def check(self, h: NcclHandle) -> None:
        st = self._state(h)
        if st not in (SUCCESS, IN_PROGRESS):
            raise NcclError(st, f"NCCL communicator rank {h.rank}/{h.world} failed",
                            self._detail(h.comm))

    def abort(self, h: NcclHandle) -> None:
        if h.blocking:  # see module doc: a blocking call may hold the lock for ever
            comm, h.comm = h.comm, None
            if comm is not None:
                h.aborted = True
                self._lib.ncclCommAbort(comm)
            return
        with h.lock:
            comm, h.comm = h.comm, None
            if comm is not None:
                h.aborted = True
                self._lib.ncclCommAbort(comm)

    def destroy(self, h: NcclHandle, deadline: float) -> None:
        if h.comm is None:
            return
        if not h.blocking:
            try:
                with h.lock:
                    code = self._ok(self._lib.ncclCommFinalize(h.comm), "ncclCommFinalize",
                                    h.comm)
                if code == IN_PROGRESS:
                    self._wait_ready(h, "ncclCommFinalize", deadline)
            except (ChannelError, ChannelTimeoutError):
                self.abort(h)
                return
        with h.lock:
            comm, h.comm = h.comm, None
            if comm is not None:
                self._lib.ncclCommDestroy(comm)


# --------------------------------------------------------------------------- cupy

class CupyNccl(NcclLib):
    """NCCL through ``cupy.cuda.nccl`` (blocking communicators only; see module doc)."""

    name = "cupy"
    blocking = True

    def __init__(self) -> None:
        from cupy.cuda import nccl

        if not getattr(nccl, "available", False):
            raise OSError("cupy is installed but its NCCL is not (cupy.cuda.nccl.available "
                          "is False)")
        self._nccl = nccl

    def _wrap(self, exc: Exception, what: str) -> NcclError:
        return NcclError(int(getattr(exc, "status", 3)), what, str(exc))

    def version(self) -> int:
        return int(self._nccl.get_version())

    def unique_id(self) -> bytes:
        # cupy returns the 128 C chars as Python ints (signed on x86)
        return bytes(b & 0xFF for b in self._nccl.get_unique_id())

    def init(self, world: int, uid: bytes, rank: int, deadline: float,
             poll: Callable[[], None] | None = None, device: int | None = None) -> NcclHandle:
        if len(uid) != UNIQUE_ID_BYTES:
            raise ValueError(f"an NCCL unique id has {UNIQUE_ID_BYTES} bytes, not {len(uid)}")
        # cupy 14 takes the id as bytes; older releases as a tuple of signed chars.
        signed = tuple(b - 256 if b > 127 else b for b in uid)
        what = f"cupy NcclCommunicator(rank {rank} of {world})"

        def start() -> Any:
            _set_device(device)
            try:
                try:
                    return self._nccl.NcclCommunicator(world, bytes(uid), rank)
                except TypeError:
                    return self._nccl.NcclCommunicator(world, signed, rank)
            except self._nccl.NcclError as exc:
                raise self._wrap(exc, what) from None

        return NcclHandle(_blocking_init(start, deadline, poll, what), True, rank, world)

    def _comm(self, h: NcclHandle) -> Any:
        if h.comm is None:
            raise _closed(h)
        return h.comm

    def _do(self, what: str, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except self._nccl.NcclError as exc:
            raise self._wrap(exc, what) from None

    def group_start(self) -> None:
        self._do("ncclGroupStart", self._nccl.groupStart)

    def group_end(self, h: NcclHandle) -> None:
        self._do("ncclGroupEnd", self._nccl.groupEnd)

    def send(self, h: NcclHandle, ptr: int, count: int, dtype: int, peer: int,
             stream: int) -> None:
        self._do("ncclSend", self._comm(h).send, ptr, count, dtype, peer, stream)

    def recv(self, h: NcclHandle, ptr: int, count: int, dtype: int, peer: int,
             stream: int) -> None:
        self._do("ncclRecv", self._comm(h).recv, ptr, count, dtype, peer, stream)

    def allreduce(self, h: NcclHandle, sptr: int, rptr: int, count: int, dtype: int, op: int,
                  stream: int) -> None:
        self._do("ncclAllReduce", self._comm(h).allReduce, sptr, rptr, count, dtype, op, stream)

    def allgather(self, h: NcclHandle, sptr: int, rptr: int, sendcount: int, dtype: int,
                  stream: int) -> None:
        self._do("ncclAllGather", self._comm(h).allGather, sptr, rptr, sendcount, dtype, stream)

    def reducescatter(self, h: NcclHandle, sptr: int, rptr: int, recvcount: int, dtype: int,
                      op: int, stream: int) -> None:
        self._do("ncclReduceScatter", self._comm(h).reduceScatter, sptr, rptr, recvcount, dtype,
                 op, stream)

    def check(self, h: NcclHandle) -> None:
        self._do(f"NCCL communicator rank {h.rank}/{h.world}", self._comm(h).check_async_error)

    def abort(self, h: NcclHandle) -> None:
        comm, h.comm = h.comm, None
        if comm is not None:
            h.aborted = True
            comm.abort()

    def destroy(self, h: NcclHandle, deadline: float) -> None:
        comm, h.comm = h.comm, None
        if comm is not None:
            comm.destroy()


_LIBS: dict[tuple[str, bool], NcclLib] = {}
_LIBS_LOCK = threading.Lock()


def nccl_lib(binding: str | None = None, blocking: bool | None = None) -> NcclLib:
    """The process's NCCL binding: ``binding`` "ctypes" | "cupy" | "auto" (default from
    ``$CGC_NCCL_BINDING``, else "auto": ctypes when libnccl loads, else cupy);
    ``blocking`` (ctypes only; default ``$CGC_NCCL_BLOCKING == "1"``). Cached.

    Raises:
        SetupError: no NCCL binding can be loaded here.
    """
    binding = (binding or os.environ.get("CGC_NCCL_BINDING") or "auto").lower()
    if blocking is None:
        blocking = os.environ.get("CGC_NCCL_BLOCKING", "0") == "1"
    if binding not in ("auto", "ctypes", "cupy"):
        raise SetupError(f"unknown NCCL binding {binding!r} (use auto, ctypes or cupy)")
    key = (binding, bool(blocking))
    with _LIBS_LOCK:
        lib = _LIBS.get(key)
        if lib is not None:
            return lib
        errors = []
        for name in (("ctypes", "cupy") if binding == "auto" else (binding,)):
            try:
                lib = CtypesNccl(blocking=bool(blocking)) if name == "ctypes" else CupyNccl()
                break
            except (OSError, ImportError, AttributeError) as exc:
                errors.append(f"{name}: {exc}")
        if lib is None:
            raise SetupError("no NCCL here: " + "; ".join(errors))
        _LIBS[key] = lib
        return lib
