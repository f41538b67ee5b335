"""The value protocol of NCCL-shaped communicators, over a pluggable device transport.

``DeviceCommunicator`` implements ``cgc.runtime.comm.interface.Communicator`` for values that
hold device tensors. It owns the *protocol*; a ``DeviceTransport`` owns the *bytes*:

- ``send(value, peer)``: header (status, tensor metas, skeleton; see ``tensors``) to the
  peer's side-channel, then one transport group with a ``uint8`` send per tensor. The comm
  stream first waits for the compute stream. Returns once queued (NCCL's own CPU
  semantics: the device op completes at the rendezvous; the plan's verified order keeps
  it deadlock-free); the side-channel bounds how far a sender runs ahead.
- ``recv(peer)``: read the header, allocate the tensors, one transport group of receives,
  rebuild the value. With ``shape``/``dtype`` (a static edge) the single tensor is
  allocated and its receive **posted before the header is read**.
- exceptions are values: an ``ErrorValue`` (or an unsendable value, or a value that breaks
  a static edge's declaration) travels as an error header; on a dynamic edge no device op
  follows, on a static edge the sender sends a dummy of the declared shape so the
  receive already posted completes.
- collectives (allreduce sum/product/max/min/avg, allgather, reducescatter; what each
  computes is ``cgc.runtime.comm.collective``'s rule, on device and host alike):
  every member first sends a status word to every other over the side-channels (device
  tensor shape/dtype, an error, or a host value). Any error becomes every member's result
  (the first in rank order) without a device op; differing shapes raise ``ValueError`` on
  every member; host values on every member reduce locally (the CPU communicator's
  semantics); otherwise one native collective runs on the transport.

A ``DescribingTransport`` (CUDA IPC; see ``transport``) turns the p2p order around: a
send's bytes are queued first and the header says where they are (``ext``); a receive is
posted after its header is read, on static edges too, and an error needs no dummy. The
communicator picks the order once, by its transport's kind (``PostingTransport`` or
``DescribingTransport``).

Every wait has the caller's ``timeout`` (or the communicator's default) and polls the
transport's health (``check``, e.g. NCCL async errors) while it waits; ``abort()`` from any
thread wakes every waiter with ``ChannelClosedError`` and aborts the transport.

``last_event`` is the comm-stream event of the latest op that moved device data (None if
none); see ``streams`` for how the executor uses it.

The same protocol code runs in CI on CPU with ``testing.cpu_transport.ShmCpuTransport`` (CPU torch
tensors standing in for device tensors, bytes through shared memory).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Any

from cgc.runtime.channels.errors import ChannelClosedError, ChannelError, ErrorValue
from cgc.runtime.comm.collective import ReduceOp, combine, scatter_rows
from cgc.runtime.comm.interface import Communicator
from cgc.runtime.comm.sidechannel import SideChannels, exchange
from cgc.runtime.comm.transport import DescribingTransport, DeviceTransport, PostingTransport
from cgc.runtime.gpu.streams import ActorStreams, NullStreams, wait_event
from cgc.runtime.gpu.tensors import (
    STATUS_ERROR,
    Header,
    TensorMeta,
    as_bytes,
    error_header,
    make_header,
    open_header,
    static_meta,
    tensor_meta,
    torch_dtype,
)

__all__ = ["CommStreams", "CollectiveStatus", "DeviceCommunicator", "collective_plan", "comm_ready",
           "header_for"]


#: The streams a device communicator runs on: the actor's (CUDA) or none (CPU).
CommStreams = ActorStreams | NullStreams


def comm_ready(streams: CommStreams, tensors: Sequence[Any]) -> list[Any]:
    """``tensors`` contiguous and readable on ``streams``' comm stream (strided ones are
    copied there), after the comm stream waited for the compute stream that produced them.

    Example: ``ready = comm_ready(streams, [t])`` before a send's copies on the comm stream.
    """
    streams.comm_after_compute()
    streams.mark_comm_use(tensors)
    out = []
    with streams.comm_context():
        for t in tensors:
            t = t.detach()
            out.append(t if t.is_contiguous() else t.contiguous())
    return out


def header_for(value: Any, tag: str, is_device: Callable[[Any], bool],
               static: TensorMeta | None = None, where: str = "") -> tuple[Header, list[Any]]:
    """``make_header`` for a send, with the value rules of device edges: a value that
    breaks a static edge's declaration (``static``), or cannot be pickled, becomes an
    error header (the receiver gets an ``ErrorValue``, the graph goes on)."""
    if static is not None and type(value) is not ErrorValue:
        if not is_device(value) or tensor_meta(value) != static:
            got = (f"{tuple(value.shape)}/{str(value.dtype).removeprefix('torch.')}"
                   if is_device(value) else f"a {type(value).__name__}")
            value = ErrorValue.from_exception(ValueError(
                f"a static edge declares one tensor {static.shape}/{static.dtype}, the value "
                f"is {got}"), method="send", communicator=where)
    try:
        return make_header(value, tag, is_device)
    except Exception as exc:  # noqa: BLE001 - an unsendable value travels as an error
        return error_header(ErrorValue.from_exception(TypeError(
            f"the value cannot be sent ({type(value).__name__}): {exc}"), method="send",
            communicator=where), tag), []


class CollectiveStatus(enum.StrEnum):
    """What a member contributes to a collective: the first word of the status it sends
    every other member before it (``DeviceCommunicator._status``), and the kind of answer
    ``collective_plan`` gives. The plain value travels (``.value``: the wire is unchanged).

    Example:
        >>> CollectiveStatus("err") is CollectiveStatus.ERROR
        True
    """

    DEVICE = "dev"  # a device tensor: its TensorMeta
    ERROR = "err"  # an ErrorValue: every member's result
    HOST = "host"  # a host value (has shape and dtype): reduced on every member
    BAD = "bad"  # anything else: its type name (TypeError on every member)


def collective_plan(statuses: Sequence[tuple[str, Any]], kind: str,
                    world: int) -> tuple[CollectiveStatus, Any]:
    """Decide a collective from every member's status word; the same answer on every rank.

    Status words (``CollectiveStatus`` values): ``("dev", TensorMeta)``,
    ``("err", ErrorValue)``, ``("host", value)``, ``("bad", type name)``.

    Returns ``(ERROR, ErrorValue)``, ``(HOST, [values])``, ``(DEVICE, TensorMeta)``.

    Raises:
        ValueError: device inputs differ in shape/dtype. CollectiveShapeError:
            reducescatter's dim 0 does not divide by the world size. TypeError: a mix of
            device and host inputs, or a value that is neither.

    Example:
        >>> from cgc.runtime.gpu.tensors import TensorMeta
        >>> m = TensorMeta((4,), "float32", 16)
        >>> collective_plan([("dev", m), ("dev", m)], "allreduce", 2)[0] == "dev"
        True
    """
    dev_, err_, host_, bad_ = (CollectiveStatus.DEVICE, CollectiveStatus.ERROR,
                               CollectiveStatus.HOST, CollectiveStatus.BAD)
    for kind_, payload in statuses:
        if kind_ == err_:
            return err_, payload
    real = list(enumerate(statuses))
    bad = [(r, s[1]) for r, s in real if s[0] == bad_]
    if bad:
        r, what = bad[0]
        raise TypeError(f"{kind}: rank {r} contributed a {what}, not a tensor or array")
    kinds = {s[0] for _, s in real}
    if kinds == {host_}:
        return host_, [s[1] for s in statuses]
    if kinds != {dev_}:
        dev = [r for r, s in real if s[0] == dev_]
        host = [r for r, s in real if s[0] == host_]
        raise TypeError(f"{kind}: ranks {dev} contributed device tensors and ranks {host} "
                        "host values; a collective needs one kind on every member")
    metas = [s[1] for _, s in real]
    first = metas[0]
    for (r, _), m in zip(real, metas, strict=True):
        if (m.shape, m.dtype) != (first.shape, first.dtype):
            raise ValueError(f"collective inputs differ: rank {real[0][0]} has "
                             f"{first.shape}/{first.dtype}, rank {r} has {m.shape}/{m.dtype}")
    if kind.startswith("reducescatter"):
        scatter_rows(first.shape, world)
    return dev_, first


class DeviceCommunicator(Communicator):
    """Rank ``transport.rank`` of a device communicator (see module doc).

    Args:
        transport: moves the bytes: a ``PostingTransport`` (NCCL, torch.distributed, the
            CPU stand-in) or a ``DescribingTransport`` (CUDA IPC).
        side: this rank's side-channels (same group, same rank).
        streams: the actor's ``ActorStreams`` (``NullStreams`` on CPU).
        name: for messages ("g3" or the plan communicator's name).
        timeout: default for calls that pass ``timeout=None`` (None: wait until closed).

    Raises:
        ValueError: side-channels and transport disagree on rank or world size.
        TypeError: the transport is of neither kind.
    """

    def __init__(self, transport: DeviceTransport, side: SideChannels,
                 streams: CommStreams | None = None, *, name: str = "",
                 timeout: float | None = None) -> None:
        if side.rank != transport.rank or side.world_size != transport.world_size:
            raise ValueError("side-channels and transport disagree on rank/world size")
        # The transport's kind, once: exactly one of these is the transport (module doc).
        self._posting = transport if isinstance(transport, PostingTransport) else None
        self._describing = (transport if isinstance(transport, DescribingTransport)
                            else None)
        if (self._posting is None) == (self._describing is None):
            raise TypeError(f"{type(transport).__name__} must be a PostingTransport or a "
                            "DescribingTransport")
        self.transport = transport
        self.side = side
        self.streams = streams if streams is not None else NullStreams()
        self.rank = transport.rank
        self.world_size = transport.world_size
        self.name = name or "device communicator"
        self.timeout = timeout
        self.last_event: Any = None
        self._aborted = False
        self._released = False
        # Ops in flight. One thread runs a rank's ops (the plan's order); other threads
        # only read it (abort/destroy), so a plain counter serves (a lock cost ~0.5 µs/op).
        self._busy = 0
        self._dummies: dict[TensorMeta, Any] = {}
        self._static: dict[tuple[tuple[int, ...], str], TensorMeta] = {}

    # ---------------------------------------------------------------- helpers
    def _t(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is None else timeout

    def _poll(self) -> None:
        if self._aborted:
            raise ChannelClosedError(f"{self.name}: rank {self.rank} was aborted")
        self.transport.check()

    def _check_peer(self, peer: int) -> None:
        if peer == self.rank or not 0 <= peer < self.world_size:
            raise ValueError(f"{self.name}: rank {self.rank}: bad peer {peer} "
                             f"(world size {self.world_size})")

    def _enter(self) -> None:
        if self._aborted or self._released:
            raise ChannelClosedError(f"{self.name}: rank {self.rank} was "
                                     f"{'aborted' if self._aborted else 'destroyed'}")
        self._busy += 1

    def _leave(self) -> None:
        self._busy -= 1

    def _static_meta(self, shape: Any, dtype: Any) -> TensorMeta:
        key = (tuple(int(d) for d in shape), str(dtype))
        m = self._static.get(key)
        if m is None:
            m = self._static[key] = static_meta(*key)
        return m

    def _dummy(self, meta: TensorMeta) -> Any:
        d = self._dummies.get(meta)
        if d is None:
            with self.streams.comm_context():
                d = self._dummies[meta] = self.transport.empty(meta)
                d.zero_()
        return d

    def _ready(self, tensors: Sequence[Any]) -> list[Any]:
        return comm_ready(self.streams, tensors)

    def _alloc(self, metas: Sequence[TensorMeta]) -> list[Any]:
        # Why on the comm stream: the comm stream writes these first; allocating them from
        # the compute stream's pool could hand out memory a queued kernel still reads.
        with self.streams.comm_context():
            out = [self.transport.empty(m) for m in metas]
        return out

    def _finish(self, received: Sequence[Any]) -> Any:
        """After a device op that produced ``received``: the comm event (``last_event``),
        their lifetime across streams, and the compute stream's wait when eager."""
        ev = self.streams.comm_done()
        self.last_event = ev
        self.streams.mark_compute_use(received)
        self.streams.received(ev)
        return ev

    def _recv_header(self, peer: int, timeout: float | None, tag: str) -> Header:
        hdr = self.side.recv(peer, timeout, self._poll)
        if not isinstance(hdr, Header):
            raise ChannelError(f"{self.name}: rank {self.rank} got a {type(hdr).__name__} "
                               f"from rank {peer} where a header belongs")
        if hdr.tag != tag:
            raise ChannelError(f"{self.name}: call order differs: rank {self.rank} runs {tag}, "
                               f"rank {peer} sent {hdr.tag}")
        return hdr

    # ---------------------------------------------------------------- p2p
    def send(self, value: Any, peer: int, timeout: float | None = None, *,
             shape: Any = None, dtype: Any = None) -> None:
        """Send ``value`` to rank ``peer`` (``shape``/``dtype``: the edge is static).

        Raises:
            ChannelTimeoutError: the peer's side-channel stayed full for ``timeout`` s.
            ChannelClosedError: aborted or destroyed. ValueError: bad peer.
        """
        self._check_peer(peer)
        self._enter()
        try:  # _t and _leave inlined on the two hot paths (a call is ~0.1 µs)
            self._send(value, peer, self.timeout if timeout is None else timeout, shape, dtype)
        finally:
            self._busy -= 1

    def _send(self, value: Any, peer: int, timeout: float | None, shape: Any,
              dtype: Any) -> None:
        smeta = self._static_meta(shape, dtype) if shape is not None and dtype else None
        hdr, tensors = header_for(value, "p2p", self.transport.is_device, smeta, self.name)
        tr = self._posting
        if tr is None:
            self._send_described(hdr, tensors, peer, timeout)
            return
        self.side.send(peer, hdr, timeout)
        if hdr.status == STATUS_ERROR:
            if smeta is None:
                return  # dynamic edge: the receiver posts nothing either
            tensors = [self._dummy(smeta)]
        sends = [(as_bytes(t), peer) for t in self._ready(tensors) if t.numel()]
        if sends:
            # No event, no compute-stream wait: nothing on this rank consumes a send; the
            # bytes stay valid (record_stream in _ready, comm-pool copies otherwise).
            tr.p2p(sends, ())

    def _send_described(self, hdr: Header, tensors: list[Any], peer: int,
                        timeout: float | None) -> None:
        """A describing transport's send: the bytes first, then the header saying where
        they are. An error needs no dummy: the receiver reads the header before posting."""
        tr = self._describing
        if tensors and hdr.status != STATUS_ERROR and tr is not None:
            tr.reserve(peer, timeout, self._poll)
            hdr = hdr._replace(ext=tr.put(peer, self._ready(tensors)))
        self.side.send(peer, hdr, timeout)

    def recv(self, peer: int, shape: Any = None, dtype: Any = None,
             timeout: float | None = None) -> Any:
        """The next value from rank ``peer`` (``shape``/``dtype`` given: a static edge whose
        receive is posted before the header arrives).

        Raises:
            ChannelTimeoutError: nothing within ``timeout`` s. ChannelClosedError: aborted.
            ChannelError: the peer runs a different op (call orders differ).
        """
        self._check_peer(peer)
        self._enter()
        try:
            return self._recv(peer, shape, dtype, self.timeout if timeout is None else timeout)
        finally:
            self._busy -= 1

    def _recv(self, peer: int, shape: Any, dtype: Any, timeout: float | None) -> Any:
        tr = self._posting
        meta = self._static_meta(shape, dtype) if shape is not None and dtype else None
        if meta is not None and tr is not None:
            (out,) = self._alloc([meta])
            if meta.nbytes:
                tr.p2p((), [(as_bytes(out), peer)])  # posted before the header is read
                self._finish([out])
            hdr = self._recv_header(peer, timeout, "p2p")
            if hdr.status == STATUS_ERROR:
                return hdr.error
            self._check_static(hdr, meta, peer)
            return out
        hdr = self._recv_header(peer, timeout, "p2p")
        if hdr.status == STATUS_ERROR:
            return hdr.error
        if meta is not None:
            self._check_static(hdr, meta, peer)
        if not hdr.metas:  # a host value: no stream, no transport (a stream context costs µs)
            return open_header(hdr, [])
        described = self._describing
        if described is not None:
            described.expect(peer, hdr.ext, timeout, self._poll)
            tensors = self._alloc(hdr.metas)
            described.take(peer, tensors)
            self._finish(tensors)
            return open_header(hdr, tensors)
        assert tr is not None  # exactly one of the two kinds (__init__)
        tensors = self._alloc(hdr.metas)
        recvs = [(as_bytes(t), peer) for t, m in zip(tensors, hdr.metas, strict=True)
                 if m.nbytes]
        if recvs:
            tr.p2p((), recvs)
            self._finish(tensors)
        return open_header(hdr, tensors)

    def _check_static(self, hdr: Header, meta: TensorMeta, peer: int) -> None:
        if hdr.metas != (meta,) or hdr.skeleton is not None:
            raise ChannelError(f"{self.name}: rank {peer} sent {hdr.metas} on a static "
                               f"edge declared {meta}")

    # ---------------------------------------------------------------- collectives
    def _status(self, value: Any) -> tuple[str, Any]:
        """This member's status word (a ``CollectiveStatus`` value, as it travels)."""
        if type(value) is ErrorValue:
            return CollectiveStatus.ERROR.value, value
        if self.transport.is_device(value):
            return CollectiveStatus.DEVICE.value, tensor_meta(value)
        if hasattr(value, "shape") and hasattr(value, "dtype"):
            return CollectiveStatus.HOST.value, value
        return CollectiveStatus.BAD.value, type(value).__name__

    def _agree(self, tag: str, value: Any,
               timeout: float | None) -> tuple[CollectiveStatus, Any]:
        mine = self._status(value)
        words = exchange(self.side, (tag, mine), timeout, self._poll)
        for r, (t, _) in enumerate(words):
            if t != tag:
                raise ChannelError(f"{self.name}: call order differs: rank {self.rank} runs "
                                   f"{tag}, rank {r} runs {t}")
        return collective_plan([w for _, w in words], tag, self.world_size)

    def _coll(self, tag: str, value: Any, timeout: float | None,
              run: Callable[[Any, TensorMeta], Any], op: ReduceOp | None = None) -> Any:
        self._enter()
        try:
            how, what = self._agree(tag, value, self._t(timeout))
            if how is CollectiveStatus.ERROR:
                return what
            if how is CollectiveStatus.HOST:  # every member gave host values: the host rule, here
                return combine(tag.split(".", 1)[0], what, op, self.rank, self.world_size)
            unsupported = self.transport.unsupported(what.dtype, _tag_op(tag))
            if what.dtype == "bool" and tag.endswith(".avg"):
                unsupported = "no average of booleans"
            if unsupported:
                raise TypeError(f"{self.name}: {tag} of {what.dtype}: {unsupported}")
            return run(value, what)
        finally:
            self._leave()

    def _input(self, value: Any) -> Any:
        return self._ready([value])[0]

    def allreduce(self, value: Any, op: ReduceOp | str = ReduceOp.SUM,
                  timeout: float | None = None) -> Any:
        """Elementwise ``op`` over all ranks; every rank gets the result (see module doc).

        Raises:
            ValueError: inputs differ between ranks. TypeError: mixed device/host inputs
            or a dtype the transport cannot reduce. ChannelError: call orders differ.
        """
        op = ReduceOp.of(op)

        def run(x: Any, meta: TensorMeta) -> Any:
            src = self._input(x)
            (out,) = self._alloc([meta])
            self.transport.allreduce(src, out, ReduceOp.SUM if op is ReduceOp.AVG else op)
            if op is ReduceOp.AVG:
                self._divide(out)
            self._finish([out])
            return out

        return self._coll(f"allreduce.{op.word}", value, timeout, run, op)

    def _divide(self, out: Any) -> None:
        with self.streams.comm_context():
            if out.is_floating_point() or out.is_complex():
                out.div_(self.world_size)
            else:
                out.div_(self.world_size, rounding_mode="floor")

    def allgather(self, value: Any, timeout: float | None = None) -> list[Any]:
        """Every rank's value in rank order: views ``out[r]`` of one ``(world, *shape)``
        buffer (device), or the host values themselves."""
        def run(x: Any, meta: TensorMeta) -> Any:
            src = self._input(x)
            full = TensorMeta((self.world_size, *meta.shape), meta.dtype,
                              meta.nbytes * self.world_size)
            (out,) = self._alloc([full])
            if meta.nbytes:
                self.transport.allgather(as_bytes(src), as_bytes(out))
            self._finish([out])
            return list(out.unbind(0))

        return self._coll("allgather", value, timeout, run)

    def reducescatter(self, value: Any, op: ReduceOp | str = ReduceOp.SUM,
                      timeout: float | None = None) -> Any:
        """Reduce over ranks, keep chunk ``rank`` of dim 0.

        Raises:
            CollectiveShapeError: dim 0 not divisible by the world size.
            ValueError: inputs differ between ranks.
        """
        op = ReduceOp.of(op)
        world = self.world_size

        def run(x: Any, meta: TensorMeta) -> Any:
            src = self._input(x)
            n = scatter_rows(meta.shape, world)
            part = TensorMeta((n, *meta.shape[1:]), meta.dtype, meta.nbytes // world)
            (out,) = self._alloc([part])
            self.transport.reducescatter(src, out, ReduceOp.SUM if op is ReduceOp.AVG else op)
            if op is ReduceOp.AVG:
                self._divide(out)
            self._finish([out])
            return out

        return self._coll(f"reducescatter.{op.word}", value, timeout, run, op)

    # ---------------------------------------------------------------- set-up
    def warm_up(self, peers: Sequence[int], timeout: float | None = 60.0,
                collective: bool = False) -> None:
        """One real 1-byte transfer each way with every rank in ``peers``, in one transport
        group (so NCCL makes the p2p connections now, not in the first execution), and a
        1-element allreduce when ``collective``. Every member calls it (peers symmetric);
        waits (polling, at set-up) until the device finished it.

        Raises:
            ChannelTimeoutError: not done within ``timeout``. NcclError: NCCL failed.
        """
        peers = sorted(set(peers) - {self.rank})
        one = TensorMeta((1,), "uint8", 1)
        self._enter()
        try:
            if peers:
                posting, describing = self._posting, self._describing
                bufs = self._alloc([one] * (1 if posting is None else len(peers) + 1))
                src = bufs.pop()
                with self.streams.comm_context():
                    src.zero_()
                if describing is not None:  # set up the pairs, then a value each way
                    describing.connect(peers, timeout)
                    for p in peers:
                        self._send(src, p, timeout, None, None)
                    for p in peers:
                        self._recv(p, None, None, timeout)
                elif posting is not None:
                    posting.p2p([(src, p) for p in peers],
                                list(zip(bufs, peers, strict=True)))
            if collective:
                (x,) = self._alloc([TensorMeta((1,), "float32", 4)])
                with self.streams.comm_context():
                    x.zero_()
                self.transport.allreduce(x, x, ReduceOp.SUM)
            ev = self.streams.comm_done()
            if ev is not None:
                wait_event(ev.query, timeout, self._poll, f"{self.name} warm-up")
        finally:
            self._leave()

    # ---------------------------------------------------------------- teardown
    def abort(self) -> None:
        """End every wait of this rank now, from any thread (blocked calls raise
        ChannelClosedError; peers reading from this rank wake up too). Idempotent; the
        owner's later ``destroy()`` releases what is left."""
        if self._aborted:
            return
        self._aborted = True
        self.side.poison()
        self.transport.abort()

    def destroy(self, linger: float = 2.0) -> None:
        """Release the communicator. Idempotent; safe from another thread: while an op is
        still running there (the executor wakes its loop this way) it only aborts, and the
        owner thread's next ``destroy()`` releases."""
        if self._released:
            return
        if self._busy:
            self.abort()
            return
        self._released = True
        try:
            if not self._aborted and not self.streams.drain(timeout=linger):
                self.transport.abort()  # device work still queued: do not wait for it
            self.transport.destroy(0 if self._aborted else linger)
        finally:
            self.side.close(linger=0 if self._aborted else linger)


def _tag_op(tag: str) -> ReduceOp | None:
    """The reduction a transport runs for collective ``tag`` (AVG runs as SUM, then a
    division on the comm stream); None for data movement."""
    if "." in tag:
        op = ReduceOp.of(tag.split(".", 1)[1])
        return ReduceOp.SUM if op is ReduceOp.AVG else op
    return None


def dtype_of(meta: TensorMeta) -> Any:
    """The torch dtype of ``meta``."""
    return torch_dtype(meta.dtype)
