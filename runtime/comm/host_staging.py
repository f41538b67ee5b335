"""Host staging: device tensors through a host communicator, via pinned memory.

For communicators whose members NCCL and CUDA IPC cannot serve together (some members
without a GPU, or some sharing a GPU and some not), ``HostStagingCommunicator`` wraps a
host communicator (the CPU communicator) and moves every CUDA tensor of a value through
pinned host memory:

- send: the CUDA tensors are copied into pinned buffers on the comm stream (after it
  waited for the compute stream), the CPU waits for that copy (a host transport needs the
  bytes - the one CPU wait of this path, counted in ``SYNC_COUNTER``), and the value
  travels as a ``StagedValue`` (skeleton + CPU tensors) through the inner communicator;
- recv: the CPU tensors are copied into pinned buffers and uploaded with non-blocking
  copies on the comm stream (torch's pinned-memory cache keeps each buffer until its copy
  is done); members without CUDA keep them as CPU tensors, as CPU runs of GPU plans do;
- collectives: every member's staged value through the inner ``allgather``, then the
  reduction on the host (errors and host values as on the CPU communicator), and the
  result uploaded where the member's own input was on a GPU.

Never ``.cpu()`` on pageable memory: pinned staging measured 2.45 ms for a 64 MiB round
trip against 54 ms pageable (design note).

Example::

    inner = CpuCommunicator(prefix, rank, world)
    comm = HostStagingCommunicator(inner, streams=actor_streams())
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cgc.runtime.channels.errors import ErrorValue
from cgc.runtime.comm.interface import Communicator, ExchangingCommunicator
from cgc.runtime.gpu.streams import actor_streams, wait_event
from cgc.runtime.gpu.tensors import cpu_stand_in, is_cuda_tensor, rebuild_value, split_value

__all__ = ["StagedValue", "HostStagingCommunicator"]


class StagedValue:
    """A value whose CUDA tensors were replaced by CPU copies (``tensors``)."""

    __slots__ = ("skeleton", "tensors")

    def __init__(self, skeleton: bytes | None, tensors: list[Any]) -> None:
        self.skeleton = skeleton
        self.tensors = tensors

    def __reduce__(self) -> tuple[Any, ...]:
        return (StagedValue, (self.skeleton, self.tensors))


class HostStagingCommunicator(ExchangingCommunicator):
    """Device values over host communicator ``inner`` (see module doc)."""

    def __init__(self, inner: Communicator, streams: Any = None,
                 timeout: float | None = None) -> None:
        self.inner = inner
        self.rank, self.world_size = inner.rank, inner.world_size
        self.streams = streams if streams is not None else actor_streams()
        self.cuda = bool(getattr(self.streams, "is_cuda", False))
        self.timeout = timeout
        self.last_event: Any = None

    # ---------------------------------------------------------------- staging
    def _down(self, value: Any, timeout: float | None) -> tuple[Any, bool]:
        """(what to hand to ``inner``, whether ``value`` held CUDA tensors)."""
        if not self.cuda or type(value) is ErrorValue:
            return value, False
        skeleton, tensors = split_value(value, is_cuda_tensor)
        if not tensors:
            return value, False
        import torch

        self.streams.comm_after_compute()
        hosts = []
        with self.streams.comm_context():
            for t in tensors:
                h = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                h.copy_(t.detach(), non_blocking=True)
                hosts.append(h)
        ev = self.streams.comm_done()
        assert ev is not None  # a CUDA stream set always gives an event
        wait_event(ev.query, timeout, None, "host staging download")
        return StagedValue(skeleton, hosts), True

    def _host(self, value: Any) -> Any:
        """A received value with staged tensors as CPU tensors."""
        if isinstance(value, StagedValue):
            return rebuild_value(value.skeleton, value.tensors)
        return value

    def _upload(self, tensors: list[Any]) -> list[Any]:
        """CPU ``tensors`` uploaded to this member's GPU (non-blocking, on the comm stream)."""
        import torch

        outs = []
        with self.streams.comm_context():
            for t in tensors:
                pinned = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                pinned.copy_(t)  # a host memcpy; the upload below is asynchronous
                outs.append(pinned.to(self.streams.device, non_blocking=True))
        ev = self.streams.comm_done()
        self.last_event = ev
        self.streams.mark_compute_use(outs)
        self.streams.received(ev)
        return outs

    def _up(self, value: Any) -> Any:
        """``value`` (a collective's host result) with its CPU tensors uploaded."""
        skeleton, tensors = split_value(value, cpu_stand_in)
        return rebuild_value(skeleton, self._upload(tensors)) if tensors else value

    def _t(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is None else timeout

    # ---------------------------------------------------------------- p2p
    def send(self, value: Any, peer: int, timeout: float | None = None, *,
             shape: Any = None, dtype: Any = None) -> None:
        """Stage ``value`` to the host and send it through ``inner`` (rendezvous as
        ``inner``)."""
        staged, _ = self._down(value, self._t(timeout))
        self.inner.send(staged, peer, self._t(timeout))

    def recv(self, peer: int, shape: Any = None, dtype: Any = None,
             timeout: float | None = None) -> Any:
        """The next value from ``peer``, its tensors uploaded to this member's GPU."""
        v = self.inner.recv(peer, timeout=self._t(timeout))
        if not isinstance(v, StagedValue):
            return v
        tensors = self._upload(v.tensors) if self.cuda else v.tensors
        return rebuild_value(v.skeleton, tensors)

    # ---------------------------------------------------------------- collectives
    def _exchanged(self, tag: str, value: Any, timeout: float | None,
                   finish: Callable[[list[Any]], Any]) -> Any:
        t = self._t(timeout)
        staged, on_gpu = self._down(value, t)
        got = self.inner.allgather(staged, timeout=t)
        if type(got) is ErrorValue:
            return got
        parts = [self._host(p) for p in got]
        result = finish(parts)
        return self._up(result) if on_gpu else result

    def warm_up(self, peers: Any, timeout: float | None = 60.0,
                collective: bool = False) -> None:
        """Nothing to warm beyond the inner communicator's own rings."""

    def destroy(self, linger: float = 2.0) -> None:
        """Destroy the inner communicator."""
        self.inner.destroy(linger)

    def abort(self) -> None:
        """End waits now: the inner communicator's destroy without lingering."""
        self.inner.destroy(0.0)
