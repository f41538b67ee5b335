"""CUDA IPC: device values between actors that share one GPU, as a device transport.

NCCL refuses two ranks on one device, so actors placed on the same GPU (``num_gpus=0.5``)
move tensors through buffers one process exports and the other maps. ``IpcTransport`` is
a ``DescribingTransport`` (see ``transport``): ``CudaIpcCommunicator`` is the
one device protocol (``protocol.DeviceCommunicator``: headers, errors as values, static
edges, collective agreement) over it, as ``NcclCommunicator`` is over NCCL.

Per ordered pair writer -> reader, set up at the first transfer (or ``warm_up``):

- the writer allocates ``slots`` buffers with ``cudaMalloc`` - *outside* torch's caching
  allocator, because an IPC handle names a whole allocation - plus ``slots`` interprocess
  events, and sends their handles once ("hello");
- the reader opens them once (``cudaIpcOpenMemHandle`` / ``cudaIpcOpenEventHandle``),
  creates ``slots`` interprocess events of its own and sends their handles back.

Per value with tensors (use ``n`` of the pair, slot ``k = n % slots``):

1. writer (``reserve``, ``put``): once use ``n - slots`` is acknowledged, its comm stream
   waits on the reader's event ``k`` (the reader's copy out of slot ``k`` is done: no CPU
   wait); the protocol makes the comm stream wait for the compute stream; each buffer is
   copied into slot ``k`` (offsets aligned to 256 bytes) and writer event ``k`` recorded;
   the protocol writes the header with ``ext = (n, k, offsets, generation, new handle or
   None)`` (what ``put`` returns);
2. reader (``expect``, ``take``): after the header, its comm stream waits on writer event
   ``k``; the protocol allocates the tensors; each is copied out, the reader records its
   own event ``k`` and sends the acknowledgement ``(n, k, generation)`` - without waiting
   for the copy: the writer waits on the reader's event on the device before it reuses
   the slot.

So ``send`` returns once the header is written and blocks only when the reader is
``slots`` values behind (NCCL's CPU semantics). A value larger than its slot grows that
slot (rare): the writer allocates a bigger buffer, sends its handle in ``ext`` with the
next generation and keeps the old buffer until the reader acknowledges the new generation
(the reader first waits for its own last copy from the old mapping - a counted CPU wait -
then closes it).

The transport's own messages (hello, hello-ack, acknowledgements, and the descriptions of
collective contributions) share each ordered pair's side-channel FIFO with the protocol's
headers (``sidechannel.SharedSide`` sorts them by kind): an acknowledgement reaches the
writer while it waits for the protocol's next message anyway, off its next send's path
(on rings of their own it was read inside the next send: measured 5-7 µs a hop).
Collectives gather every rank's input over the same slots and reduce on the comm stream
(``GatheringTransport``): on one GPU the N-fold copies run at device-memory bandwidth.

The device calls go through an ``IpcDevice`` (``cgc.runtime.comm.cuda_ipc_devices``):
``CudaIpcDevice`` (cupy.cuda.runtime) on GPUs, ``testing.shm_ipc_device.ShmIpcDevice``
(shared-memory segments, synchronous copies) in CPU tests.

Example::

    comm = CudaIpcCommunicator(rank, 2, prefix=unique_prefix, streams=actor_streams())
    comm.send(torch.ones(1 << 20, device="cuda"), peer=1)      # on rank 0
    x = comm.recv(peer=0)                                      # on rank 1
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

from cgc.runtime.channels.errors import ChannelClosedError, ChannelError
from cgc.runtime.comm.cuda_ipc_devices import CudaIpcDevice, IpcDevice
from cgc.runtime.comm.device_protocol import CommStreams, DeviceCommunicator
from cgc.runtime.comm.sidechannel import (
    SharedSide,
    SideChannels,
    SideFactory,
    SideKind,
    open_side,
)
from cgc.runtime.comm.transport import DescribingTransport, GatheringTransport
from cgc.runtime.gpu.streams import actor_streams
from cgc.runtime.gpu.tensors import TensorMeta, is_cuda_tensor, torch_dtype

__all__ = ["IpcTransport", "CudaIpcCommunicator"]

_ALIGN = 256
# The transport's messages: kind -> tuple length. Sent as plain strings (an enum member
# pickles as a class reference, and its attribute costs ~0.5 µs a lookup on the value path).
_HELLO, _HELLO_ACK, _ACK, _DESC = (SideKind.HELLO.value, SideKind.HELLO_ACK.value,
                                   SideKind.ACK.value, SideKind.DESC.value)
_ARITY = {_HELLO: 4, _HELLO_ACK: 2, _ACK: 4, _DESC: 2}


def _align(n: int) -> int:
    return (n + _ALIGN - 1) & ~(_ALIGN - 1)


def _grow(cap: int, need: int) -> int:
    cap = max(cap, 1 << 16)
    while cap < need:
        cap *= 2
    return cap


class _Out:
    """Writer side of one pair."""

    def __init__(self) -> None:
        self.bufs: list[list[Any]] = []  # per slot: [ptr, capacity, generation, handle]
        self.events: list[tuple[Any, bytes]] = []
        self.peer_events: list[Any] | None = None
        self.n = 0  # uses sent
        self.acked = 0  # uses acknowledged
        self.retired: list[tuple[int, int, int]] = []  # (slot, generation, ptr)


class _In:
    """Reader side of one pair."""

    def __init__(self) -> None:
        self.maps: list[list[int]] = []  # per slot: [ptr, generation, capacity]
        self.events: list[Any] = []  # the writer's, opened here
        self.own: list[tuple[Any, bytes]] = []
        self.n = 0  # uses received
        self.expected: tuple[int, int, tuple[int, ...]] | None = None  # (n, k, offsets)


class IpcTransport(GatheringTransport, DescribingTransport):
    """Rank ``rank`` of a CUDA IPC transport (see module doc).

    Args:
        side: the side-channels it shares with the protocol (``SharedSide``).
        streams: the actor's ``ActorStreams`` (``NullStreams`` with ``ShmIpcDevice``).
        device: the ``IpcDevice``.
        slots, slot_bytes: values a writer may be ahead on one pair; initial slot size.
        timeout: how long the waits inside a collective may take (None: until aborted).
        is_device: which objects move as device tensors.
    """

    def __init__(self, rank: int, world_size: int, *, side: SharedSide, streams: CommStreams,
                 device: IpcDevice, slots: int = 2, slot_bytes: int = 1 << 20,
                 timeout: float | None = None,
                 is_device: Callable[[Any], bool] = is_cuda_tensor, name: str = "") -> None:
        self.rank, self.world_size = rank, world_size
        self.side, self.streams, self.dev = side, streams, device
        self._stream = streams.comm.cuda_stream if streams.comm is not None else 0
        dev = streams.device
        self._empty_kw = {"device": dev} if dev is not None else {}
        self.slots = max(1, int(slots))
        self.slot_bytes = max(_ALIGN, int(slot_bytes))
        self.timeout = timeout
        self.name = name or f"CUDA IPC transport (rank {rank} of {world_size})"
        self.is_device = is_device  # type: ignore[method-assign,assignment] # no layer
        self._out: dict[int, _Out] = {}
        self._in: dict[int, _In] = {}
        self._aborted = False

    def is_device(self, obj: Any) -> bool:  # the default; __init__ puts the test given in its place
        return is_cuda_tensor(obj)

    def empty(self, meta: TensorMeta) -> Any:
        return torch.empty(meta.shape, dtype=torch_dtype(meta.dtype), **self._empty_kw)

    # ---------------------------------------------------------------- plumbing
    def _poll(self) -> None:
        if self._aborted:
            raise ChannelClosedError(f"{self.name}: rank {self.rank} was aborted")

    def _next(self, peer: int, kind: str, timeout: float | None,
              poll: Callable[[], None] | None = None) -> tuple:
        """The next transport message of ``kind`` from ``peer`` (others are queued)."""
        msg = self.side.recv_kind(peer, kind, timeout, poll or self._poll)
        if len(msg) != _ARITY[kind]:
            raise ChannelError(f"{self.name}: rank {peer} sent a malformed {kind} message")
        return msg

    def _context(self) -> contextlib.AbstractContextManager[Any]:
        return self.streams.comm_context()

    # ---------------------------------------------------------------- set-up of a pair
    def _connect_out(self, peer: int, timeout: float | None) -> _Out:
        o = self._out.get(peer)
        if o is not None:
            return o
        o = _Out()
        for _ in range(self.slots):
            ptr, handle = self.dev.alloc(self.slot_bytes)
            o.bufs.append([ptr, self.slot_bytes, 0, handle])
        o.events = [self.dev.new_event() for _ in range(self.slots)]
        self._out[peer] = o
        self.side.send(peer, (_HELLO, self.slots, [(b[3], b[1]) for b in o.bufs],
                                 [h for _, h in o.events]), timeout)
        return o

    def _connect_in(self, peer: int, timeout: float | None,
                    poll: Callable[[], None] | None = None) -> _In:
        i = self._in.get(peer)
        if i is not None:
            return i
        _, slots, handles, ev_handles = self._next(peer, _HELLO, timeout, poll)
        if slots != len(handles) or slots != len(ev_handles) or slots < 1:
            raise ChannelError(f"{self.name}: bad IPC hello from rank {peer}")
        i = _In()
        i.maps = [[self.dev.open(h), 0, int(cap)] for h, cap in handles]
        i.events = [self.dev.open_event(h) for h in ev_handles]
        i.own = [self.dev.new_event() for _ in range(slots)]
        self._in[peer] = i
        self.side.send(peer, (_HELLO_ACK, [h for _, h in i.own]), timeout)
        return i

    def _peer_events(self, o: _Out, peer: int, timeout: float | None,
                     poll: Callable[[], None] | None = None) -> list[Any]:
        if o.peer_events is None:
            _, handles = self._next(peer, _HELLO_ACK, timeout, poll)
            if len(handles) != self.slots:
                raise ChannelError(f"{self.name}: bad IPC hello-ack from rank {peer}")
            o.peer_events = [self.dev.open_event(h) for h in handles]
        return o.peer_events

    def _await_ack(self, o: _Out, peer: int, use: int, timeout: float | None,
                   poll: Callable[[], None]) -> None:
        """Take acknowledgements until use ``use`` of the pair is acknowledged."""
        self._peer_events(o, peer, timeout, poll)
        while o.acked <= use:
            _, n, k, gen = self._next(peer, _ACK, timeout, poll)
            if n != o.acked:
                raise ChannelError(f"{self.name}: rank {peer} acknowledged use {n}, "
                                   f"expected {o.acked}")
            o.acked += 1
            if o.retired:
                keep = []
                for slot, g, ptr in o.retired:
                    if slot == k and g < gen:
                        self.dev.free(ptr)  # the reader closed it and its copies finished
                    else:
                        keep.append((slot, g, ptr))
                o.retired = keep

    def connect(self, peers: Sequence[int], timeout: float | None) -> None:
        """Exchange handles with every rank in ``peers``, both directions (all sends
        first, then all reads: deadlock-free)."""
        for p in peers:
            self._connect_out(p, timeout)
        for p in peers:
            self._connect_in(p, timeout)
        for p in peers:
            self._peer_events(self._out[p], p, timeout)

    # ---------------------------------------------------------------- writer
    def reserve(self, peer: int, timeout: float | None, poll: Callable[[], None]) -> None:
        o = self._connect_out(peer, timeout)
        n = o.n
        if n >= self.slots:
            self._await_ack(o, peer, n - self.slots, timeout, poll)
            # the reader's copy out of this slot is done (a device-side wait)
            self.dev.wait(self._stream, o.peer_events[n % self.slots])  # type: ignore[index]

    def put(self, peer: int, bufs: Sequence[Any]) -> Any:
        o = self._out[peer]  # reserve() connected it
        n, k, dev = o.n, o.n % self.slots, self.dev
        sizes = [b.numel() * b.element_size() for b in bufs]
        offsets, total = [], 0
        for nb in sizes:
            offsets.append(total)
            total = _align(total + nb)
        ptr, cap, gen, _h = o.bufs[k]
        new = None
        if total > cap:
            o.retired.append((k, gen, ptr))
            cap = _grow(cap, total)
            ptr, handle = dev.alloc(cap)
            gen += 1
            o.bufs[k] = [ptr, cap, gen, handle]
            new = (handle, cap)
        for b, off, nb in zip(bufs, offsets, sizes, strict=True):
            if nb:
                dev.copy(ptr + off, b.data_ptr(), nb, self._stream)
        dev.record(o.events[k][0], self._stream)
        o.n = n + 1
        return (n, k, tuple(offsets), gen, new)

    # ---------------------------------------------------------------- reader
    def expect(self, peer: int, ext: Any, timeout: float | None,
               poll: Callable[[], None]) -> None:
        if ext is None:  # the protocol asks only for headers with tensors
            raise ChannelError(f"{self.name}: rank {peer}'s header described no bytes")
        i = self._connect_in(peer, timeout, poll)
        i.expected = None
        try:
            n, k, offsets, gen, new = ext
            n, k, gen = int(n), int(k), int(gen)
            offsets = tuple(map(int, offsets))
        except (TypeError, ValueError):
            raise ChannelError(f"{self.name}: rank {peer} sent a malformed description "
                               "of its bytes") from None
        if n != i.n or not 0 <= k < len(i.maps):
            raise ChannelError(f"{self.name}: rank {peer} sent use {n} slot {k}, expected "
                               f"use {i.n}")
        i.n = n + 1
        dev = self.dev
        if new is not None:
            # The slot grew: our last copy from the old mapping must finish before we close
            # it (rare; a CPU wait), then map the new buffer.
            dev.sync_event(i.own[k][0])
            dev.close(i.maps[k][0])
            i.maps[k] = [dev.open(new[0]), gen, int(new[1])]
        dev.wait(self._stream, i.events[k])  # the writer's copy into slot k is done
        i.expected = (n, k, offsets)

    def take(self, peer: int, bufs: Sequence[Any]) -> None:
        i = self._in.get(peer)
        if i is None or i.expected is None:
            raise ChannelError(f"{self.name}: rank {peer}'s header described no bytes")
        n, k, offsets = i.expected
        i.expected = None
        if len(offsets) != len(bufs):
            raise ChannelError(f"{self.name}: rank {peer} described {len(offsets)} buffers, "
                               f"{len(bufs)} expected")
        ptr, gen, cap = i.maps[k]
        sizes = [b.numel() * b.element_size() for b in bufs]
        for off, nb in zip(offsets, sizes, strict=True):
            if off < 0 or off + nb > cap:
                raise ChannelError(f"{self.name}: rank {peer} described bytes outside slot {k}")
        for b, off, nb in zip(bufs, offsets, sizes, strict=True):
            if nb:
                self.dev.copy(b.data_ptr(), ptr + off, nb, self._stream)
        self.dev.record(i.own[k][0], self._stream)
        self.side.send(peer, (_ACK, n, k, gen), self.timeout)

    # ---------------------------------------------------------------- collectives
    def _gather(self, send: Any) -> list[Any]:
        live = send.numel() > 0
        if live:
            for p in range(self.world_size):
                if p != self.rank:
                    self.reserve(p, self.timeout, self._poll)
                    self.side.send(p, (_DESC, self.put(p, [send])), self.timeout)
        parts = []
        for p in range(self.world_size):
            if p == self.rank:
                parts.append(send)
                continue
            with self._context():
                part = send.new_empty(send.shape)
            if live:
                _, ext = self._next(p, _DESC, self.timeout)
                self.expect(p, ext, self.timeout, self._poll)
                self.take(p, [part])
            parts.append(part)
        return parts

    # ---------------------------------------------------------------- teardown
    def abort(self) -> None:
        """Wake every wait of this rank (and of peers reading from it). Idempotent."""
        if not self._aborted:
            self._aborted = True
            self.side.poison()

    def destroy(self, linger: float = 2.0) -> None:
        """Release buffers, mappings and events (our copies out of peers' buffers finish
        first); the shared side-channels are the protocol's to close."""
        dev = self.dev
        try:
            for i in self._in.values():
                for ev, _h in i.own:
                    _quiet(dev.sync_event, ev)
                for ptr, _g, _c in i.maps:
                    _quiet(dev.close, ptr)
                for ev in i.events:
                    _quiet(dev.destroy_event, ev)
                for ev, _h in i.own:
                    _quiet(dev.destroy_event, ev)
            for o in self._out.values():
                for ev, _h in o.events:
                    _quiet(dev.sync_event, ev)
                for ptr, _c, _g, _h in o.bufs:
                    _quiet(dev.free, ptr)
                for _k, _g, ptr in o.retired:
                    _quiet(dev.free, ptr)
                for ev, _h in o.events:
                    _quiet(dev.destroy_event, ev)
                for ev in o.peer_events or ():
                    _quiet(dev.destroy_event, ev)
            dev.release()
        finally:
            self._in.clear()
            self._out.clear()


class CudaIpcCommunicator(DeviceCommunicator):
    """Rank ``rank`` of a group of actors on one GPU: the device protocol over
    ``IpcTransport`` (see module doc).

    Args:
        rank, world_size: this member's rank and the group size.
        prefix / side / side_factory: the side-channels (as for ``NcclCommunicator``),
            shared by the protocol and the transport.
        streams: the actor's ``ActorStreams`` (``NullStreams`` with ``ShmIpcDevice``).
        device: the ``IpcDevice`` (default: ``CudaIpcDevice`` on the streams' device).
        slots: values a writer may be ahead of a reader on one pair.
        slot_bytes: initial capacity of each slot (grows on demand).
        timeout: default for calls that pass ``timeout=None`` (None: until closed).
        is_device: which objects move as device tensors (default: CUDA tensors).

    Raises:
        ChannelError: no CUDA and no ``device``. ValueError: none of prefix, side,
            side_factory.
    """

    def __init__(self, rank: int, world_size: int, *, prefix: str | None = None,
                 side: SideChannels | None = None, side_factory: SideFactory | None = None,
                 streams: Any = None, device: IpcDevice | None = None, slots: int = 2,
                 slot_bytes: int = 1 << 20, timeout: float | None = None, name: str = "",
                 is_device: Callable[[Any], bool] | None = None) -> None:
        streams = streams if streams is not None else actor_streams()
        if device is None:
            if not streams.is_cuda:
                raise ChannelError("CudaIpcCommunicator needs CUDA (or an IpcDevice)")
            device = CudaIpcDevice(streams.device.index)
        name = name or f"CUDA IPC communicator (rank {rank} of {world_size})"
        shared = SharedSide(open_side(side, side_factory, prefix, rank, world_size,
                                      "CudaIpcCommunicator"), tuple(_ARITY))
        tr = IpcTransport(rank, world_size, side=shared, streams=streams, device=device,
                          slots=slots, slot_bytes=slot_bytes, timeout=timeout,
                          is_device=is_device or is_cuda_tensor, name=name)
        super().__init__(tr, shared, streams, name=name, timeout=timeout)


def _quiet(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - teardown: release what can be released
        pass
