"""The device value protocol over a ``torch.distributed`` process group the user already has.

``TorchDistCommunicator(group, prefix=...)`` is rank ``dist.get_rank(group)`` of the
group: the same headers, static-edge receives posted first, error values and collective
status words as ``NcclCommunicator`` (``protocol.DeviceCommunicator``), with the bytes
moved by torch (``batch_isend_irecv``, ``all_reduce``, ``all_gather_into_tensor``,
``reduce_scatter_tensor``) issued while the actor's comm stream is
current, so ProcessGroupNCCL orders them after the comm stream and makes the comm stream
(not the CPU) wait for them. Communicator rank ``r`` is group rank ``r``.

The group is the user's: ``destroy()`` leaves it alive; ``abort()`` calls its ``abort()``
where torch has one (the group is unusable afterwards, as after any NCCL abort). Timeouts
of the device ops are the group's own (its ``timeout=`` at creation).

With a gloo group, CPU torch tensors play the device tensors (``is_device`` defaults to
"any torch tensor" for gloo), which is how the CPU tests exercise this class.

Example::

    dist.init_process_group("nccl", ...)
    comm = TorchDistCommunicator(dist.group.WORLD, prefix=unique_prefix,
                                 streams=actor_streams())
    comm.send(torch.ones(4, device="cuda"), peer=1)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from cgc.runtime.comm.collective import ReduceOp, scatter_part
from cgc.runtime.comm.device_protocol import CommStreams, DeviceCommunicator
from cgc.runtime.comm.nccl import nccl_dtype
from cgc.runtime.comm.sidechannel import SideChannels, SideFactory, open_side
from cgc.runtime.comm.transport import PostingTransport
from cgc.runtime.gpu.streams import NullStreams, actor_streams
from cgc.runtime.gpu.tensors import TensorMeta, cpu_stand_in, is_cuda_tensor, torch_dtype

__all__ = ["TorchDistTransport", "TorchDistCommunicator"]


class TorchDistTransport(PostingTransport):
    """Bytes through a torch.distributed group (see module doc)."""

    def __init__(self, group: Any, streams: CommStreams,
                 is_device: Callable[[Any], bool] | None = None) -> None:
        import torch.distributed as dist

        self._dist = dist
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.backend = str(dist.get_backend(group)).lower()
        self._global = [dist.get_global_rank(group, r) if group is not None else r
                        for r in range(self.world_size)]
        self.streams = streams
        self._is_device = is_device or (is_cuda_tensor if self.backend == "nccl"
                                        else cpu_stand_in)
        self._device = getattr(streams, "device", None)
        self._ops = {ReduceOp.SUM: dist.ReduceOp.SUM, ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT,
                     ReduceOp.MAX: dist.ReduceOp.MAX, ReduceOp.MIN: dist.ReduceOp.MIN}

    def is_device(self, obj: Any) -> bool:
        return self._is_device(obj)

    def empty(self, meta: TensorMeta) -> Any:
        import torch

        kw = {"device": self._device} if self._device is not None else {}
        return torch.empty(meta.shape, dtype=torch_dtype(meta.dtype), **kw)

    def p2p(self, sends: Sequence[tuple[Any, int]], recvs: Sequence[tuple[Any, int]]) -> None:
        dist = self._dist
        ops = [dist.P2POp(dist.isend, buf, self._global[peer], self.group)
               for buf, peer in sends]
        ops += [dist.P2POp(dist.irecv, buf, self._global[peer], self.group)
                for buf, peer in recvs]
        if not ops:
            return
        with self.streams.comm_context():
            for w in dist.batch_isend_irecv(ops):
                w.wait()  # NCCL: the current (comm) stream waits, not the CPU

    def allreduce(self, send: Any, recv: Any, op: ReduceOp) -> None:
        with self.streams.comm_context():
            recv.copy_(send)
            self._dist.all_reduce(recv, op=self._ops[op], group=self.group)

    def allgather(self, send: Any, recv: Any) -> None:
        with self.streams.comm_context():
            try:
                self._dist.all_gather_into_tensor(recv, send, group=self.group)
            except (RuntimeError, NotImplementedError):  # backends without it (old gloo)
                self._dist.all_gather(list(recv.chunk(self.world_size)), send,
                                      group=self.group)

    def reducescatter(self, send: Any, recv: Any, op: ReduceOp) -> None:
        with self.streams.comm_context():
            if self.backend == "nccl":
                self._dist.reduce_scatter_tensor(recv, send, op=self._ops[op], group=self.group)
                return
            full = send.clone()  # gloo has no reduce-scatter: allreduce, keep our chunk
            self._dist.all_reduce(full, op=self._ops[op], group=self.group)
            recv.copy_(scatter_part(full, self.rank, self.world_size))

    def unsupported(self, dtype: str, op: ReduceOp | None) -> str | None:
        if self.backend == "nccl" and op is not None:
            return nccl_dtype(dtype, op)[2]
        return None

    def abort(self) -> None:
        abort = getattr(self.group, "abort", None)
        if abort is not None:
            try:
                abort()
            except Exception:  # noqa: BLE001 - best effort: the group may be gone already
                pass

    def destroy(self, linger: float = 2.0) -> None:
        return None  # the group belongs to the user


class TorchDistCommunicator(DeviceCommunicator):
    """This process's rank of ``group`` as a cgc communicator (see module doc).

    Args:
        group: a torch.distributed process group (None: the default group).
        prefix / side / side_factory: the side-channels (as for ``NcclCommunicator``).
        streams: the actor's ``ActorStreams`` (default: one on the current device for an
            NCCL group, ``NullStreams`` otherwise).
        is_device: which objects move through the group (default by backend).
        timeout: default for calls that pass ``timeout=None``.
    """

    def __init__(self, group: Any = None, *, prefix: str | None = None,
                 side: SideChannels | None = None, side_factory: SideFactory | None = None,
                 streams: CommStreams | None = None,
                 is_device: Callable[[Any], bool] | None = None, timeout: float | None = None, name: str = "") -> None:
        import torch.distributed as dist

        if group is None:
            group = dist.group.WORLD
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        if streams is None:
            streams = (actor_streams() if str(dist.get_backend(group)).lower() == "nccl"
                       else NullStreams())
        side = open_side(side, side_factory, prefix, rank, world, "TorchDistCommunicator")
        super().__init__(TorchDistTransport(group, streams, is_device), side, streams,
                         name=name or f"torch.distributed communicator (rank {rank} of {world})",
                         timeout=timeout)
