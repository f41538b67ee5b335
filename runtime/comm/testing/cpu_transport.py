"""A CPU device transport: the protocol of device communicators, run in CI without a GPU.

``ShmCpuTransport`` implements ``transport.PostingTransport`` with CPU torch tensors standing
in for device tensors and one shared-memory ring per ordered pair of ranks
(``<prefix>d<src>-<dst>``) carrying their bytes. Device ops become blocking ring reads and
writes in call order, so ``DeviceCommunicator`` - headers, static-edge receives posted
before the header, error values, status words before collectives, abort - runs the same
code as over NCCL. It is a test transport, not a production path (the CPU communicator is).

Example (two ranks in two threads)::

    comms = [cpu_device_communicator(prefix, r, 2) for r in (0, 1)]
    # thread 0: comms[0].send({"x": torch.ones(3)}, 1)
    # thread 1: comms[1].recv(0) -> {"x": tensor([1., 1., 1.])}
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cgc.runtime.channels.errors import ChannelClosedError
from cgc.runtime.comm.collective import ReduceOp
from cgc.runtime.comm.device_protocol import DeviceCommunicator
from cgc.runtime.comm.ring_mesh import RingMesh
from cgc.runtime.comm.sidechannel import ShmSideChannels
from cgc.runtime.comm.transport import GatheringTransport, PostingTransport
from cgc.runtime.gpu.streams import NullStreams
from cgc.runtime.gpu.tensors import TensorMeta, cpu_stand_in, torch_dtype

__all__ = ["ShmCpuTransport", "cpu_device_communicator"]


class ShmCpuTransport(GatheringTransport, PostingTransport):
    """Rank ``rank`` of a CPU stand-in transport (see module doc).

    Args:
        prefix: unique name prefix for the data rings (from the caller).
        timeout: how long a blocking ring op may wait (device ops take no timeout).
    """

    def __init__(self, prefix: str, rank: int, world_size: int, *, slots: int = 8,
                 slot_bytes: int = 64 * 1024, timeout: float | None = 60.0,
                 attach_timeout: float = 60.0) -> None:
        self._mesh = RingMesh(prefix, "d", rank, world_size, slots=slots,
                              slot_bytes=slot_bytes, attach_timeout=attach_timeout)
        self.prefix, self.rank, self.world_size = prefix, rank, world_size
        self.timeout = timeout
        self._out = self._mesh.out  # peer -> our ring to it
        self._aborted = False
        self.ops: list[tuple[str, Any]] = []  # what ran, for tests: ("send", peer), ...

    def is_device(self, obj: Any) -> bool:
        return cpu_stand_in(obj)

    def empty(self, meta: TensorMeta) -> Any:
        import torch

        return torch.empty(meta.shape, dtype=torch_dtype(meta.dtype))

    def _write(self, peer: int, buf: Any) -> None:
        if self._aborted:
            raise ChannelClosedError(f"cpu transport rank {self.rank} was aborted")
        self._mesh.reader(peer)  # attach before writing (see ShmSideChannels.send)
        self._out[peer].write(buf.numpy(), self.timeout)

    def _read_into(self, peer: int, buf: Any) -> None:
        if self._aborted:
            raise ChannelClosedError(f"cpu transport rank {self.rank} was aborted")
        arr = self._mesh.reader(peer).read(self.timeout)
        if arr.nbytes != buf.numel() * buf.element_size():
            raise ValueError(f"cpu transport: rank {peer} sent {arr.nbytes} bytes, rank "
                             f"{self.rank} posted {buf.numel() * buf.element_size()}")
        buf.view(-1).numpy()[:] = arr.view(buf.numpy().dtype).reshape(-1)

    def p2p(self, sends: Sequence[tuple[Any, int]], recvs: Sequence[tuple[Any, int]]) -> None:
        # A group's sends never wait on its receives here (rings buffer them), so sends
        # first, then receives, is a valid order for any group.
        for buf, peer in sends:
            self.ops.append(("send", peer))
            self._write(peer, buf)
        for buf, peer in recvs:
            self.ops.append(("recv", peer))
            self._read_into(peer, buf)

    def _gather(self, send: Any) -> list[Any]:
        for p in range(self.world_size):
            if p != self.rank:
                self._write(p, send)
        parts = []
        for p in range(self.world_size):
            if p == self.rank:
                parts.append(send.clone())
            else:
                t = send.new_empty(send.shape)
                self._read_into(p, t)
                parts.append(t)
        return parts

    def allreduce(self, send: Any, recv: Any, op: ReduceOp) -> None:
        self.ops.append(("allreduce", op.word))
        super().allreduce(send, recv, op)

    def allgather(self, send: Any, recv: Any) -> None:
        self.ops.append(("allgather", None))
        super().allgather(send, recv)

    def reducescatter(self, send: Any, recv: Any, op: ReduceOp) -> None:
        self.ops.append(("reducescatter", op.word))
        super().reducescatter(send, recv, op)

    def abort(self) -> None:
        self._aborted = True
        self._mesh.poison()

    def destroy(self, linger: float = 2.0) -> None:
        self._mesh.close(linger)


def cpu_device_communicator(prefix: str, rank: int, world_size: int, *,
                            timeout: float | None = 60.0, **side_kw: Any) -> DeviceCommunicator:
    """A ``DeviceCommunicator`` over ``ShmCpuTransport`` and ``ShmSideChannels`` (names
    ``<prefix>h..`` and ``<prefix>d..``), for CPU tests of the device protocol."""
    side = ShmSideChannels(prefix, rank, world_size, **side_kw)
    tr = ShmCpuTransport(prefix, rank, world_size, timeout=timeout)
    return DeviceCommunicator(tr, side, NullStreams(), name=f"cpu-stand-in {prefix}",
                              timeout=timeout)
