"""Pass ``channels``: one channel per node output and transport kind, plus the edge table.

A node output read over host memory by any other endpoint gets one CHAN_HOST channel whose
readers are all of them (``"@driver"`` included); one read over NCCL gets one CHAN_NCCL
channel whose readers are the NCCL readers. Ids start at 1 and follow (node id, output
index, host before nccl). ``input_channels`` lists the channels of INPUT/INPUT_ATTR nodes
in node order; ``output_channels[i]`` is the channel of OUTPUT arg ``i``.

An actor that reads the whole input (the INPUT node) over host memory takes the input
attributes it also needs (``inp[0]``, ``inp.k``) out of that value instead of reading a
channel per attribute: their edges carry the whole input's channel, and pass ``extract``
lists them on the READ (``Op.extract``). Only plain host edges qualify (no device move).

``static_shape`` / ``direct_return`` come from the producer's hint, except where an
``"auto"`` hint chose host memory: Ray gives them effect only on a device transport, and
the hint left the choice to the compiler.
"""

from __future__ import annotations

import math

from cgc.ir import attrs as A
from cgc.passes.state import LowerState, require
from cgc.plan_schema import DRIVER
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.defaults import ring_slot_bytes
from cgc.plan_schema.values import DTYPE_BYTES

__all__ = ["build_channels", "pre", "post", "EXTRACTED"]

_NAME = "channels"
# Edge.reason of an input attribute taken out of the whole input (see the module doc).
EXTRACTED = "taken out of the whole input"
# (channel kind, the edge transports it carries), host first: the id order.
_KINDS = ((pb.CHAN_HOST, (pb.HOST, pb.DEVICE_COPY)), (pb.CHAN_NCCL, (pb.NCCL,)))


def _slot_bytes(hint: pb.TransportHint | None, limit: int) -> int:
    """Bytes of a declared static tensor plus room for its header, else the default
    (``ring_slot_bytes()``: the plan holds the size the runtime will use).

    At most ``limit`` (``Limits.slot_bytes``): a larger value travels in a data block.
    """
    if hint is None or not hint.spec.dtype or not hint.spec.shape:
        return ring_slot_bytes()
    size = DTYPE_BYTES.get(hint.spec.dtype)
    if size is None or any(d < 0 for d in hint.spec.shape):
        return ring_slot_bytes()
    return min(limit, max(4096, math.prod(hint.spec.shape) * size + 4096))


def _plain_host(d: dict) -> bool:
    return d[A.TRANSPORT] == pb.HOST and d[A.DEVICE] == pb.DEVICE_DEFAULT


def _extracted_edges(state: LowerState) -> set[tuple[int, int, int]]:
    """INPUT_ATTR edges whose reader also reads the whole input over plain host memory."""
    g = state.g
    whole_readers = {
        g.nodes[dst][A.ACTOR]
        for src, dst, d in g.edges(data=True)
        if g.nodes[src][A.KIND] == pb.INPUT and _plain_host(d)
    }
    return {
        (src, dst, key)
        for src, dst, key, d in g.edges(keys=True, data=True)
        if g.nodes[src][A.KIND] == pb.INPUT_ATTR
        and _plain_host(d)
        and g.nodes[dst][A.ACTOR] in whole_readers - {DRIVER}
    }


def build_channels(state: LowerState) -> None:
    """Fill ``lowered.channels``, ``edges``, ``input_channels`` and ``output_channels``.

    Example: for ``inp -> a.f -> b.g -> output``: channels 1 (@driver -> a), 2 (a -> b),
    3 (b -> @driver); ``input_channels == [1]``, ``output_channels == [3]``.
    """
    g, low = state.g, state.lowered
    graph = g.graph[A.GRAPH]
    extracted = _extracted_edges(state)
    whole = 0  # the whole input's host channel, once built
    for src in sorted(g.nodes):
        writer = g.nodes[src][A.ACTOR]
        by_out: dict[int, list[tuple[int, dict]]] = {}
        for _, dst, key, data in g.out_edges(src, keys=True, data=True):
            if (src, dst, key) not in extracted:
                by_out.setdefault(key, []).append((dst, data))
        for out in sorted(by_out):
            edges = sorted(by_out[out], key=lambda e: e[0])
            for kind, transports in _KINDS:
                mine = [(dst, d) for dst, d in edges if d[A.TRANSPORT] in transports]
                if not mine:
                    continue
                hint = mine[0][1][A.HINT]
                ch = low.channels.add(
                    id=len(low.channels) + 1,
                    kind=kind,
                    writer=writer,
                    readers=sorted({g.nodes[dst][A.ACTOR] for dst, _ in mine}),
                    source=pb.NodeRef(node=src, output_index=out),
                    slots=1,
                    slot_bytes=_slot_bytes(hint, state.options.limits.slot_bytes),
                    device=mine[0][1][A.DEVICE],
                    reason="; ".join(sorted({d[A.REASON] for _, d in mine})),
                )
                if hint is not None:
                    ch.spec.CopyFrom(hint.spec)
                    # An "auto" hint that chose host memory: as in Ray, _static_shape and
                    # _direct_return bind only where the tensor travels on a device.
                    chosen = not (kind == pb.CHAN_HOST and hint.transport == pb.AUTO)
                    ch.static_shape = hint.static_shape and chosen
                    ch.direct_return = hint.direct_return and chosen
                state.channel_of[(src, out, kind)] = ch.id
                for _, d in mine:
                    d[A.CHANNEL] = ch.id
                if g.nodes[src][A.KIND] == pb.INPUT and kind == pb.CHAN_HOST:
                    whole = ch.id
    for src, dst, key in sorted(extracted):
        d = g.edges[src, dst, key]
        d[A.CHANNEL], d[A.REASON] = whole, EXTRACTED
    for src, dst, key in sorted(g.edges(keys=True)):
        d = g.edges[src, dst, key]
        d.setdefault(A.CHANNEL, 0)
        low.edges.add(
            source=pb.NodeRef(node=src, output_index=key),
            target=dst,
            transport=d[A.TRANSPORT],
            reason=d[A.REASON],
            channel=d[A.CHANNEL],
        )
    for node in graph.nodes:
        key = (node.id, 0, pb.CHAN_HOST)
        if node.kind in (pb.INPUT, pb.INPUT_ATTR) and key in state.channel_of:
            low.input_channels.append(state.channel_of[key])
        if node.kind == pb.OUTPUT:
            for arg in node.args:
                low.output_channels.append(
                    state.channel_of[(arg.ref.node, arg.ref.output_index, pb.CHAN_HOST)]
                )


def pre(state: LowerState) -> None:
    require(len(state.lowered.channels) == 0, _NAME, "channels already built")


def post(state: LowerState) -> None:
    low = state.lowered
    for i, ch in enumerate(low.channels):
        require(ch.id == i + 1, _NAME, f"channel ids not dense at {ch.id}")
        require(list(ch.readers) == sorted(set(ch.readers)), _NAME, f"c{ch.id} readers unsorted")
        require(ch.writer not in ch.readers or ch.writer == DRIVER, _NAME, f"c{ch.id} reads itself")
    for cid in list(low.input_channels) + list(low.output_channels):
        require(1 <= cid <= len(low.channels), _NAME, f"driver channel {cid} missing")
    for e in low.edges:
        require(
            (e.channel == 0) == (e.transport == pb.LOCAL),
            _NAME,
            f"edge %{e.source.node}.{e.source.output_index} -> %{e.target}: a channel iff "
            "not LOCAL",
        )
