"""NCCL communicators: the device value protocol over NCCL (ctypes or cupy binding).

Set-up, per plan communicator with members ``m_0 .. m_{n-1}`` (rank = index):

1. rank 0 calls ``make_unique_id()`` (it hosts NCCL's bootstrap root, so it must live
   through every member's init) and the driver hands the 128 bytes to the others;
2. every member constructs ``NcclCommunicator(uid, rank, n, prefix=..., streams=...)``,
   each actor for its communicators **in plan order** (communicator id order): the
   constructor creates the side-channels, runs a barrier over them (every member alive;
   no NCCL call yet) and then NCCL's init, both within ``init_timeout``;
3. ``warm_up`` (module ``warmup``) makes a real 1-element transfer on every p2p pair.

Then SEND/RECV/COLL call ``send``/``recv``/``allreduce``/``allgather``/``reducescatter``
(see ``protocol.DeviceCommunicator``). ``abort()`` ends a hang from any
thread (``ncclCommAbort``); ``destroy()`` releases.

Example (one process, world size 1)::

    uid = make_unique_id()
    comm = NcclCommunicator(uid, 0, 1, prefix=unique_prefix, streams=actor_streams())
    y = comm.allreduce(torch.ones(4, device="cuda"), "sum")
    comm.destroy()
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from cgc.runtime.channels.errors import ChannelTimeoutError
from cgc.runtime.comm.collective import ReduceOp
from cgc.runtime.comm.device_protocol import DeviceCommunicator
from cgc.runtime.comm.nccl_lib import DTYPES, OPS, UINT8, NcclHandle, NcclLib, nccl_lib
from cgc.runtime.comm.sidechannel import SideChannels, SideFactory, exchange, open_side
from cgc.runtime.comm.transport import PostingTransport
from cgc.runtime.errors import SetupError
from cgc.runtime.gpu.streams import actor_streams
from cgc.runtime.gpu.tensors import TensorMeta, is_cuda_tensor, torch_dtype

__all__ = ["NcclTransport", "NcclCommunicator", "make_unique_id", "nccl_dtype"]


def make_unique_id(binding: str | None = None) -> bytes:
    """A new NCCL unique id (128 bytes), made on the rank-0 member (see module doc).

    Raises:
        SetupError: no NCCL binding loads here.
    """
    return nccl_lib(binding).unique_id()


def nccl_dtype(dtype: str, op: ReduceOp | None) -> tuple[int, str | None, str | None]:
    """(ncclDataType_t, how to view the tensor first, why impossible) for a reduction.

    Views: "u8" (bool as uint8), "real" (complex as its float pairs).

    Example:
        >>> nccl_dtype("bool", ReduceOp.MAX)[:2]
        (1, 'u8')
    """
    if dtype == "bool":
        return DTYPES["uint8"], "u8", None  # MAX = or, MIN/PRODUCT = and; SUM runs as MAX
    if dtype in ("complex64", "complex128"):
        base = "float32" if dtype == "complex64" else "float64"
        if op not in (None, ReduceOp.SUM):
            return 0, None, f"NCCL has no {op.word} of complex numbers"
        return DTYPES[base], "real", None
    if dtype not in DTYPES:
        return 0, None, f"NCCL has no {dtype} type"
    return DTYPES[dtype], None, None


class NcclTransport(PostingTransport):
    """Flat-byte NCCL ops of one rank on the actor's comm stream."""

    def __init__(self, lib: NcclLib, handle: NcclHandle, rank: int, world_size: int,
                 streams: Any) -> None:
        self.lib, self.h = lib, handle
        self.rank, self.world_size = rank, world_size
        self.streams = streams
        self._stream = streams.comm.cuda_stream
        self._device = streams.device

    def is_device(self, obj: Any) -> bool:
        return is_cuda_tensor(obj)

    def empty(self, meta: TensorMeta) -> Any:
        import torch

        return torch.empty(meta.shape, dtype=torch_dtype(meta.dtype), device=self._device)

    def p2p(self, sends: Sequence[tuple[Any, int]], recvs: Sequence[tuple[Any, int]]) -> None:
        lib, h, s = self.lib, self.h, self._stream
        lib.group_start()
        try:
            for buf, peer in sends:
                lib.send(h, buf.data_ptr(), buf.numel(), UINT8, peer, s)
            for buf, peer in recvs:
                lib.recv(h, buf.data_ptr(), buf.numel(), UINT8, peer, s)
        finally:
            lib.group_end(h)

    def _typed(self, t: Any, op: ReduceOp | None) -> tuple[Any, int, int]:
        import torch

        dt = str(t.dtype).removeprefix("torch.")
        code, view, why = nccl_dtype(dt, op)
        if why:
            raise TypeError(why)
        if view == "u8":
            t = t.view(torch.uint8)
            if op is ReduceOp.SUM:
                op = ReduceOp.MAX  # torch's sum of booleans is a logical or
        elif view == "real":
            t = torch.view_as_real(t)
        return t, code, OPS[op.word] if op is not None else 0

    def allreduce(self, send: Any, recv: Any, op: ReduceOp) -> None:
        s, code, o = self._typed(send, op)
        r, _, _ = self._typed(recv, op)
        self.lib.allreduce(self.h, s.data_ptr(), r.data_ptr(), s.numel(), code, o, self._stream)

    def allgather(self, send: Any, recv: Any) -> None:
        self.lib.allgather(self.h, send.data_ptr(), recv.data_ptr(), send.numel(), UINT8,
                           self._stream)

    def reducescatter(self, send: Any, recv: Any, op: ReduceOp) -> None:
        s, code, o = self._typed(send, op)
        r, _, _ = self._typed(recv, op)
        self.lib.reducescatter(self.h, s.data_ptr(), r.data_ptr(), r.numel(), code, o,
                               self._stream)

    def unsupported(self, dtype: str, op: ReduceOp | None) -> str | None:
        return nccl_dtype(dtype, op)[2] if op is not None else None

    def check(self) -> None:
        if self.h.comm is not None:
            self.lib.check(self.h)

    def abort(self) -> None:
        self.lib.abort(self.h)

    def destroy(self, linger: float = 2.0) -> None:
        self.lib.destroy(self.h, time.monotonic() + 10.0)


class NcclCommunicator(DeviceCommunicator):
    """Rank ``rank`` of an NCCL communicator (see module doc for the set-up order).

    Args:
        unique_id: the 128 bytes from ``make_unique_id()`` on rank 0.
        rank, world_size: this member's rank and the group size.
        prefix: unique name prefix for the side-channels (from the runtime); or pass
            ``side`` / ``side_factory`` (e.g. TCP side-channels across nodes).
        streams: the actor's ``ActorStreams`` (default: a new one on the current device).
        binding: "ctypes" | "cupy" | "auto" (see ``nccl_lib``); the same on every member.
        blocking: ctypes only: blocking communicators (faster ops, unabortable init).
        init_timeout: seconds for the barrier plus NCCL's init.
        timeout: default for calls that pass ``timeout=None`` (None: until aborted).
        name: shown in errors, e.g. "communicator 0 (w0, w1)".

    Raises:
        SetupError: a member did not arrive, or NCCL's init missed its deadline (it was
            aborted, or - blocking bindings - left behind; see ``nccl_lib``).
        NcclError: NCCL failed (e.g. two ranks on one GPU without the fake-hosts mode).
    """

    def __init__(self, unique_id: bytes, rank: int, world_size: int, *,
                 prefix: str | None = None, side: SideChannels | None = None,
                 side_factory: SideFactory | None = None, streams: Any = None,
                 binding: str | None = None, blocking: bool | None = None,
                 init_timeout: float = 60.0, timeout: float | None = None,
                 name: str = "") -> None:
        name = name or f"NCCL communicator (rank {rank} of {world_size})"
        side = open_side(side, side_factory, prefix, rank, world_size, name,
                         attach_timeout=max(init_timeout, 1.0))
        deadline = time.monotonic() + init_timeout
        try:
            lib = nccl_lib(binding, blocking)
            streams = streams if streams is not None else actor_streams()
            if not getattr(streams, "is_cuda", False):
                raise SetupError(f"{name}: NCCL needs CUDA on this actor (no GPU visible)")
            # The barrier: every member alive and about to init, or a clear error before
            # any NCCL call (a blocking init with a missing member could never be ended).
            try:
                words = exchange(side, ("nccl-init", lib.name, world_size), init_timeout)
            except ChannelTimeoutError:
                raise SetupError(f"{name}: not every member reached NCCL init within "
                                 f"{init_timeout} s (no NCCL call was made)") from None
            for r, w in enumerate(words):
                if w != words[side.rank]:
                    raise SetupError(f"{name}: rank {r} initialises {w}, rank {side.rank} "
                                     f"{words[side.rank]} (bindings or sizes differ)")
            handle = lib.init(world_size, unique_id, rank, deadline,
                              device=streams.device.index)
        except BaseException:
            side.close(linger=0)
            raise
        super().__init__(NcclTransport(lib, handle, rank, world_size, streams), side,
                         streams, name=name, timeout=timeout)
        self.binding = lib.name
