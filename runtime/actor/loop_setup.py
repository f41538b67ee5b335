"""An actor loop's set-up rounds: its host channels, communicators, wake-ahead bells, warm-up.

The driver runs these through ``cgc.runtime.actor.entry`` (rounds 1-3, see
``cgc.runtime.actor.executor``); ``ActorLoop`` inherits them.

Example: ``loop.open_writers(tcp=set(), ip="10.0.0.1")`` -> ``{}`` (no TCP channels).
"""

from __future__ import annotations

from typing import Any

from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.defaults import ring_slot_bytes
from cgc.runtime.actor.loop_state import LoopState
from cgc.runtime.devices import plan_gives_gpu
from cgc.runtime.endpoints import communicator_prefix, open_host_reader, open_host_writer
from cgc.runtime.errors import SetupError
from cgc.runtime.messages import PING, Ping

__all__ = ["LoopSetup"]


def _spec_nbytes(ch: pb.Channel) -> int:
    """Bytes of one value of ``ch``'s declared tensor (0 when the plan declares none)."""
    if not ch.static_shape or not ch.spec.dtype or not ch.spec.shape:
        return 0
    from cgc.runtime.gpu.tensors import static_meta

    try:
        return static_meta(list(ch.spec.shape), ch.spec.dtype).nbytes
    except Exception:  # noqa: BLE001 - an unknown dtype: the edge stays dynamic
        return 0



class LoopSetup(LoopState):
    """Set-up of one actor's part of one graph (mixed into ``ActorLoop``)."""

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
                from cgc.runtime.comm.testing.fake_hosts import apply_fake_hosts

                apply_fake_hosts(f"{self.actor}-{self.gid}")
            from cgc.runtime.comm.binding import probe_gpu_uuid

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
                from cgc.runtime.comm.nccl import make_unique_id

                out[c.id] = make_unique_id()
        return out

    def open_readers_and_comms(self, timeout: float, addrs: dict[int, tuple[str, int]],
                               nccl_ids: dict[int, bytes] | None = None) -> None:
        # Connect first, accept after: every writer already listens (round 2), so connects
        # complete from the listen backlog and no two actors wait on each other here.
        me = next((a for a in self.plan.graph.actors if a.name == self.actor), None)
        for ch in self.my_channels()[1]:
            self.readers[ch.id] = open_host_reader(ch, self.prefix, self.actor,
                                                   addrs.get(ch.id), secret=self.opts.secret,
                                                   spin_us=self.spin_us, timeout=timeout,
                                                   max_frame_bytes=self.opts.max_frame_bytes,
                                                   reader_has_gpu=me is None or plan_gives_gpu(me))
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
        from cgc.runtime.comm.factory import open_device_communicator, options_for

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
        options = options_for(transport, unique_id=uid, init_timeout=timeout,
                              slot_bytes=max([*sizes, self.slot_bytes, 1 << 20]),
                              spin_us=self.spin_us)
        return open_device_communicator(
            transport, rank=list(comm.members).index(self.actor), world_size=len(comm.members),
            prefix=communicator_prefix(self.prefix, comm.id), streams=self.streams,
            options=options, name=f"communicator {comm.id} of {self.plan.name}")

    def warm(self, timeout: float) -> None:
        """Send one PING through every host edge this actor touches; warm each communicator
        (a real transfer per device p2p pair, the execution-0 sends/receives on CPU ones)."""
        for w in self.writers.values():
            w.write(PING, timeout)
        for cid, r in self.readers.items():
            v = r.read(timeout)
            if type(v) is not Ping:
                raise SetupError(f"{self.actor}: warm-up read {v!r} on channel {cid}")
        from cgc.runtime.comm.warmup import has_collectives, p2p_peers, warm_up

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
