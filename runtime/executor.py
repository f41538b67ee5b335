"""The per-actor executor: replays one actor's program in a loop thread inside the actor.

The driver drives set-up through ``actor.__ray_call__`` with the functions in
``cgc.runtime.actor_calls`` (each batched over all actors, one round at a time):

1. ``setup_probe``   - build the ``ActorLoop`` (resolve methods, decode constants); report
   node and pid.
2. ``setup_writers`` - create the writing end of every host channel this actor writes.
3. ``setup_start``   - attach readers, join communicators, warm every edge once (a PING
   per host channel, the execution-0 send/recv pairs per communicator), start the loop.
4. ``wait_loop``     - (in Ray's ``_ray_system`` concurrency group) returns when the loop
   exits, or fails when the actor dies: the driver's monitor waits on it. That group has
   one thread, so with several graphs on one actor a waiter also returns ("running") when
   another loop of the actor exits, letting the queued waiters have their turn.
5. ``stop_loop`` / ``where_blocked`` - teardown (waits for this graph's loop only) and hang
   reports.

Program semantics (docs/architecture.md): the prologue once (execution 0), then ``ops``
once per execution; an op with ``exec_offset = 1`` serves the next execution, so values
live in two tables (``tabs[0]`` for execution ``e``, ``tabs[1]`` for ``e + 1``) that rotate
after each iteration. A failing user method becomes an ``ErrorValue`` stored as every
output; a task with an ``ErrorValue`` input skips its call and forwards it.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.collective import ReduceOp
from cgc.plan_schema.defaults import MAX_FRAME_BYTES, ring_slot_bytes
from cgc.plan_schema.values import decode_value
from cgc.runtime.channels.errors import ChannelClosedError, ChannelTimeoutError, ErrorValue
from cgc.runtime.devices import move_to
from cgc.runtime.endpoints import communicator_prefix, open_host_reader, open_host_writer
from cgc.runtime.errors import DirectReturnError, SetupError, mro_names
from cgc.runtime.op_text import op_text
from cgc.runtime.ping_and_args import PING, Ping, input_attr

__all__ = ["ActorLoop", "LoopOptions", "LOOPS", "LOOPS_LOCK", "LOOPS_CHANGED", "EXITS",
           "TRACES"]


def _is_tensor(v: Any) -> bool:
    """One tensor as the channels carry it out of band: a torch tensor (any device) or a
    numpy array (``cgc.runtime.channels.serial``)."""
    np, torch = sys.modules.get("numpy"), sys.modules.get("torch")
    return ((np is not None and isinstance(v, np.ndarray))
            or (torch is not None and isinstance(v, torch.Tensor)))


def _what(v: Any) -> str:
    """``"a tuple of 2 values"``, ``"a dict"``: what a value is, for messages."""
    if isinstance(v, (tuple, list)):
        return f"a {type(v).__name__} of {len(v)} values"
    return "None" if v is None else f"a {type(v).__name__}"


def _no_settle(tab: dict, before: Any) -> None:
    """After a receive that needs no stream bookkeeping."""


def _spec_nbytes(ch: pb.Channel) -> int:
    """Bytes of one value of ``ch``'s declared tensor (0 when the plan declares none)."""
    if not ch.static_shape or not ch.spec.dtype or not ch.spec.shape:
        return 0
    from cgc.runtime.gpu.tensors import static_meta

    try:
        return static_meta(list(ch.spec.shape), ch.spec.dtype).nbytes
    except Exception:  # noqa: BLE001 - an unknown dtype: the edge stays dynamic
        return 0


def _static_kwargs(ch: pb.Channel) -> dict[str, Any]:
    """``shape``/``dtype`` for a device send/recv on a static edge, else nothing."""
    if ch.static_shape and ch.spec.dtype and len(ch.spec.shape):
        return {"shape": tuple(ch.spec.shape), "dtype": ch.spec.dtype}
    return {}

LOOPS: dict[str, ActorLoop] = {}  # graph id -> this process's loop for it
LOOPS_LOCK = threading.Lock()
# Notified (under LOOPS_LOCK) whenever a loop of this process exits.
LOOPS_CHANGED = threading.Condition(LOOPS_LOCK)
# graph id -> crash traceback (or None) of a loop that exited and whose waiter has not
# reported yet; bounded, oldest dropped (a waiter that never runs leaves its entry).
EXITS: dict[str, str | None] = {}
MAX_EXITS = 256
# graph id -> (prologue, loop) recorders of a traced loop; kept after the loop exits so the
# driver collects complete traces at teardown (cgc.runtime.actor_calls.collect_trace).
TRACES: dict[str, tuple[Any, Any]] = {}


@dataclass(frozen=True)
class LoopOptions:
    """What the driver decided at start that every actor's loop needs (sent in round 1).

    Attributes:
        prefix: the graph's unguessable name prefix (channel and communicator names).
        secret: the graph's key for TCP channel set-up proofs (travels only in Ray's own,
            authenticated set-up calls).
        spin_us: busy-wait before a channel wait sleeps.
        slot_bytes: initial slot size for channels whose plan entry names none.
        fake_hosts: test-only: this actor joins NCCL as a host of its own
            (``cgc.runtime.gpu.binding.apply_fake_hosts``).
        probe_gpu: report this actor's GPU in round 1 (False: no GPU transport possible).
        trace: record a time slice per op (``cgc.runtime.trace``).
        torch_profile: directory for a torch profiler trace of the loop ("" = off).
        nvtx: an NVTX range around every op (``cgc.runtime.profiling``).
        ray_events: keep Ray's per-task profiling records on the actor
            (``cgc.runtime.ray_events``).
        wake_ahead: how many depths ahead of itself an actor rings when it starts work
            (0 = wake-ahead off); the depths are the plan's (``Program.wake_depth``).
        max_frame_bytes: the largest value this actor's TCP channels carry.
        cuda_graphs: replay the plan's captured ops (``Program.captured_ops``) as CUDA
            graphs where the actor has CUDA (False: run them eagerly).
    """

    prefix: str
    secret: bytes = b""
    spin_us: float = 0.0
    slot_bytes: int = 0
    fake_hosts: bool = False
    probe_gpu: bool = False
    trace: bool = False
    torch_profile: str = ""
    nvtx: bool = False
    ray_events: bool = False
    wake_ahead: int = 0
    max_frame_bytes: int = MAX_FRAME_BYTES
    cuda_graphs: bool = True


class ActorLoop:
    """One actor's part of one graph: endpoints, compiled ops, and the loop thread."""

    def __init__(self, gid: str, plan: pb.Plan, actor: str, obj: Any,
                 opts: LoopOptions) -> None:
        self.gid, self.plan, self.actor, self.obj = gid, plan, actor, obj
        self.opts = opts
        self.prefix = opts.prefix
        self.spin_us = opts.spin_us
        self.slot_bytes = opts.slot_bytes
        idx = [a.name for a in plan.graph.actors].index(actor)
        self.program = plan.lowered.programs[idx]
        self.writers: dict[int, Any] = {}
        self.readers: dict[int, Any] = {}
        self.comms: dict[int, Any] = {}
        # communicator id -> "nccl" | "cuda_ipc" | "host_staging" | "cpu", bound by the
        # driver from where the members landed (cgc.runtime.gpu.binding; set in round 2)
        self.transports: dict[int, str] = {}
        self.streams: Any = None  # the actor's CUDA streams once a device communicator opens
        self._deferred: set[tuple[int, int]] = set()
        self.exec = 0
        self.pc = -1
        self.in_prologue = True
        self.crash: str | None = None
        self.stopping = False
        self.exited = threading.Event()
        self.thread: threading.Thread | None = None
        self.tabs: list[dict] = [{}, {}]
        self.bells: Any = None  # cgc.runtime.channels.bell.Bells when wake-ahead is on
        self._methods: dict[int, Any] = {}
        self._direct: dict[int, set[int]] | None = None
        for op in list(self.program.prologue) + list(self.program.ops):
            if op.kind == pb.COMPUTE and op.task not in self._methods:
                node = plan.graph.nodes[op.task]
                fn = getattr(obj, node.method, None)
                if not callable(fn):
                    raise SetupError(
                        f"actor {actor} ({type(obj).__qualname__}) has no method "
                        f"{node.method!r} (task {node.name})"
                    )
                self._methods[op.task] = fn
        self.captured = self._wrap_captured(actor) if opts.cuda_graphs else {}

    def _wrap_captured(self, actor: str) -> dict[str, Any]:
        """Replace the methods of the plan's captured ops by their CUDA-graph replayers
        (``cgc.runtime.gpu.graphs``); without CUDA here they stay eager."""
        if not self.program.captured_ops or "torch" not in sys.modules:
            return {}
        import torch

        if not torch.cuda.is_available():
            return {}
        from cgc.runtime.gpu.graphs import CapturedCall

        out: dict[str, Any] = {}
        for i in self.program.captured_ops:
            task = self.program.ops[i].task
            name = self.plan.graph.nodes[task].name
            call = CapturedCall(self._methods[task], name)
            self._methods[task] = out[name] = call
        return out

    def graph_stats(self) -> dict[str, Any]:
        """Per captured call: captures, replays, eager runs and why (empty: none)."""
        return {name: c.stats.as_dict() for name, c in self.captured.items()}

    # ------------------------------------------------------------------ set-up
    def my_channels(self) -> tuple[list[pb.Channel], list[pb.Channel]]:
        """Host channels this actor writes, and those it reads."""
        chans = [c for c in self.plan.lowered.channels if c.kind == pb.CHAN_HOST]
        return ([c for c in chans if c.writer == self.actor],
                [c for c in chans if self.actor in c.readers])

    def open_writers(self, tcp: set[int], ip: str) -> dict[int, tuple[str, int]]:
        """Create this actor's writers; return ``(ip, port)`` of its TCP ones."""
        addrs = {}
        for ch in self.my_channels()[0]:
            w = self.writers[ch.id] = open_host_writer(
                ch, self.prefix, tcp=ch.id in tcp, ip=ip, secret=self.opts.secret,
                spin_us=self.spin_us, default_slot_bytes=self.slot_bytes,
                max_frame_bytes=self.opts.max_frame_bytes)
            if ch.id in tcp:
                addrs[ch.id] = (ip, w.port)
        return addrs

    def probe(self) -> dict[str, Any]:
        """Round 1: what the driver needs to bind this actor's communicators.

        The GPU is looked up only when a GPU transport is possible (``opts.probe_gpu``) and
        this actor is in some communicator: importing torch and CUDA costs seconds.
        """
        gpu = None
        if self.opts.probe_gpu and self.my_comms():
            if self.opts.fake_hosts:  # before this process's first NCCL call
                from cgc.runtime.gpu.binding import apply_fake_hosts

                apply_fake_hosts(f"{self.actor}-{self.gid}")
            from cgc.runtime.gpu.binding import probe_gpu_uuid

            gpu = probe_gpu_uuid()
        return {"gpu": gpu}

    def my_comms(self) -> list[pb.Communicator]:
        """The plan communicators this actor is a member of, in plan (id) order."""
        return [c for c in self.plan.lowered.communicators if self.actor in c.members]

    def make_nccl_ids(self) -> dict[int, bytes]:
        """Round 2: a fresh NCCL unique id for every NCCL-bound communicator this actor is
        rank 0 of (the driver hands them to the other members in round 3)."""
        out = {}
        for c in self.my_comms():
            if self.transports.get(c.id) == "nccl" and c.members[0] == self.actor:
                from cgc.runtime.gpu.nccl import make_unique_id

                out[c.id] = make_unique_id()
        return out

    def open_readers_and_comms(self, timeout: float, addrs: dict[int, tuple[str, int]],
                               nccl_ids: dict[int, bytes] | None = None) -> None:
        # Connect first, accept after: every writer already listens (round 2), so connects
        # complete from the listen backlog and no two actors wait on each other here.
        for ch in self.my_channels()[1]:
            self.readers[ch.id] = open_host_reader(ch, self.prefix, self.actor,
                                                   addrs.get(ch.id), secret=self.opts.secret,
                                                   spin_us=self.spin_us, timeout=timeout,
                                                   max_frame_bytes=self.opts.max_frame_bytes)
        self._attach_bells()
        for cid, w in self.writers.items():
            if cid in addrs:
                w.accept(timeout)
        # Plan order: creating a communicator waits for all its members, and every actor
        # goes through its communicators in ascending id, so no two wait on each other.
        for comm in self.my_comms():
            self.comms[comm.id] = self._open_comm(comm, timeout, (nccl_ids or {}).get(comm.id))

    def _attach_bells(self) -> None:
        """Wake-ahead: this actor's shared-memory readers also wait on its depth's bell."""
        depth = self.program.wake_depth
        if not depth or not self.opts.wake_ahead:
            return
        from cgc.runtime.channels.bell import Bells

        try:
            self.bells = Bells.attach(self.prefix + "bell")
        except FileNotFoundError:
            return  # another node than the driver's: no wake-ahead here
        for r in self.readers.values():
            if hasattr(r, "set_bell"):
                r.set_bell(self.bells, depth)

    def _ring_ahead(self, ops: list[Any]) -> list[Any]:
        """Ring the bell ``wake_ahead`` depths below this actor as its first compute op of
        each execution starts (the data front has reached this actor)."""
        if self.bells is None:
            return ops
        target = self.program.wake_depth + self.opts.wake_ahead
        first = next((i for i, o in enumerate(self.program.ops) if o.kind == pb.COMPUTE), None)
        if first is None or target > self.bells.depths:
            return ops
        op, ring = ops[first], self.bells.ring

        def rung() -> None:
            ring(target)
            op()

        return [*ops[:first], rung, *ops[first + 1:]]

    def _open_comm(self, comm: pb.Communicator, timeout: float, uid: bytes | None) -> Any:
        from cgc.runtime.gpu.factory import open_device_communicator

        transport = self.transports[comm.id]
        if transport != "cpu" and self.streams is None:
            from cgc.runtime.gpu.streams import actor_streams

            # Ops the overlap pass put on the comm stream leave the compute stream's wait
            # to the op that uses the value (deferred); otherwise the receive waits itself.
            deferred = any(o.stream == pb.COMM_STREAM for o in self.program.ops)
            self.streams = actor_streams(eager_wait=not deferred)
        # CUDA IPC slots start at the largest value the plan declares for the group's edges
        # (a declared tensor, else the channel's slot size by the schema's rule), and at
        # 1 MiB at least: a value larger than its slot regrows the slot, a device
        # allocation and a handle exchange.
        sizes = [_spec_nbytes(ch) or ring_slot_bytes(ch.slot_bytes, self.slot_bytes)
                 for ch in self.plan.lowered.channels
                 if ch.kind == pb.CHAN_NCCL and ch.communicator == comm.id]
        return open_device_communicator(
            transport, rank=list(comm.members).index(self.actor), world_size=len(comm.members),
            prefix=communicator_prefix(self.prefix, comm.id), streams=self.streams,
            unique_id=uid, slot_bytes=max([*sizes, self.slot_bytes, 1 << 20]),
            init_timeout=timeout, name=f"communicator {comm.id} of {self.plan.name}")

    def warm(self, timeout: float) -> None:
        """Send one PING through every host edge this actor touches; warm each communicator
        (a real transfer per device p2p pair, the execution-0 sends/receives on CPU ones)."""
        for w in self.writers.values():
            w.write(PING, timeout)
        for cid, r in self.readers.items():
            v = r.read(timeout)
            if type(v) is not Ping:
                raise SetupError(f"{self.actor}: warm-up read {v!r} on channel {cid}")
        from cgc.runtime.gpu.warmup import has_collectives, p2p_peers, warm_up

        transports = self.transports
        for cid in sorted(self.comms):  # device groups: plan order, see open_readers_and_comms
            if transports[cid] != "cpu":
                warm_up(self.comms[cid], p2p_peers(self.plan, cid, self.actor), timeout,
                        collective=has_collectives(self.plan, cid))
        low = self.plan.lowered
        ex0 = list(self.program.prologue) + [o for o in self.program.ops if o.exec_offset == 0]
        for op in ex0:
            if op.kind in (pb.SEND, pb.RECV) and transports[op.communicator] == "cpu":
                comm = self.comms[op.communicator]
                peer = list(low.communicators[op.communicator].members).index(op.peer)
                if op.kind == pb.SEND:
                    comm.send(PING, peer)
                else:
                    comm.recv(peer)

    # ------------------------------------------------------------------ compile
    def _compile(self, ops: Any, prologue: bool) -> list[Any]:
        return [self._compile_op(op, 0 if prologue else op.exec_offset) for op in ops]

    def _compile_op(self, op: pb.Op, off: int) -> Any:
        tabs, low, graph = self.tabs, self.plan.lowered, self.plan.graph
        if op.kind == pb.READ:
            ch = low.channels[op.channel - 1]
            read, key = self.readers[ch.id].read, (ch.source.node, ch.source.output_index)
            derive = [((n, 0), graph.nodes[n].index,
                       graph.nodes[n].field if graph.nodes[n].key_kind == pb.FIELD else None)
                      for n in op.extract]
            if not derive:
                def do_read() -> None:
                    tabs[off][key] = read()
                return do_read

            def do_read_whole() -> None:
                tab = tabs[off]
                whole = tab[key] = read()
                for akey, index, field in derive:
                    try:
                        tab[akey] = input_attr(whole, index, field)
                    except Exception as exc:  # noqa: BLE001 - a bad input is the caller's error
                        tab[akey] = self._error(exc, "<input>", off)
            return do_read_whole
        if op.kind == pb.WRITE:
            write, key = self.writers[op.channel].write, (op.task, op.output_index)
            method = graph.nodes[op.task].method or graph.nodes[op.task].name
            ready = self._waiter([key])
            # Readers that get host tensors (device="cpu") are sent host copies: one copy
            # here, and no reader (the driver, say) touches a GPU just to move the value
            # off it - on a GPU shared without MPS that costs every process a context switch.
            to_host = low.channels[op.channel - 1].device == pb.CPU

            def do_write() -> None:
                if ready is not None:  # serializing reads a received tensor on compute
                    ready(tabs[off])
                value = tabs[off][key]
                if to_host:
                    value = move_to(value, "cpu")
                try:
                    write(value)
                except (ChannelClosedError, ChannelTimeoutError):
                    raise
                except Exception as exc:  # noqa: BLE001 - unpicklable result: nothing was written
                    bad = TypeError(f"the result of {self.actor}.{method} cannot be sent "
                                    f"({type(value).__name__}): {exc}")
                    write(self._error(bad, method, off))
            return do_write
        if op.kind == pb.COMPUTE:
            return self._compile_compute(graph.nodes[op.task], off)
        if op.kind in (pb.SEND, pb.RECV):
            ch = low.channels[op.channel - 1]
            cdesc = low.communicators[op.communicator]
            comm, peer = self.comms[cdesc.id], list(cdesc.members).index(op.peer)
            # A declared shape/dtype lets a device receiver post its receive before the
            # header arrives (and the sender check the value against the declaration).
            static = (_static_kwargs(ch)
                      if self.transports[cdesc.id] != "cpu" else {})
            if op.kind == pb.SEND:
                send, key = comm.send, (op.task, op.output_index)

                def do_send() -> None:
                    send(tabs[off][key], peer, **static)
                return do_send
            recv, key = comm.recv, (ch.source.node, ch.source.output_index)
            settle = self._settler(comm, key, op)
            if settle is _no_settle:
                def do_recv() -> None:
                    tabs[off][key] = recv(peer, **static)
                return do_recv

            def do_recv_settled() -> None:
                tab = tabs[off]
                before = comm.last_event
                tab[key] = recv(peer, **static)
                settle(tab, before)
            return do_recv_settled
        if op.kind == pb.COLL:
            return self._compile_coll(graph.nodes[op.task], op.communicator, off)
        raise SetupError(f"{self.actor}: unknown op kind {op.kind} in its program")

    def _settler(self, comm: Any, key: tuple[int, int], op: pb.Op) -> Callable[[dict, Any], None]:
        """What runs after a device receive or collective stored ``key``.

        With deferred waits (``ActorStreams.eager_wait`` off) the received value's comm
        event is kept beside it in the table; the first compute-stream op that uses the
        value waits for it there (``_waiter``). An op the plan left on the compute stream
        makes the compute stream wait at once. Host communicators move nothing on a device.
        """
        streams = self.streams
        if (streams is None or streams.eager_wait
                or self.transports[op.communicator] == "cpu"):
            return _no_settle
        evkey = ("ev", *key)
        if key in self._deferred:
            def keep(tab: dict, before: Any) -> None:
                ev = comm.last_event
                if ev is not before:
                    tab[evkey] = ev
            return keep

        def wait_now(tab: dict, before: Any) -> None:
            ev = comm.last_event
            if ev is not before:
                streams.compute_after(ev)
        return wait_now

    def _find_deferred(self) -> set[tuple[int, int]]:
        """Values received on the comm stream whose compute-stream wait is left to their
        first user: outputs of RECV/COLL ops the plan put on ``COMM_STREAM`` when this
        actor's streams defer waits."""
        if self.streams is None or self.streams.eager_wait:
            return set()
        low, out = self.plan.lowered, set()
        for o in list(self.program.prologue) + list(self.program.ops):
            if o.stream != pb.COMM_STREAM or self.transports[o.communicator] == "cpu":
                continue
            if o.kind == pb.RECV:
                src = low.channels[o.channel - 1].source
                out.add((src.node, src.output_index))
            elif o.kind == pb.COLL:
                out.add((o.task, 0))
        return out

    def _waiter(self, keys: list[tuple[int, int]]) -> Callable[[dict], None] | None:
        """Before a compute-stream op that uses ``keys``: wait for the deferred receives
        among them (None when none is deferred; see ``_settler``)."""
        evkeys = [("ev", *k) for k in keys if k in self._deferred]
        if not evkeys:
            return None
        compute_after = self.streams.compute_after

        def wait(tab: dict) -> None:
            for ek in evkeys:
                ev = tab.pop(ek, None)
                if ev is not None:
                    compute_after(ev)
        return wait

    def _op_of_task(self, task: int) -> pb.Op:
        """This actor's COLL op of collective node ``task``."""
        for o in list(self.program.prologue) + list(self.program.ops):
            if o.kind == pb.COLL and o.task == task:
                return o
        raise SetupError(f"{self.actor}: no COLL op for task {task}")

    def _error(self, exc: BaseException, method: str, off: int) -> ErrorValue:
        tb = exc.__traceback__
        if tb is not None and tb.tb_next is not None:  # drop the executor's own frame
            exc = exc.with_traceback(tb.tb_next)
        return ErrorValue.from_exception(exc, actor=self.actor, method=method,
                                         exec_index=self.exec + off, mro=mro_names(exc))

    def _direct_outputs(self) -> dict[int, set[int]]:
        """task -> its outputs on a direct_return edge (one pass over the channels, made
        once: per task it would cost tasks x channels)."""
        if self._direct is None:
            self._direct = {}
            for ch in self.plan.lowered.channels:
                if ch.direct_return:
                    self._direct.setdefault(ch.source.node, set()).add(ch.source.output_index)
        return self._direct

    def _compile_compute(self, node: pb.Node, off: int) -> Any:
        tabs, fn, method, task = self.tabs, self._methods[node.id], node.method, node.id
        where = f"node %{node.id} ({node.name})"
        specs = [(True, (a.ref.node, a.ref.output_index)) if a.WhichOneof("kind") == "ref"
                 else (False, decode_value(a.constant, f"{where} args[{i}]"))
                 for i, a in enumerate(node.args)]
        kspecs = [(kw.name, kw.arg.WhichOneof("kind") == "ref",
                   (kw.arg.ref.node, kw.arg.ref.output_index)
                   if kw.arg.WhichOneof("kind") == "ref"
                   else decode_value(kw.arg.constant, f"{where} kwargs[{kw.name!r}]"))
                  for kw in node.kwargs]
        nret = node.num_returns or 1
        outs = [(task, i) for i in range(nret)]
        ev_type = ErrorValue
        # Outputs on an edge the plan declares direct_return: each must be one tensor.
        direct = sorted(self._direct_outputs().get(task, ()))
        ready = self._waiter([v for r, v in specs if r] + [v for _, r, v in kspecs if r])

        def do_compute() -> None:
            tab = tabs[off]
            if ready is not None:
                ready(tab)
            args = [tab[v] if r else v for r, v in specs]
            kwargs = {n: (tab[v] if r else v) for n, r, v in kspecs} if kspecs else {}
            err = None
            for v in args:
                if type(v) is ev_type:
                    err = v
                    break
            else:
                for v in kwargs.values():
                    if type(v) is ev_type:
                        err = v
                        break
            if err is None:
                try:
                    result = fn(*args, **kwargs)
                except Exception as exc:  # noqa: BLE001 - app errors travel as values
                    err = self._error(exc, method, off)
            if err is not None:
                for k in outs:
                    tab[k] = err
            elif nret == 1:
                tab[outs[0]] = result
            elif isinstance(result, (tuple, list)) and len(result) == nret:
                for k, v in zip(outs, result, strict=True):
                    tab[k] = v
            else:
                got = f"{len(result)} values" if isinstance(result, (tuple, list)) else \
                    f"a {type(result).__name__}"
                bad = ValueError(f"{node.name} returned {got}, the plan expects {nret} "
                                 f"(num_returns={nret})")
                for k in outs:
                    tab[k] = self._error(bad, method, off)
            for i in direct:
                v = tab[outs[i]]
                if type(v) is not ev_type and not _is_tensor(v):
                    tab[outs[i]] = self._error(DirectReturnError(
                        f"{node.name} ({type(self.obj).__qualname__}.{method}) returned "
                        f"{_what(v)} as output {i}, but the plan declares that edge "
                        "direct_return: exactly one tensor (a torch.Tensor or a numpy array), "
                        "never wrapped; return one tensor or drop _direct_return"), method, off)
        return do_compute

    def _compile_coll(self, node: pb.Node, communicator: int, off: int) -> Any:
        graph, low, tabs = self.plan.graph, self.plan.lowered, self.tabs
        coll = graph.collectives[node.collective]
        cdesc = low.communicators[communicator]  # the plan's choice (verified at start)
        comm = self.comms[cdesc.id]
        a = node.args[0]
        in_key, out_key = (a.ref.node, a.ref.output_index), (node.id, 0)
        red, kind = ReduceOp(coll.reduce_op), coll.kind
        coll_name = node.name.removeprefix(f"{self.actor}.")  # errors say "<actor>.<this>"
        # Every communicator runs the collective itself, with the one rule of
        # cgc.runtime.channels.collective; an upstream error on any member comes back as
        # every member's result (errors are agreed on before any device op).
        native = {pb.ALLREDUCE: lambda x: comm.allreduce(x, red),
                  pb.ALLGATHER: comm.allgather,
                  pb.REDUCESCATTER: lambda x: comm.reducescatter(x, red)}[kind]
        if self.transports[cdesc.id] != "cpu":
            settle = self._settler(comm, out_key, self._op_of_task(node.id))

            def run(x: Any) -> Any:
                before = comm.last_event
                out = native(x)
                settle(tabs[off], before)
                return out
        else:
            run = native

        def do_coll() -> None:
            tab = tabs[off]
            try:
                tab[out_key] = run(tab[in_key])
            except ChannelClosedError:
                raise
            except Exception as exc:  # noqa: BLE001 - e.g. shapes that differ by member
                tab[out_key] = self._error(exc, coll_name, off)
        return do_coll

    # ------------------------------------------------------------------ loop
    def start(self) -> None:
        self._deferred = self._find_deferred()
        prologue = self._compile(self.program.prologue, True)
        ops = self._ring_ahead(self._compile(self.program.ops, False))
        if self.opts.trace:
            from cgc.runtime.trace import Recorder, traced

            pro_rec, ops_rec = Recorder(), Recorder()
            with LOOPS_LOCK:
                TRACES[self.gid] = (pro_rec, ops_rec)
            offs = [o.exec_offset for o in self.program.ops]

            def exec_of(off: int) -> Callable[[], int]:
                return lambda: self.exec + off

            prologue = [traced(op, i, exec_of(0), pro_rec)  # the prologue runs as execution 0
                        for i, op in enumerate(prologue)]
            ops = [traced(op, i, exec_of(offs[i]), ops_rec) for i, op in enumerate(ops)]
        if self.opts.ray_events:
            from cgc.runtime.ray_events import record_ray_events

            ops = record_ray_events(ops, self.program, self.plan, self.obj)
        if self.opts.nvtx:
            from cgc.runtime.profiling import nvtx_wrap, require_nvtx

            nv = require_nvtx()
            prologue = [nvtx_wrap(op, op_text(o, self.plan), nv)
                        for op, o in zip(prologue, self.program.prologue, strict=True)]
            ops = [nvtx_wrap(op, op_text(o, self.plan), nv)
                   for op, o in zip(ops, self.program.ops, strict=True)]
        prefetch = any(o.exec_offset for o in self.program.ops)
        self.thread = threading.Thread(target=self._run, args=(prologue, ops, prefetch),
                                       name=f"cgc-loop-{self.actor}-{self.gid}", daemon=True)
        self.thread.start()

    def _run(self, prologue: list[Any], ops: list[Any], prefetch: bool) -> None:
        tabs = self.tabs
        profiler: Any = contextlib.nullcontext()
        if self.opts.torch_profile:
            from cgc.runtime.profiling import torch_profile

            profiler = torch_profile(self.opts.torch_profile, self.plan.name, self.actor)
        try:
            with profiler:
                self._replay(prologue, ops, prefetch)
        except ChannelClosedError:
            pass  # teardown or a poisoned peer: the normal way out
        except BaseException:  # noqa: BLE001 - an executor bug: report it, wake the others
            import traceback

            self.crash = traceback.format_exc()
            self.poison()
        finally:
            tabs[0].clear()
            tabs[1].clear()
            self.close()
            self.exited.set()
            with LOOPS_LOCK:
                LOOPS.pop(self.gid, None)
                EXITS[self.gid] = self.crash
                while len(EXITS) > MAX_EXITS:
                    EXITS.pop(next(iter(EXITS)))
                LOOPS_CHANGED.notify_all()

    def _replay(self, prologue: list[Any], ops: list[Any], prefetch: bool) -> None:
        """The prologue once, then the ops once per execution until a channel closes."""
        tabs = self.tabs
        for self.pc, op in enumerate(prologue):
            op()
        self.in_prologue = False
        while True:
            for self.pc, op in enumerate(ops):
                op()
            self.exec += 1
            if prefetch:
                tabs[0] = tabs[1]
                tabs[1] = {}
            else:
                tabs[0].clear()

    def poison(self) -> None:
        """Wake every blocked op of this loop (they raise ChannelClosedError)."""
        for ep in list(self.writers.values()) + list(self.readers.values()):
            try:
                ep.poison()
            except Exception:  # noqa: BLE001 - already closed
                pass
        for comm in list(self.comms.values()):
            try:  # abort ends a device wait at once (NCCL has no timeouts of its own)
                comm.abort()
            except Exception:  # noqa: BLE001
                pass

    def close(self) -> None:
        """Close writers (unlinks their segments), detach readers, destroy communicators."""
        for w in self.writers.values():
            try:
                w.close()
            except Exception:  # noqa: BLE001
                pass
        for r in self.readers.values():
            try:
                r.detach()
            except Exception:  # noqa: BLE001
                pass
        for comm in self.comms.values():
            try:
                comm.destroy()
            except Exception:  # noqa: BLE001
                pass
        self.writers, self.readers, self.comms = {}, {}, {}
        for call in self.captured.values():  # graphs and their memory pools
            call.reset()
        if self.bells is not None:
            self.bells.close()
            self.bells = None

    def where(self) -> dict[str, Any]:
        """Where the loop is: ``{"actor", "execution", "op", "token", "waiting"}``."""
        ops = self.program.prologue if self.in_prologue else self.program.ops
        row: dict[str, Any] = {"actor": self.actor, "execution": self.exec, "op": "",
                               "token": "", "waiting": ""}
        if self.exited.is_set():
            return {**row, "waiting": "loop exited"}
        if not 0 <= self.pc < len(ops):
            return {**row, "waiting": "starting"}
        op = ops[self.pc]
        low = self.plan.lowered
        row["execution"] = self.exec + (op.exec_offset if not self.in_prologue else 0)
        row["op"] = f"{'prologue ' if self.in_prologue else ''}{self.pc}"
        row["token"] = op_text(op, self.plan)
        if op.kind == pb.READ:
            doing = f"a value on channel c{op.channel} from {low.channels[op.channel - 1].writer}"
        elif op.kind == pb.WRITE:
            readers = ", ".join(low.channels[op.channel - 1].readers)
            doing = f"room on channel c{op.channel} (readers {readers})"
        elif op.kind in (pb.SEND, pb.RECV):
            side = "to" if op.kind == pb.SEND else "from"
            doing = (f"rendezvous {side} {op.peer} on communicator {op.communicator} "
                     f"(c{op.channel}, seq {op.seq})")
        elif op.kind == pb.COMPUTE:
            doing = f"the method {self.plan.graph.nodes[op.task].method} to return"
        else:
            doing = (f"the other members of the collective on communicator "
                     f"{op.communicator} (seq {op.seq})")
        row["waiting"] = doing
        return row
