"""Named attribute keys of the compiler's working graph (a ``networkx.MultiDiGraph``).

The working graph has one node per ``pb.Node`` (keyed by node id) and one edge per
(producer output, consumer) pair: ``g.edges[src, dst, output_index]``. A ``MultiDiGraph``
is a ``DiGraph`` subclass; the multi-edge key is the producer's output index, so two
outputs of one multi-return call feeding the same consumer stay two edges.

Example::

    from cgc.ir import attrs as A
    g.nodes[3][A.ACTOR]            # "w1"
    g.edges[3, 5, 0][A.TRANSPORT]  # pb.NCCL
"""

from __future__ import annotations

__all__ = [
    "PROTO",
    "KIND",
    "ACTOR",
    "ORDER",
    "GRAPH",
    "GPU_ACTORS",
    "ACTOR_INDEX",
    "ARG_POSITIONS",
    "HINT",
    "TRANSPORT",
    "REASON",
    "DEVICE",
    "CHANNEL",
]

# ---- node attributes
PROTO = "proto"  # the pb.Node this graph node stands for
KIND = "kind"  # pb.NodeKind of the node (INPUT, INPUT_ATTR, CALL, COLLECTIVE, OUTPUT)
ACTOR = "actor"  # endpoint that owns the node: an actor name, or "@driver" for INPUT*/OUTPUT
ORDER = "order"  # position of a task in its actor's bind order (0, 1, ...); -1 for driver nodes

# ---- graph attributes (g.graph[...])
GRAPH = "graph"  # the pb.Graph the working graph was built from
GPU_ACTORS = "gpu_actors"  # frozenset of actor names that have a GPU (cgc.ir.graph.has_gpu)
ACTOR_INDEX = "actor_index"  # dict actor name -> index in Graph.actors

# ---- edge attributes (g.edges[src, dst, output_index][...])
ARG_POSITIONS = "arg_positions"  # where the consumer uses the value: ("arg", i) / ("kw", name)
HINT = "hint"  # pb.TransportHint the producer declared for this output, or None
TRANSPORT = "transport"  # pb.Transport decided for this edge (LOCAL, HOST, NCCL, DEVICE_COPY)
REASON = "reason"  # one short sentence: why that transport
DEVICE = "device"  # pb.Device the reader gets the value on (DEVICE_DEFAULT = writer's)
CHANNEL = "channel"  # channel id carrying the edge (0 for LOCAL edges)
