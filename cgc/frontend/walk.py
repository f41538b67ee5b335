"""Graph walks for tracing: what is upstream of the output, in which order, what dangles.

All walks are iterative (deep pipelines must not hit Python's recursion limit) and visit
arguments in the order the user wrote them, so the result only depends on the program.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from cgc.frontend.collectives import CollectiveNode
from cgc.frontend.nodes import (
    CallNode,
    DAGNode,
    InputAttributeNode,
    InputNode,
    MultiOutputNode,
    OutputRef,
    iter_nodes,
)

__all__ = [
    "Problem",
    "Collected",
    "collect",
    "topo_order",
    "closure",
    "upstream_inputs",
    "ref_target",
    "arg_values",
]

# A graph node that becomes a pb.Node (OutputRef is only a reference, MultiOutputNode is
# the OUTPUT node that trace() adds itself).
GraphNode = InputNode | InputAttributeNode | CallNode | CollectiveNode


@dataclass
class Problem:
    """A defect found while walking; reported once actor names are known."""

    kind: str  # "container" | "whole_multi" | "not_node"
    node: Any  # the consumer (or None for the output)
    detail: Any = None


@dataclass
class Collected:
    nodes: list[Any] = field(default_factory=list)  # discovery order
    members: set[int] = field(default_factory=set)  # ids of nodes
    problems: list[Problem] = field(default_factory=list)


def ref_target(value: Any) -> tuple[Any, int]:
    """The (graph node, output index) a node used as an argument stands for."""
    if isinstance(value, OutputRef):
        return value.call, value.index
    return value, 0


def arg_values(node: Any) -> list[Any]:
    """Top-level argument values of a graph node (args then kwargs, as written)."""
    if isinstance(node, InputAttributeNode):
        return [node.input_node]
    if isinstance(node, (CallNode, CollectiveNode)):
        return list(node.args) + list(node.kwargs.values())
    return []


def deps_of(node: Any) -> list[Any]:
    """Graph nodes this node reads (deduplicated, in argument order)."""
    out: list[Any] = []
    seen: set[int] = set()
    for value in arg_values(node):
        if isinstance(value, DAGNode) and not isinstance(value, MultiOutputNode):
            target, _ = ref_target(value)
            if id(target) not in seen:
                seen.add(id(target))
                out.append(target)
    return out


def collect(outputs: list[Any]) -> Collected:
    """Every graph node upstream of ``outputs``, with the defects met on the way."""
    got = Collected()
    stack: list[Any] = []
    for value in outputs:
        _push_value(value, None, stack, got)
    while stack:
        node = stack.pop()
        if id(node) in got.members:
            continue
        got.members.add(id(node))
        got.nodes.append(node)
        for value in reversed(arg_values(node)):
            _push_value(value, node, stack, got)
    return got


def _push_value(value: Any, consumer: Any, stack: list[Any], got: Collected) -> None:
    if isinstance(value, MultiOutputNode):
        got.problems.append(Problem("not_node", consumer, value))
    elif isinstance(value, DAGNode):
        if isinstance(value, (CallNode, CollectiveNode)) and value.num_returns > 1:
            got.problems.append(Problem("whole_multi", consumer, value))
        stack.append(ref_target(value)[0])
    else:
        hidden = list(iter_nodes(value))
        if hidden:
            got.problems.append(Problem("container", consumer, (value, hidden)))
            for h in hidden:  # keep walking, so names exist for the message
                if not isinstance(h, MultiOutputNode):
                    stack.append(ref_target(h)[0])
        elif consumer is None:
            got.problems.append(Problem("not_node", None, value))


def _actor_prev(nodes: list[Any]) -> dict[int, Any]:
    """For each call in ``nodes``: the previous call on the same actor (bind order)."""
    by_actor: dict[int, list[Any]] = {}
    for n in nodes:
        if isinstance(n, (CallNode, CollectiveNode)):
            by_actor.setdefault(id(n.actor), []).append(n)
    prev: dict[int, Any] = {}
    for calls in by_actor.values():
        calls.sort(key=lambda c: c.bind_index)
        for before, after in pairwise(calls):
            prev[id(after)] = before
    return prev


def topo_order(outputs: list[Any], got: Collected) -> list[Any] | list[list[Any]]:
    """Post-order DFS from the outputs: a node after its inputs and after the previous
    call on its actor (so ids follow each actor's bind order). INPUT and its attributes
    are not placed here (trace() puts them first).

    Returns the order, or ``[cycle]`` (a one-element list holding the cycle's nodes).
    """
    prev = _actor_prev(got.nodes)
    done: set[int] = set()
    active: dict[int, int] = {}  # id -> position on the path (grey nodes)
    order: list[Any] = []
    roots = [ref_target(v)[0] for v in outputs if isinstance(v, DAGNode)]
    for root in roots:
        if id(root) in done:
            continue
        path: list[Any] = []
        stack: list[tuple[Any, int]] = [(root, 0)]
        while stack:
            node, i = stack.pop()
            if i == 0:
                if id(node) in done:
                    continue
                active[id(node)] = len(path)
                path.append(node)
            kids = ([prev[id(node)]] if id(node) in prev else []) + deps_of(node)
            if i < len(kids):
                stack.append((node, i + 1))
                kid = kids[i]
                if id(kid) in active:
                    return [path[active[id(kid)] :]]
                if id(kid) not in done:
                    stack.append((kid, 0))
                continue
            path.pop()
            del active[id(node)]
            done.add(id(node))
            if not isinstance(node, (InputNode, InputAttributeNode)):
                order.append(node)
    return order


def closure(graph_ids: set[int], start: list[Any]) -> list[Any]:
    """Nodes connected to the graph through consumers, actors' other calls and input
    attributes (the places a forgotten result hides), in a deterministic order."""
    seen = set(graph_ids)
    found: list[Any] = []
    queue = list(start)
    actors_seen: set[int] = set()
    while queue:
        node = queue.pop(0)
        nxt: list[Any] = list(node._downstream)
        if isinstance(node, InputNode):
            nxt.extend(node._attrs.values())
        # isinstance, not getattr: probing an InputNode would create an attribute node
        actor = node.actor if isinstance(node, (CallNode, CollectiveNode)) else None
        if actor is not None and id(actor) not in actors_seen:
            actors_seen.add(id(actor))
            nxt.extend(actor._calls)
        for n in nxt:
            if isinstance(n, (OutputRef, MultiOutputNode)):
                queue.append(n)  # pass through: refs and outputs consume for others
                continue
            if id(n) not in seen:
                seen.add(id(n))
                found.append(n)
                queue.append(n)
    return found


def upstream_inputs(node: Any) -> set[int]:
    """ids of the InputNodes ``node`` depends on (through any chain of arguments)."""
    out: set[int] = set()
    stack, seen = [node], set()
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        if isinstance(n, InputNode):
            out.add(id(n))
        for v in arg_values(n):
            for m in iter_nodes(v):
                stack.append(ref_target(m)[0])
    return out
