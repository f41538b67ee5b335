"""Whole-graph checks at trace time: the output, hidden nodes, cycles, inputs, dangling
results, unused inputs, duplicate actor names.

This is the home of every check that needs more than one node to decide: the shape of
the graph rather than any single call. They run after naming (so messages use the final
names) and before emission. Checks of one node or one actor live in ``node_checks``;
the overview of where a new check goes is in ``cgc.frontend``'s docstring.
"""

from __future__ import annotations

from typing import Any

from cgc.errors import CompileError
from cgc.frontend import walk
from cgc.frontend.collectives import CollectiveNode
from cgc.frontend.locations import RawLoc
from cgc.frontend.nodes import (
    CallNode,
    DAGNode,
    InputAttributeNode,
    InputNode,
    MultiOutputNode,
    OutputRef,
)
from cgc.frontend.ray_private import is_ray_dag_object
from cgc.frontend.reporter import Names

__all__ = ["split_output", "check_structure"]


def split_output(output: Any) -> tuple[list[Any], bool, RawLoc]:
    """The graph's outputs, whether there are several, and where the output was written.

    Example: ``split_output(MultiOutputNode([a, b]))`` is ``([a, b], True, <its loc>)``.

    Raises:
        CompileError: ``output`` is neither a node nor a ``MultiOutputNode``.
    """
    if isinstance(output, MultiOutputNode):
        return list(output.outputs), True, output._loc
    if isinstance(output, DAGNode):
        return [output], False, output._loc
    kind = type(output).__name__
    raise CompileError(
        f"the graph's output is a {kind}, not a node; return the last node of the graph, "
        "or MultiOutputNode([...]) for several outputs (e.g. the list a collective returns)"
    )


def check_structure(
    names: Names,
    outputs: list[Any],
    got: walk.Collected,
    cycle: list[Any] | None,
    extra: list[Any],
    out_loc: Any,
) -> None:
    """Raise the first structural defect of the graph, if any.

    Example: a call whose result reaches no output raises
    ``model.py:9: worker.log#1 (Worker.log): its result reaches no output; ...``.

    Raises:
        CompileError: nodes hidden inside containers, a multi-return call used as one
            value, a cycle, no or several InputNodes, a dangling call, an unused input
            attribute, mixing ``inp`` with ``inp[k]``, Ray nodes inside a cgc graph, or two
            actors with the same name.
    """
    _check_problems(names, got, out_loc)
    if cycle:
        path = " -> ".join(names.of(n) for n in cycle + cycle[:1])
        raise names.fail(
            cycle[0],
            f"the graph has a cycle: {path}",
            "a node cannot depend on its own result; break the cycle",
        )
    inputs = [n for n in got.nodes if isinstance(n, InputNode)]
    if not inputs:
        raise CompileError(
            f"{names.renderer.text(out_loc)}: output: the graph has no InputNode; "
            "write `with InputNode() as inp:` and bind inp (or inp[0], inp.k) into the "
            "first calls",
            loc=names.renderer.text(out_loc),
        )
    if len(inputs) > 1:
        first = names.renderer.text(inputs[0]._loc)
        raise names.fail(
            inputs[1],
            f"the graph has more than one InputNode (another one at {first})",
            "create one InputNode and use it (or its attributes) everywhere",
        )
    inp = inputs[0]
    for n in got.nodes:
        for v in walk.arg_values(n):
            if is_ray_dag_object(v):
                raise names.fail(
                    n,
                    f"a Ray DAG node ({type(v).__name__}) is bound into a cgc node",
                    "build the whole graph with one API (cgc's or ray.dag's)",
                )
    _check_dangling(names, inp, extra)
    _check_input_use(names, inp, outputs, got)
    _check_actor_names(names, got)


def _check_problems(names: Names, got: walk.Collected, out_loc: Any) -> None:
    for p in got.problems:
        if p.kind == "container":
            value, hidden = p.detail
            raise names.fail(
                p.node,
                f"a graph node ({names.of(walk.ref_target(hidden[0])[0])}) is hidden "
                f"inside a {type(value).__name__} argument; graph values must be passed as "
                "direct arguments",
                "pass each node as its own argument (the method can take "
                "*args) and build the container inside the method",
            )
        if p.kind == "whole_multi":
            k = p.detail.num_returns
            raise names.fail(
                p.node if p.node is not None else p.detail,
                f"{names.of(p.detail)} returns {k} values but is used as one value",
                f"use one output (node[0] .. node[{k - 1}]) or unpack it: a, b = w.m.bind(...)",
            )
        if p.kind == "not_node":
            what = (
                "a MultiOutputNode"
                if isinstance(p.detail, MultiOutputNode)
                else f"a {type(p.detail).__name__}"
            )
            where = names.renderer.text(out_loc)
            raise CompileError(
                f"{where}: output: the outputs hold {what}, not a node; MultiOutputNode takes "
                "the nodes whose results execute() returns (no constants, no nesting)",
                loc=where,
            )


def _consumers(node: Any) -> list[Any]:
    out = []
    for d in node._downstream:
        out.extend(_consumers(d) if isinstance(d, OutputRef) else [d])
    return out


def _check_dangling(names: Names, inp: InputNode, extra: list[Any]) -> None:
    dangling = [
        n
        for n in extra
        if isinstance(n, (CallNode, CollectiveNode))
        # a node fed by another InputNode belongs to another graph sharing an actor
        and not walk.upstream_inputs(n) - {id(inp)}
    ]
    if dangling:
        ids = {id(n) for n in dangling}
        # Report the end of a dangling chain: that is the result the user forgot.
        leaves = [n for n in dangling if not any(id(c) in ids for c in _consumers(n))]
        n = (leaves or dangling)[0]
        more = (
            f" ({len(dangling) - 1} more node(s) feed only it or other dangling nodes)"
            if len(dangling) > 1
            else ""
        )
        raise names.fail(
            n,
            "its result reaches no output (a dangling node: errors in it could never "
            f"be reported, and Ray Compiled Graph rejects such leaf nodes too){more}",
            "use its result in a later .bind(...) or add it to MultiOutputNode([...]); "
            "delete the call if it is not needed",
        )
    for n in extra:
        if isinstance(n, InputAttributeNode) and n.input_node is inp:
            raise names.fail(
                n,
                f"the input attribute {names.of(n)} reaches no output (execute() would "
                "require an argument the graph never uses)",
                "bind it into a call that reaches the output, or do not create it",
            )


def _check_input_use(names: Names, inp: InputNode, outputs: list[Any], got: walk.Collected) -> None:
    attrs = [n for n in got.nodes if isinstance(n, InputAttributeNode)]
    if not attrs:
        return
    if any(v is inp for v in outputs):
        raise names.fail(
            inp,
            f"the output uses the whole input while {names.of(attrs[0])} indexes it",
            "either use inp itself everywhere, or index it everywhere (inp[0], inp.k)",
        )
    for n in got.nodes:
        if any(v is inp for v in walk.arg_values(n)) and not isinstance(n, InputAttributeNode):
            raise names.fail(
                n,
                f"binds the whole input (inp) while {names.of(attrs[0])} indexes it elsewhere",
                "either use inp itself everywhere, or index it everywhere (inp[0], inp.k)",
            )


def _check_actor_names(names: Names, got: walk.Collected) -> None:
    seen: dict[tuple[str, str], Any] = {}
    for n in got.nodes:
        a = n.actor if isinstance(n, (CallNode, CollectiveNode)) else None
        if a is None or a.external is not None:
            continue
        user = a.options.get("name")
        if not user:
            continue
        key = (user, a.options.get("namespace") or "")
        other = seen.setdefault(key, a)
        if other is not a:
            raise names.fail_actor(
                a,
                f"two actors are named {user!r} (the other was bound at "
                f"{names.renderer.text(other._loc)})",
                "give each actor its own name=",
            )
