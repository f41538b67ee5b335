"""CUDA IPC communicator: device values between actors that share one GPU.

NCCL refuses two ranks on one device, so actors placed on the same GPU (``num_gpus=0.5``)
move tensors through buffers one process exports and the other maps. Per ordered pair
writer -> reader:

Set-up (at the first transfer on the pair, or ``warm_up``):

- the writer allocates ``slots`` buffers with ``cudaMalloc`` - *outside* torch's caching
  allocator, because an IPC handle names a whole allocation - plus ``slots`` interprocess
  events, and sends their handles once ("hello");
- the reader opens them once (``cudaIpcOpenMemHandle`` / ``cudaIpcOpenEventHandle``),
  creates ``slots`` interprocess events of its own and sends their handles back.

Per value with tensors (use ``n`` of the pair, slot ``k = n % slots``):

1. writer: once use ``n - slots`` is acknowledged, its comm stream waits on the reader's
   event ``k`` (the reader's copy out of slot ``k`` is done: no CPU wait); the comm stream
   waits for the compute stream; each tensor is copied into slot ``k`` (offsets aligned
   to 256 bytes); writer event ``k`` is recorded; the header (status, metas, skeleton,
   and ``ext = (n, k, offsets, generation, new handle or None)``) goes to the side-channel;
2. reader: reads the header, makes its comm stream wait on writer event ``k``, allocates
   the tensors, copies them out, records its own event ``k`` and sends the
   acknowledgement ``(n, k, generation)`` - without waiting for the copy: the writer waits
   on the reader's event on the device before it reuses the slot.

So ``send`` returns once the header is written and blocks only when the reader is
``slots`` values behind (NCCL's CPU semantics; op programs do not change). A value larger
than its slot grows that slot (rare): the writer allocates a bigger buffer, sends its
handle in the header with the next generation and keeps the old buffer until the reader
acknowledges the new generation (the reader first waits for its own last copy from the
old mapping - a counted CPU wait - then closes it).

Errors travel as error headers (no slot is used). Collectives run as an exchange of
values over the same p2p path (every member sends its value to every other, then reads
theirs) followed by a local reduction on the comm stream: on one GPU the N-fold copies
run at device-memory bandwidth. Errors and host values behave as on the CPU communicator.

Messages of several kinds share each ordered pair's side-channel FIFO (this pair's hello,
headers and the acknowledgements for the opposite direction); the receiving side sorts
them into one queue per (peer, kind), so no kind ever waits behind another.

The device calls go through an ``IpcDevice`` (``cgc.runtime.gpu.ipc_devices``):
``CudaIpcDevice`` (cupy.cuda.runtime) on GPUs, ``ShmIpcDevice`` (shared-memory segments,
synchronous copies) in CPU tests.

Example::

    comm = CudaIpcCommunicator(rank, 2, prefix=unique_prefix, streams=actor_streams())
    comm.send(torch.ones(1 << 20, device="cuda"), peer=1)      # on rank 0
    x = comm.recv(peer=0)                                      # on rank 1
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from cgc.runtime.channels.comm import ExchangingCommunicator, first_error
from cgc.runtime.channels.errors import ChannelClosedError, ChannelError

from .ipc_devices import CudaIpcDevice, IpcDevice, ShmIpcDevice
from .protocol import comm_ready, header_for
from .sidechannel import SideChannels, SideFactory, open_side
from .streams import actor_streams
from .tensors import STATUS_ERROR, Header, is_cuda_tensor, open_header, static_meta, torch_dtype

__all__ = ["CudaIpcCommunicator"]

_ALIGN = 256
_KINDS = ("hello", "hello-ack", "ack", "hdr")


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


class CudaIpcCommunicator(ExchangingCommunicator):
    """Rank ``rank`` of a group of actors on one GPU (see module doc).

    Args:
        rank, world_size: this member's rank and the group size.
        prefix / side / side_factory: the side-channels (as for ``NcclCommunicator``).
        streams: the actor's ``ActorStreams`` (``NullStreams`` with ``ShmIpcDevice``).
        device: the ``IpcDevice`` (default: ``CudaIpcDevice`` on the streams' device).
        slots: values a writer may be ahead of a reader on one pair.
        slot_bytes: initial capacity of each slot (grows on demand).
        timeout: default for calls that pass ``timeout=None`` (None: until closed).
        is_device: which objects move as device tensors (default: CUDA tensors).
    """

    def __init__(self, rank: int, world_size: int, *, prefix: str | None = None,
                 side: SideChannels | None = None, side_factory: SideFactory | None = None,
                 streams: Any = None, device: IpcDevice | None = None, slots: int = 2,
                 slot_bytes: int = 1 << 20, timeout: float | None = None, name: str = "",
                 is_device: Callable[[Any], bool] | None = None) -> None:
        self.side = open_side(side, side_factory, prefix, rank, world_size,
                              "CudaIpcCommunicator")
        self.rank, self.world_size = rank, world_size
        self.streams = streams if streams is not None else actor_streams()
        if device is None:
            if not getattr(self.streams, "is_cuda", False):
                raise ChannelError("CudaIpcCommunicator needs CUDA (or an IpcDevice)")
            device = CudaIpcDevice(self.streams.device.index)  # type: ignore[union-attr]
        self.dev = device
        self._stream = self.streams.comm.cuda_stream if self.streams.comm is not None else 0
        self._torch_device = getattr(self.streams, "device", None)
        self.slots = max(1, int(slots))
        self.slot_bytes = max(_ALIGN, int(slot_bytes))
        self.timeout = timeout
        self.name = name or f"CUDA IPC communicator (rank {rank} of {world_size})"
        self.is_device = is_device or is_cuda_tensor
        self.last_event: Any = None
        self._out: dict[int, _Out] = {}
        self._in: dict[int, _In] = {}
        self._queues: dict[tuple[int, str], deque] = {}
        self._aborted = False
        self._released = False
        self._busy = 0
        self._static: dict[tuple[tuple[int, ...], str], Any] = {}

    # ---------------------------------------------------------------- plumbing
    def _t(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is None else timeout

    def _poll(self) -> None:
        if self._aborted:
            raise ChannelClosedError(f"{self.name}: rank {self.rank} was aborted")

    def _check_peer(self, peer: int) -> None:
        if peer == self.rank or not 0 <= peer < self.world_size:
            raise ValueError(f"{self.name}: rank {self.rank}: bad peer {peer} "
                             f"(world size {self.world_size})")

    def _next(self, peer: int, kind: str, timeout: float | None) -> tuple:
        """The next message of ``kind`` from ``peer`` (others are queued for later)."""
        q = self._queues.setdefault((peer, kind), deque())
        while not q:
            msg = self.side.recv(peer, timeout, self._poll)
            if type(msg) is not tuple or not msg or msg[0] not in _KINDS:
                raise ChannelError(f"{self.name}: rank {peer} sent a malformed message")
            self._queues.setdefault((peer, msg[0]), deque()).append(msg)
        return q.popleft()

    def _op(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self._aborted or self._released:
            raise ChannelClosedError(f"{self.name}: rank {self.rank} was "
                                     f"{'aborted' if self._aborted else 'destroyed'}")
        self._busy += 1
        try:
            return fn(*args)
        finally:
            self._busy -= 1

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
        self.side.send(peer, ("hello", self.slots, [(b[3], b[1]) for b in o.bufs],
                              [h for _, h in o.events]), timeout)
        return o

    def _connect_in(self, peer: int, timeout: float | None) -> _In:
        i = self._in.get(peer)
        if i is not None:
            return i
        _, slots, handles, ev_handles = self._next(peer, "hello", timeout)
        if slots != len(handles) or slots != len(ev_handles) or slots < 1:
            raise ChannelError(f"{self.name}: bad IPC hello from rank {peer}")
        i = _In()
        i.maps = [[self.dev.open(h), 0, int(cap)] for h, cap in handles]
        i.events = [self.dev.open_event(h) for h in ev_handles]
        i.own = [self.dev.new_event() for _ in range(slots)]
        self._in[peer] = i
        self.side.send(peer, ("hello-ack", [h for _, h in i.own]), timeout)
        return i

    def _peer_events(self, o: _Out, peer: int, timeout: float | None) -> list[Any]:
        if o.peer_events is None:
            _, handles = self._next(peer, "hello-ack", timeout)
            if len(handles) != self.slots:
                raise ChannelError(f"{self.name}: bad IPC hello-ack from rank {peer}")
            o.peer_events = [self.dev.open_event(h) for h in handles]
        return o.peer_events

    def _await_ack(self, o: _Out, peer: int, use: int, timeout: float | None) -> None:
        """Take acknowledgements until use ``use`` of the pair is acknowledged."""
        self._peer_events(o, peer, timeout)
        while o.acked <= use:
            _, n, k, gen = self._next(peer, "ack", timeout)
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

    # ---------------------------------------------------------------- p2p
    def send(self, value: Any, peer: int, timeout: float | None = None, *,
             shape: Any = None, dtype: Any = None) -> None:
        """Send ``value`` to ``peer`` (``shape``/``dtype``: a static edge's declaration).

        Raises:
            ChannelTimeoutError: ``peer`` stayed ``slots`` values behind for ``timeout`` s.
            ChannelClosedError: aborted or destroyed. ValueError: bad peer.
        """
        self._check_peer(peer)
        smeta = None
        if shape is not None and dtype:
            key = (tuple(int(d) for d in shape), str(dtype))
            smeta = self._static.get(key) or self._static.setdefault(key, static_meta(*key))
        hdr, tensors = header_for(value, "p2p", self.is_device, smeta, self.name)
        self._op(self._send, peer, hdr, tensors, self._t(timeout))

    def _send(self, peer: int, hdr: Header, tensors: list[Any], timeout: float | None) -> None:
        o = self._connect_out(peer, timeout)
        if hdr.status == STATUS_ERROR or not tensors:
            self.side.send(peer, ("hdr", hdr), timeout)
            return
        n, k = o.n, o.n % self.slots
        stream, dev = self._stream, self.dev
        if n >= self.slots:
            self._await_ack(o, peer, n - self.slots, timeout)
            dev.wait(stream, o.peer_events[k])  # type: ignore[index] # reader's copy is out
        ready = comm_ready(self.streams, tensors)
        offsets, total = [], 0
        for t in ready:
            offsets.append(total)
            total = _align(total + t.numel() * t.element_size())
        ptr, cap, gen, _h = o.bufs[k]
        new = None
        if total > cap:
            o.retired.append((k, gen, ptr))
            cap = _grow(cap, total)
            ptr, handle = dev.alloc(cap)
            gen += 1
            o.bufs[k] = [ptr, cap, gen, handle]
            new = (handle, cap)
        for t, off in zip(ready, offsets, strict=True):
            nb = t.numel() * t.element_size()
            if nb:
                dev.copy(ptr + off, t.data_ptr(), nb, stream)
        dev.record(o.events[k][0], stream)
        self.side.send(peer, ("hdr", hdr._replace(ext=(n, k, tuple(offsets), gen, new))),
                       timeout)
        o.n = n + 1

    def recv(self, peer: int, shape: Any = None, dtype: Any = None,
             timeout: float | None = None) -> Any:
        """The next value from ``peer`` (``shape``/``dtype`` are accepted for symmetry with
        NCCL; IPC needs no posted receive).

        Raises:
            ChannelTimeoutError: nothing within ``timeout`` s. ChannelClosedError: aborted.
            ChannelError: malformed or out-of-order messages.
        """
        self._check_peer(peer)
        return self._op(self._recv, peer, "p2p", self._t(timeout))

    def _recv(self, peer: int, tag: str, timeout: float | None) -> Any:
        i = self._connect_in(peer, timeout)
        _, hdr = self._next(peer, "hdr", timeout)
        if not isinstance(hdr, Header) or hdr.tag != tag:
            got = hdr.tag if isinstance(hdr, Header) else type(hdr).__name__
            raise ChannelError(f"{self.name}: call order differs: rank {self.rank} runs {tag}, "
                               f"rank {peer} sent {got}")
        if hdr.status == STATUS_ERROR or hdr.ext is None:
            return open_header(hdr, [])
        n, k, offsets, gen, new = hdr.ext
        if n != i.n or not 0 <= k < len(i.maps) or len(offsets) != len(hdr.metas):
            raise ChannelError(f"{self.name}: rank {peer} sent use {n} slot {k}, expected "
                               f"use {i.n}")
        i.n = n + 1
        dev, stream = self.dev, self._stream
        if new is not None:
            # The slot grew: our last copy from the old mapping must finish before we close
            # it (rare; a CPU wait), then map the new buffer.
            dev.sync_event(i.own[k][0])
            dev.close(i.maps[k][0])
            i.maps[k] = [dev.open(new[0]), gen, int(new[1])]
        ptr, _gen, cap = i.maps[k]
        dev.wait(stream, i.events[k])  # the writer's copy into slot k is done
        kw = {"device": self._torch_device} if self._torch_device is not None else {}
        with self.streams.comm_context():
            outs = [torch.empty(m.shape, dtype=torch_dtype(m.dtype), **kw) for m in hdr.metas]
        for t, off in zip(outs, offsets, strict=True):
            nb = t.numel() * t.element_size()
            if off < 0 or off + nb > cap:
                raise ChannelError(f"{self.name}: rank {peer} described bytes outside slot {k}")
            if nb:
                dev.copy(t.data_ptr(), ptr + off, nb, stream)
        dev.record(i.own[k][0], stream)
        self.side.send(peer, ("ack", n, k, i.maps[k][1]), timeout)
        ev = self.streams.comm_done()
        self.last_event = ev
        self.streams.mark_compute_use(outs)
        self.streams.received(ev)
        return open_header(hdr, outs)

    # ---------------------------------------------------------------- collectives
    def _exchange(self, tag: str, value: Any, timeout: float | None) -> list[Any]:
        hdr, tensors = header_for(value, tag, self.is_device, None, self.name)
        for p in range(self.world_size):
            if p != self.rank:
                self._send(p, hdr, tensors, timeout)
        return [value if p == self.rank else self._recv(p, tag, timeout)
                for p in range(self.world_size)]

    def _exchanged(self, tag: str, value: Any, timeout: float | None,
                   finish: Callable[[list[Any]], Any]) -> Any:
        def run() -> Any:
            vals = self._exchange(tag, value, self._t(timeout))
            err = first_error(vals)
            if err is not None:
                return err
            self.streams.comm_after_compute()
            with self.streams.comm_context():
                out = finish(vals)
            ev = self.streams.comm_done()
            self.last_event = ev
            outs = out if isinstance(out, list) else [out]
            self.streams.mark_compute_use([t for t in outs if self.is_device(t)])
            self.streams.received(ev)
            return out
        return self._op(run)

    # ---------------------------------------------------------------- set-up / teardown
    def warm_up(self, peers: Any, timeout: float | None = 60.0,
                collective: bool = False) -> None:
        """Exchange handles with every peer in ``peers`` (both directions) and move one
        1-element tensor each way, so the first real value pays no set-up. Every member
        of a pair must call it (all sends first, then all receives: deadlock-free).
        ``collective``: collectives here are exchanges between all pairs, so every rank
        is warmed with every other."""
        if collective:
            peers = range(self.world_size)
        peers = sorted(set(peers) - {self.rank})

        def run() -> None:
            one = self._one()
            hdr, tensors = header_for(one, "p2p", self.is_device, None, self.name)
            for p in peers:
                self._send(p, hdr, tensors, timeout)
            for p in peers:
                self._recv(p, "p2p", timeout)
            for p in peers:
                self._peer_events(self._out[p], p, timeout)
        self._op(run)

    def _one(self) -> Any:
        if self._torch_device is not None:
            return torch.zeros(1, dtype=torch.uint8, device=self._torch_device)
        return torch.zeros(1, dtype=torch.uint8)

    def abort(self) -> None:
        """Wake every wait of this rank (and of peers reading from it). Idempotent."""
        if not self._aborted:
            self._aborted = True
            self.side.poison()

    def destroy(self, linger: float = 2.0) -> None:
        """Release buffers, mappings, events and side-channels. Safe from another thread:
        while an op runs there it only aborts; the owner's next ``destroy()`` releases."""
        if self._released:
            return
        if self._busy:
            self.abort()
            return
        self._released = True
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
            if isinstance(dev, ShmIpcDevice):
                dev.release()
        finally:
            self._in.clear()
            self._out.clear()
            self.side.close(linger=0 if self._aborted else linger)


def _quiet(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - teardown: release what can be released
        pass
