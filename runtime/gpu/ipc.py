"""CUDA IPC as a device transport: device values between actors that share one GPU.

NCCL refuses two ranks on one device, so actors placed on the same GPU (``num_gpus=0.5``)
move tensors through buffers one process exports and the other maps. ``IpcTransport`` is
the ``protocol.DeviceTransport`` that does it; the value protocol above it (headers, error
values, static edges, the status agreement before collectives, timeouts, abort) is
``protocol.DeviceCommunicator``'s, the same code as over NCCL. ``CudaIpcCommunicator`` is
that communicator over this transport.

Slots, per ordered pair writer -> reader. Set-up (at the pair's first transfer, or
``warm_up``):

- the writer allocates ``slots`` buffers with ``cudaMalloc`` - *outside* torch's caching
  allocator, because an IPC handle names a whole allocation - plus ``slots`` interprocess
  events, and sends their handles once (``ipc:hello``);
- the reader opens them once (``cudaIpcOpenMemHandle`` / ``cudaIpcOpenEventHandle``),
  creates ``slots`` interprocess events of its own and sends their handles back
  (``ipc:hello-ack``).

Per *use* ``n`` of the pair (the buffers one transport group moves to that peer: one value's
tensors, or one collective's part), slot ``k = n % slots``:

1. writer: once use ``n - slots`` is acknowledged, its comm stream waits on the reader's
   event ``k`` (the reader's copy out of slot ``k`` is done: no CPU wait); each buffer is
   copied into slot ``k`` (its sizes laid out at 256-byte alignment); writer event ``k`` is
   recorded; then the notice ``("ipc:data", n, sizes, generation, new handle or None)``
   goes to the reader;
2. reader: takes the notice, checks the sizes against the buffers its group posted, makes
   its comm stream wait on writer event ``k``, copies out, records its own event ``k`` and
   sends ``("ipc:ack", n, generation)`` - without waiting for the copy: the writer waits on
   the reader's event on the device before it reuses the slot.

The notice follows the copies because the reader must not wait on event ``k`` before the
writer recorded it for this use. The transport is ``data_first``: the protocol runs a
send's group before it sends the header, and the notice is held back to go out in the same
ring write as that header (``SortedSideChannels.hold``): one message and one wake-up per
value, as when the slot data rode in the header. A group with receives (collectives,
warm-up) sends its notices before it waits. A static edge's receive, posted before its
header is read, is the reader waiting for the notice.

So ``send`` returns once the header is written and blocks only when the reader is ``slots``
values behind (NCCL's CPU semantics; op programs do not change). A value larger than its
slot grows that slot (rare): the writer allocates a bigger buffer, sends its handle in the
notice with the next generation and keeps the old buffer until the reader acknowledges the
new generation (the reader first waits for its own last copy from the old mapping - a
counted CPU wait - then closes it).

The transport's messages (tuples whose first item is one of ``KINDS``) share each ordered
pair's side-channel FIFO with the protocol's headers and status words:
``sidechannel.SortedSideChannels`` sorts them on arrival into one queue per (peer, kind), so
no kind ever waits behind another. The side-channel rings get room for ``slots`` values'
headers, notices and acknowledgements, so the ring never bounds a writer before the slots do.

Collectives run over the same p2p path plus a local reduction on the comm stream, by
``cgc.runtime.channels.collective``'s rule (on one GPU the copies run at device-memory
bandwidth): allreduce sends its input to every peer and reduces the parts in rank order;
allgather receives each peer's part straight into its place in the output; reducescatter
sends each peer only the chunk that peer keeps. Whether an error, host values or differing
shapes decide the result instead is the protocol's status agreement, as for NCCL.

The device calls go through an ``IpcDevice`` (``cgc.runtime.gpu.ipc_devices``):
``CudaIpcDevice`` (cupy.cuda.runtime) on GPUs, ``ShmIpcDevice`` (shared-memory segments,
synchronous copies) in CPU tests.

Example::

    comm = CudaIpcCommunicator(rank, 2, prefix=unique_prefix, streams=actor_streams())
    comm.send(torch.ones(1 << 20, device="cuda"), peer=1)      # on rank 0
    x = comm.recv(peer=0)                                      # on rank 1
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from cgc.runtime.channels.collective import ReduceOp, reduce_values
from cgc.runtime.channels.errors import ChannelClosedError, ChannelError

from .ipc_devices import CudaIpcDevice, IpcDevice
from .protocol import DeviceCommunicator, DeviceTransport
from .sidechannel import SideChannels, SideFactory, SortedSideChannels, open_side
from .streams import actor_streams
from .tensors import TensorMeta, as_bytes, is_cuda_tensor, torch_dtype

__all__ = ["IpcTransport", "CudaIpcCommunicator", "KINDS"]

_ALIGN = 256
HELLO, HELLO_ACK, DATA, ACK = "ipc:hello", "ipc:hello-ack", "ipc:data", "ipc:ack"
KINDS = (HELLO, HELLO_ACK, DATA, ACK)


def _align(n: int) -> int:
    return (n + _ALIGN - 1) & ~(_ALIGN - 1)


def _layout(sizes: Sequence[int]) -> tuple[list[int], int]:
    """Offsets of buffers of ``sizes`` bytes in one slot, and the bytes the slot needs."""
    offsets, total = [], 0
    for nb in sizes:
        offsets.append(total)
        total = _align(total + nb)
    return offsets, total


def _grow(cap: int, need: int) -> int:
    cap = max(cap, 1 << 16)
    while cap < need:
        cap *= 2
    return cap


def _by_peer(pairs: Sequence[tuple[Any, int]]) -> dict[int, list[Any]]:
    if len(pairs) == 1:
        return {pairs[0][1]: [pairs[0][0]]}
    out: dict[int, list[Any]] = {}
    for buf, peer in pairs:
        out.setdefault(peer, []).append(buf)
    return out


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


class IpcTransport(DeviceTransport):
    """Rank ``side.rank`` of a CUDA IPC transport (see module doc).

    Args:
        side: the communicator's side-channels, sorted by ``KINDS`` (the protocol reads
            the same object).
        device: the ``IpcDevice`` (``CudaIpcDevice`` on GPUs, ``ShmIpcDevice`` in tests).
        streams: the actor's ``ActorStreams`` (``NullStreams`` with ``ShmIpcDevice``).
        slots: values a writer may be ahead of a reader on one pair.
        slot_bytes: initial capacity of each slot (grows on demand).
        is_device: which objects move as device tensors (default: CUDA tensors).
    """

    data_first = True  # see module doc

    def __init__(self, side: SortedSideChannels, device: IpcDevice, streams: Any, *,
                 slots: int = 2, slot_bytes: int = 1 << 20,
                 is_device: Callable[[Any], bool] | None = None, name: str = "") -> None:
        self.side, self.dev, self.streams = side, device, streams
        self.rank, self.world_size = side.rank, side.world_size
        self.slots = max(1, int(slots))
        self.slot_bytes = max(_ALIGN, int(slot_bytes))
        self.name = name or f"CUDA IPC transport (rank {self.rank} of {self.world_size})"
        self._is_device = is_device or is_cuda_tensor
        self._stream = streams.comm.cuda_stream if streams.comm is not None else 0
        self._device = getattr(streams, "device", None)
        self._out: dict[int, _Out] = {}
        self._in: dict[int, _In] = {}
        self._aborted = False

    def is_device(self, obj: Any) -> bool:
        return self._is_device(obj)

    def empty(self, meta: TensorMeta) -> Any:
        import torch

        kw = {"device": self._device} if self._device is not None else {}
        return torch.empty(meta.shape, dtype=torch_dtype(meta.dtype), **kw)

    # ---------------------------------------------------------------- plumbing
    def _poll(self) -> None:
        if self._aborted:
            raise ChannelClosedError(f"{self.name}: rank {self.rank} was aborted")

    def _next(self, peer: int, kind: str, timeout: float | None) -> tuple:
        return self.side.recv_kind(peer, kind, timeout, self._poll)

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
        self.side.send(peer, (HELLO, self.slots, [(b[3], b[1]) for b in o.bufs],
                              [h for _, h in o.events]), timeout)
        return o

    def _connect_in(self, peer: int, timeout: float | None) -> _In:
        i = self._in.get(peer)
        if i is not None:
            return i
        _, slots, handles, ev_handles = self._next(peer, HELLO, timeout)
        if slots != len(handles) or slots != len(ev_handles) or slots < 1:
            raise ChannelError(f"{self.name}: bad IPC hello from rank {peer}")
        i = _In()
        i.maps = [[self.dev.open(h), 0, int(cap)] for h, cap in handles]
        i.events = [self.dev.open_event(h) for h in ev_handles]
        i.own = [self.dev.new_event() for _ in range(slots)]
        self._in[peer] = i
        self.side.send(peer, (HELLO_ACK, [h for _, h in i.own]), timeout)
        return i

    def _peer_events(self, o: _Out, peer: int, timeout: float | None) -> list[Any]:
        if o.peer_events is None:
            _, handles = self._next(peer, HELLO_ACK, timeout)
            if len(handles) != self.slots:
                raise ChannelError(f"{self.name}: bad IPC hello-ack from rank {peer}")
            o.peer_events = [self.dev.open_event(h) for h in handles]
        return o.peer_events

    def _await_ack(self, o: _Out, peer: int, use: int, timeout: float | None) -> list[Any]:
        """Take acknowledgements until use ``use`` of the pair is acknowledged; the reader's
        events."""
        events = self._peer_events(o, peer, timeout)
        while o.acked <= use:
            _, n, gen = self._next(peer, ACK, timeout)
            if n != o.acked:
                raise ChannelError(f"{self.name}: rank {peer} acknowledged use {n}, "
                                   f"expected {o.acked}")
            o.acked += 1
            if o.retired:
                k, keep = n % self.slots, []
                for slot, g, ptr in o.retired:
                    if slot == k and g < gen:
                        self.dev.free(ptr)  # the reader closed it and its copies finished
                    else:
                        keep.append((slot, g, ptr))
                o.retired = keep
        return events

    # ---------------------------------------------------------------- p2p
    def p2p(self, sends: Sequence[tuple[Any, int]], recvs: Sequence[tuple[Any, int]], *,
            timeout: float | None = None) -> None:
        """One use per peer of ``sends`` (its buffers in order), then one per peer of
        ``recvs``: all sends first, so no order of members can deadlock. The notices of a
        group without receives go out with the protocol's next message to the peer (the
        header: ``data_first``), or before this rank next waits."""
        self._poll()
        if sends:
            for peer, bufs in _by_peer(sends).items():
                self._write(peer, bufs, timeout)
        if recvs:
            self.side.flush(timeout)  # our notices before we take theirs
            for peer, bufs in _by_peer(recvs).items():
                self._read(peer, bufs, timeout)

    def _write(self, peer: int, bufs: list[Any], timeout: float | None) -> None:
        o = self._connect_out(peer, timeout)
        n, k = o.n, o.n % self.slots
        dev, stream = self.dev, self._stream
        if n >= self.slots:
            events = self._await_ack(o, peer, n - self.slots, timeout)
            dev.wait(stream, events[k])  # the reader's copy out of slot k is done
        sizes = [b.numel() for b in bufs]  # flat uint8 buffers (DeviceTransport.p2p)
        offsets, total = _layout(sizes)
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
                dev.copy(ptr + off, b.data_ptr(), nb, stream)
        dev.record(o.events[k][0], stream)
        # Held: it travels with the header the protocol sends next (data_first), or goes
        # out before this rank waits for anything (SortedSideChannels).
        self.side.hold(peer, (DATA, n, sizes, gen, new))
        o.n = n + 1

    def _read(self, peer: int, bufs: list[Any], timeout: float | None) -> None:
        i = self._connect_in(peer, timeout)
        _, n, sizes, gen, new = self._next(peer, DATA, timeout)
        posted = [b.numel() for b in bufs]
        if n != i.n:
            raise ChannelError(f"{self.name}: rank {peer} sent use {n}, expected use {i.n}")
        if sizes != posted:
            raise ChannelError(f"{self.name}: rank {peer} sent buffers of {list(sizes)} "
                               f"bytes, rank {self.rank} posted {list(posted)}")
        k = n % len(i.maps)
        i.n = n + 1
        dev, stream = self.dev, self._stream
        if new is not None:
            # The slot grew: our last copy from the old mapping must finish before we close
            # it (rare; a CPU wait), then map the new buffer.
            dev.sync_event(i.own[k][0])
            dev.close(i.maps[k][0])
            i.maps[k] = [dev.open(new[0]), gen, int(new[1])]
        ptr, mapped, cap = i.maps[k]
        offsets, total = _layout(sizes)
        if mapped != gen or total > cap:
            raise ChannelError(f"{self.name}: rank {peer} described bytes outside slot {k}")
        dev.wait(stream, i.events[k])  # the writer's copy into slot k is done
        for b, off, nb in zip(bufs, offsets, sizes, strict=True):
            if nb:
                dev.copy(b.data_ptr(), ptr + off, nb, stream)
        dev.record(i.own[k][0], stream)
        self.side.send(peer, (ACK, n, gen), timeout)

    def finish_warm_up(self, timeout: float | None) -> None:
        """Open the events every reader of this rank sent back, so the first reuse of a
        slot pays no set-up."""
        for peer, o in self._out.items():
            self._peer_events(o, peer, timeout)

    # ---------------------------------------------------------------- collectives
    def _peers(self) -> list[int]:
        return [p for p in range(self.world_size) if p != self.rank]

    def _swap(self, mine: Callable[[int], Any], like: Any,
              timeout: float | None) -> list[Any]:
        """Every rank's part in rank order: ``mine(p)`` goes to peer ``p``, each peer's
        part for this rank arrives in a new tensor like ``like``; ``mine(rank)`` is ours."""
        import torch

        peers = self._peers()
        with self.streams.comm_context():
            got = {p: torch.empty_like(like) for p in peers}
        self.p2p([(as_bytes(mine(p)), p) for p in peers],
                 [(as_bytes(got[p]), p) for p in peers], timeout=timeout)
        return [mine(r) if r == self.rank else got[r] for r in range(self.world_size)]

    def allreduce(self, send: Any, recv: Any, op: ReduceOp, *,
                  timeout: float | None = None) -> None:
        parts = self._swap(lambda _p: send, send, timeout)
        with self.streams.comm_context():
            recv.copy_(reduce_values(parts, op))

    def allgather(self, send: Any, recv: Any, *, timeout: float | None = None) -> None:
        m = send.numel()
        with self.streams.comm_context():
            recv[self.rank * m:(self.rank + 1) * m].copy_(send)
        peers = self._peers()
        self.p2p([(send, p) for p in peers], [(recv[p * m:(p + 1) * m], p) for p in peers],
                 timeout=timeout)

    def reducescatter(self, send: Any, recv: Any, op: ReduceOp, *,
                      timeout: float | None = None) -> None:
        n = recv.shape[0]  # the protocol checked that dim 0 divides by the world size
        parts = self._swap(lambda p: send[p * n:(p + 1) * n], recv, timeout)
        with self.streams.comm_context():
            recv.copy_(reduce_values(parts, op))

    def unsupported(self, dtype: str, op: ReduceOp | None) -> str | None:
        if dtype.startswith("complex") and op in (ReduceOp.MAX, ReduceOp.MIN):
            return f"complex numbers have no {op.word}"
        return None

    # ---------------------------------------------------------------- teardown
    def abort(self) -> None:
        """Later calls raise ChannelClosedError (the communicator poisons the side-channels,
        which wakes the waits)."""
        self._aborted = True

    def destroy(self) -> None:
        """Release buffers, mappings and events (the side-channels are the communicator's)."""
        dev = self.dev
        try:
            for i in self._in.values():  # our copies out of peers' buffers must finish
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


def _quiet(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - teardown: release what can be released
        pass


class CudaIpcCommunicator(DeviceCommunicator):
    """Rank ``rank`` of a group of actors on one GPU: ``DeviceCommunicator`` over
    ``IpcTransport`` (see module doc).

    Args:
        rank, world_size: this member's rank and the group size.
        prefix / side / side_factory: the side-channels (as for ``NcclCommunicator``).
        streams: the actor's ``ActorStreams`` (``NullStreams`` with ``ShmIpcDevice``).
        device: the ``IpcDevice`` (default: ``CudaIpcDevice`` on the streams' device).
        slots: values a writer may be ahead of a reader on one pair.
        slot_bytes: initial capacity of each slot (grows on demand).
        timeout: default for calls that pass ``timeout=None`` (None: until closed).
        is_device: which objects move as device tensors (default: CUDA tensors).

    Raises:
        ChannelError: no ``device`` and no CUDA on ``streams``.
        ValueError: none of prefix, side, side_factory.
    """

    def __init__(self, rank: int, world_size: int, *, prefix: str | None = None,
                 side: SideChannels | None = None, side_factory: SideFactory | None = None,
                 streams: Any = None, device: IpcDevice | None = None, slots: int = 2,
                 slot_bytes: int = 1 << 20, timeout: float | None = None, name: str = "",
                 is_device: Callable[[Any], bool] | None = None) -> None:
        name = name or f"CUDA IPC communicator (rank {rank} of {world_size})"
        streams = streams if streams is not None else actor_streams()
        if device is None:
            if not getattr(streams, "is_cuda", False):
                raise ChannelError(f"{name}: CUDA IPC needs CUDA (or an IpcDevice)")
            device = CudaIpcDevice(streams.device.index)
        slots = max(1, int(slots))
        # Per value a header and a notice one way, an acknowledgement back: room for
        # ``slots`` values of both directions (and collective status words) on each ring.
        raw = open_side(side, side_factory, prefix, rank, world_size, name,
                        slots=max(32, 4 * slots + 8))
        sorted_side = SortedSideChannels(raw, KINDS)
        transport = IpcTransport(sorted_side, device, streams, slots=slots,
                                 slot_bytes=slot_bytes, is_device=is_device, name=name)
        super().__init__(transport, sorted_side, streams, name=name, timeout=timeout)
