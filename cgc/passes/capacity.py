"""Pass ``capacity``: per-channel ring depths from the pipeline depth, and the capacity.

The stage of a task is the longest path to it counted in actor changes (the driver's
inputs are stage 0). With ``D`` stages the plan can usefully hold ``D + 1`` executions in
flight (one per stage, plus the one the driver is submitting), clamped to [2, 8]:

* input channels and channels the driver reads get ``capacity`` slots, so ``execute()``
  never blocks in the middle of a submission and finished results never block an actor;
* an internal host channel from stage ``s`` to readers up to stage ``t`` gets
  ``min(capacity, t - s + 1)`` slots: a skip connection buffers while the stages between
  work, a neighbour edge is double-buffered;
* NCCL channels are rendezvous and keep 1.

Capacity is then ``min(slots of the output channels)``: with that many executions in
flight every output fits in its ring, so actors never wait on the driver and the
driver's input writes always drain. ``LowerOptions.slots`` / ``capacity`` override,
within ``Limits.capacity`` / ``Limits.slots``; the shared memory all rings reserve must
stay within ``Limits.ring_bytes``. This is the only place capacity is computed: the
verifier checks that every driver channel holds it, and the runtime applies it as is.
"""

from __future__ import annotations

from cgc.errors import CompileError
from cgc.ir import attrs as A
from cgc.passes.state import LowerState, require
from cgc.plan_schema import DRIVER
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.defaults import ring_slot_bytes

__all__ = ["assign_capacity", "pre", "post", "MAX_CAPACITY"]

_NAME = "capacity"
MAX_CAPACITY = 8


def _stages(state: LowerState) -> dict[int, int]:
    g = state.g
    stage: dict[int, int] = {}
    for n in sorted(g.nodes):  # node ids are topological
        s = 0
        for p in g.predecessors(n):
            hop = g.nodes[p][A.ACTOR] != g.nodes[n][A.ACTOR] and g.nodes[p][A.ACTOR] != DRIVER
            s = max(s, stage[p] + hop)
        stage[n] = s
    return stage


def _check_option(value: int | None, limit: int, name: str) -> None:
    if value is not None and not 1 <= value <= limit:
        raise CompileError(
            f"{name}={value} is outside 1..{limit} (Limits.{name}; pass LowerOptions(limits=...) "
            "if you have a real reason)"
        )


def _check_ring_bytes(state: LowerState) -> None:
    low, limit = state.lowered, state.options.limits.ring_bytes
    default = state.plan.config.default_slot_bytes  # 0 until pass config: the table's

    def ring(ch: pb.Channel) -> int:  # what the runtime reserves: the rule of the schema
        return ch.slots * ring_slot_bytes(ch.slot_bytes, default)

    host = [ch for ch in low.channels if ch.kind == pb.CHAN_HOST]
    total = sum(ring(ch) for ch in host)
    if total > limit:
        big = sorted(host, key=lambda ch: (-ring(ch), ch.id))[:3]
        names = ", ".join(
            f"c{ch.id} ({ch.slots} x {ring_slot_bytes(ch.slot_bytes, default):,} bytes)"
            for ch in big)
        raise CompileError(
            f"the channels' rings would reserve {total:,} bytes of shared memory, above "
            f"Limits.ring_bytes = {limit:,} (largest: {names}); lower the capacity or the "
            "declared tensor sizes"
        )


def assign_capacity(state: LowerState) -> None:
    """Set ``Channel.slots`` on every channel and ``config.capacity``.

    Example: a two-stage pipeline gets capacity 3 and double-buffered stage channels.

    Raises:
        CompileError: a forced capacity or slot count outside its limit, or rings that
            would reserve more shared memory than ``Limits.ring_bytes``.
    """
    g, low, opts = state.g, state.lowered, state.options
    _check_option(opts.capacity, opts.limits.capacity, "capacity")
    _check_option(opts.slots, opts.limits.slots, "slots")
    stage = state.stage = _stages(state)
    tasks = [n for n in g.nodes if g.nodes[n][A.KIND] in (pb.CALL, pb.COLLECTIVE)]
    depth = 1 + max((stage[t] for t in tasks), default=0)
    if opts.capacity is not None:
        cap = opts.capacity
    elif opts.slots is not None:
        cap = opts.slots
    else:
        cap = min(MAX_CAPACITY, max(2, depth + 1))
    for ch in low.channels:
        if ch.kind == pb.CHAN_NCCL:
            ch.slots = 1
        elif opts.slots is not None:
            ch.slots = opts.slots
        elif ch.writer == DRIVER or DRIVER in ch.readers:
            ch.slots = cap
        else:
            src = ch.source.node
            readers = [
                d
                for _, d, k in g.out_edges(src, keys=True)
                if k == ch.source.output_index and g.edges[src, d, k][A.CHANNEL] == ch.id
            ]
            span = max((stage[d] for d in readers), default=stage[src]) - stage[src]
            ch.slots = max(1, min(cap, span + 1))
    outs = [low.channels[c - 1].slots for c in low.output_channels]
    state.plan.config.capacity = min([cap, *outs])
    _check_ring_bytes(state)


def pre(state: LowerState) -> None:
    require(
        len(state.lowered.programs) == len(state.g.graph[A.GRAPH].actors),
        _NAME,
        "programs must exist before capacity",
    )


def post(state: LowerState) -> None:
    low = state.lowered
    require(state.plan.config.capacity >= 1, _NAME, "capacity < 1")
    for c in list(low.input_channels) + list(low.output_channels):
        require(
            low.channels[c - 1].slots >= state.plan.config.capacity,
            _NAME,
            f"driver channel c{c} holds fewer values than the capacity",
        )
