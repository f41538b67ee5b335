"""Build the compiler's working graph from a traced ``pb.Graph``.

Example::

    g = build_graph(plan.graph)
    sorted(g.successors(1))        # consumers of node 1
    g.edges[1, 4, 0][attrs.HINT]   # the hint node 1 declared for its output 0

Raises ``cgc.errors.CompileError`` for graphs the frontend should never emit (dangling
refs, ids out of order, a ref into an OUTPUT node); the message names node and line.
"""

from __future__ import annotations

from collections.abc import Iterator

import networkx as nx

from cgc.errors import CompileError
from cgc.ir import attrs as A
from cgc.plan_schema import DRIVER
from cgc.plan_schema import plan_pb2 as pb

__all__ = ["build_graph", "node_label", "task_order", "where", "has_gpu", "gpu_held"]

_TASK_KINDS = (pb.CALL, pb.COLLECTIVE)


def node_label(node: pb.Node) -> str:
    """The node's readable name: ``"w1.fwd#2"`` for calls, ``"input[0]"`` for inputs."""
    if node.name:
        return node.name
    if node.kind == pb.INPUT_ATTR:
        return f"input[{node.index}]" if node.key_kind == pb.INDEX else f"input.{node.field}"
    return f"{pb.NodeKind.Name(node.kind).lower()}#{node.id}"


def where(graph: pb.Graph, node_id: int) -> str:
    """``"w1.fwd#2 (Worker.fwd, model.py:14)"``: what compile errors say about a node."""
    node = graph.nodes[node_id]
    parts = []
    if node.kind in _TASK_KINDS:
        cls = next((a.cls.qualname for a in graph.actors if a.name == node.actor), "?")
        parts.append(f"{cls or '?'}.{node.method or pb.NodeKind.Name(node.kind).lower()}")
    if node.loc.file:
        parts.append(f"{node.loc.file}:{node.loc.line}")
    extra = f" ({', '.join(parts)})" if parts else ""
    return f"{node_label(node)}{extra}"


def task_order(graph: pb.Graph) -> dict[str, list[int]]:
    """Per actor, its task node ids (CALL and COLLECTIVE) in bind order.

    Example: ``task_order(g)["w1"] == [2, 5, 7]``.
    """
    order: dict[str, list[int]] = {a.name: [] for a in graph.actors}
    for node in graph.nodes:
        if node.kind in _TASK_KINDS:
            order.setdefault(node.actor, []).append(node.id)
    for _name, ids in order.items():
        ids.sort(key=lambda i: (graph.nodes[i].bind_index, i))
    return order


def _refs(node: pb.Node) -> Iterator[tuple[pb.NodeRef, tuple[str, int | str]]]:
    for i, arg in enumerate(node.args):
        if arg.WhichOneof("kind") == "ref":
            yield arg.ref, ("arg", i)
    for kw in node.kwargs:
        if kw.arg.WhichOneof("kind") == "ref":
            yield kw.arg.ref, ("kw", kw.name)


def has_gpu(actor: pb.Actor) -> bool:
    """Whether the compiler takes ``actor`` for a GPU actor: one the plan creates with
    ``num_gpus > 0``, or a live one that held GPU ids when the graph was compiled
    (``ExternalActor.placement``, Ray's own rule for its transport choice).

    >>> has_gpu(pb.Actor(options=pb.ActorOptions(num_gpus=0.5)))
    True
    >>> live = pb.Actor(external=pb.ExternalActor(actor_id="ab"))
    >>> live.external.placement.observed = True
    >>> has_gpu(live), live.external.placement.gpu_ids.append("0"), has_gpu(live)
    (False, None, True)

    Raises:
        Nothing.
    """
    if actor.external.placement.observed:
        return len(actor.external.placement.gpu_ids) > 0
    return actor.options.num_gpus > 0


def gpu_held(actor: pb.Actor) -> str:
    """What ``actor`` holds, for messages: ``num_gpus=0`` for an actor the plan creates,
    ``a live actor holding {CPU: 1}, no GPU`` for a live one.

    >>> gpu_held(pb.Actor(name="w"))
    'num_gpus=0'

    Raises:
        Nothing.
    """
    p = actor.external.placement
    if not p.observed:
        if actor.external.name or actor.external.actor_id:
            return "an existing actor; what it holds was not read when compiled"
        return f"num_gpus={actor.options.num_gpus:g}"
    held = "{" + ", ".join(f"{r.name}: {r.amount:g}" for r in p.resources) + "}"
    gpus = f"GPU {','.join(p.gpu_ids)}" if p.gpu_ids else "no GPU"
    return f"a live actor holding {held}, {gpus}"


def build_graph(graph: pb.Graph) -> nx.MultiDiGraph:
    """Turn a ``pb.Graph`` into the working ``networkx.MultiDiGraph`` (see ``cgc.ir.attrs``).

    Example: ``g = build_graph(plan.graph); g.nodes[2][attrs.ACTOR] == "w1"``.

    Raises:
        CompileError: node ids not dense, an unknown actor, a ref to a missing node or
            output, a ref to an OUTPUT node, no or several OUTPUT nodes.
    """
    g = nx.MultiDiGraph()
    actor_index = {a.name: i for i, a in enumerate(graph.actors)}
    if len(actor_index) != len(graph.actors):
        raise CompileError("graph has two actors with the same name")
    gpu = frozenset(a.name for a in graph.actors if has_gpu(a))
    g.graph.update({A.GRAPH: graph, A.GPU_ACTORS: gpu, A.ACTOR_INDEX: actor_index})
    order = task_order(graph)
    pos = {nid: i for ids in order.values() for i, nid in enumerate(ids)}
    outputs = [n.id for n in graph.nodes if n.kind == pb.OUTPUT]
    if len(outputs) != 1:
        raise CompileError(f"graph has {len(outputs)} OUTPUT nodes; expected exactly one")
    for i, node in enumerate(graph.nodes):
        if node.id != i:
            raise CompileError(f"node {node_label(node)} has id {node.id}, expected {i}")
        if node.kind in _TASK_KINDS and node.actor not in actor_index:
            raise CompileError(f"{where(graph, i)}: unknown actor {node.actor!r}")
        owner = node.actor if node.kind in _TASK_KINDS else DRIVER
        g.add_node(i, **{A.PROTO: node, A.KIND: node.kind, A.ACTOR: owner, A.ORDER: pos.get(i, -1)})
    for node in graph.nodes:
        for ref, position in _refs(node):
            if ref.node >= node.id and node.kind != pb.OUTPUT:
                raise CompileError(
                    f"{where(graph, node.id)}: takes node {ref.node}, which is not before it"
                )
            if ref.node >= len(graph.nodes):
                raise CompileError(f"{where(graph, node.id)}: refers to missing node {ref.node}")
            src = graph.nodes[ref.node]
            if src.kind == pb.OUTPUT:
                raise CompileError(f"{where(graph, node.id)}: takes the OUTPUT node as an argument")
            nret = (src.num_returns or 1) if src.kind == pb.CALL else 1
            if ref.output_index >= nret:
                raise CompileError(
                    f"{where(graph, node.id)}: takes output {ref.output_index} of "
                    f"{where(graph, ref.node)}, which has {nret}"
                )
            if node.kind == pb.INPUT_ATTR:
                continue  # the driver splits its own input: no edge
            key = ref.output_index
            if g.has_edge(ref.node, node.id, key):
                g.edges[ref.node, node.id, key][A.ARG_POSITIONS].append(position)
                continue
            src_hints = {h.output_index: h.hint for h in src.hints}
            g.add_edge(
                ref.node, node.id, key, **{A.ARG_POSITIONS: [position], A.HINT: src_hints.get(key)}
            )
    return g
