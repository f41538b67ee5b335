"""``CompiledDAG.visualize()`` as Ray 2.60 draws it: one node per task in Ray's task order
(``Task 0`` the ``InputNode`` ... the ``MultiOutputNode`` Ray adds when the output is a
single node), edges from each task's arguments, Ray's labels, shapes and colours - so a
program (or test) that reads the DOT source or the ASCII listing finds Ray's node numbers.
Pictures are rendered by cgc (``cgc.viz.render``: the ``dot`` program or pygraphviz), so
they work where Ray's need the ``dot`` program. With ``channel_details`` each edge names
the transport cgc bound it to; the ASCII form ends with cgc's own view of the plan.

Example::

    dot_source = ray_dot(ray_dag, channel_details=False)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cgc.frontend import ray_private as rp
from cgc.ray_compat.checks import RayDag, accelerator_hint

__all__ = ["ray_dot", "ray_ascii"]


@dataclass(frozen=True)
class _Task:
    idx: int
    kind: str  # "input" | "attr" | "output" | "call" | "multi" | "other"
    node: Any  # None for the MultiOutputNode Ray adds
    args: tuple[int, ...]  # indices of the tasks it takes as arguments


def _tasks(ray_dag: RayDag) -> list[_Task]:
    from ray.dag import ClassMethodNode, DAGNode, InputAttributeNode, InputNode, MultiOutputNode

    index = {id(n): i for i, n in enumerate(ray_dag.tasks)}
    out = []
    for i, n in enumerate(ray_dag.tasks):
        if isinstance(n, InputNode):
            kind = "input"
        elif isinstance(n, InputAttributeNode):
            kind = "attr"
        elif isinstance(n, MultiOutputNode):
            kind = "multi"
        elif isinstance(n, ClassMethodNode):
            kind = "output" if rp.output_of(n) is not None else "call"
        else:
            kind = "other"
        if kind == "attr":
            src = rp.attribute_source(n)[0]
            args: tuple[int, ...] = (index[id(src)],) if id(src) in index else ()
        else:
            args = tuple(index[id(a)] for a in rp.bound_args(n)
                         if isinstance(a, DAGNode) and id(a) in index)
        out.append(_Task(i, kind, n, args))
    if not isinstance(ray_dag.output, MultiOutputNode):  # Ray wraps a single output
        out.append(_Task(len(out), "multi", None, (index[id(ray_dag.output)],)))
    return out


def _out_idx(node: Any) -> int:
    of = rp.output_of(node)
    return of[1] if of is not None else -1


def _actor(node: Any) -> tuple[str, str]:
    """(class name, actor id hex) of the actor a call runs on ("" id for a ClassNode)."""
    from ray.actor import ActorHandle

    actor = rp.parent_actor(node)
    if isinstance(actor, ActorHandle):
        return rp.handle_class(actor)[1], rp.handle_id(actor)
    return getattr(rp.remote_class(rp.actor_body(actor)), "__name__", "Actor"), ""


def _dot_label(t: _Task) -> tuple[str, str, str]:
    """(label, shape, fill colour) as Ray draws the task."""
    head = f"Task {t.idx}\n"
    if t.kind == "input":
        return head + "InputNode", "rectangle", "lightblue"
    if t.kind == "attr":
        return head + f"InputAttributeNode[{rp.attribute_source(t.node)[1]}]", "rectangle", \
            "lightblue"
    if t.kind == "multi":
        return head + "MultiOutputNode", "rectangle", "yellow"
    if t.kind == "output":
        return head + f"ClassMethodOutputNode[{_out_idx(t.node)}]", "rectangle", "orange"
    if t.kind == "call":
        cls, aid = _actor(t.node)
        if aid:
            return (head + f"Actor: {cls}\nID: {aid[:6]}...\nMethod: {rp.method_name(t.node)}",
                    "oval", "")
        return head + f"Actor: {cls}\nMethod: {rp.method_name(t.node)}", "oval", "lightgreen"
    return head + type(t.node).__name__, "diamond", "red"


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def ray_dot(ray_dag: RayDag, channel_details: bool = False) -> str:
    """The DOT source Ray 2.60's ``visualize()`` returns for this DAG (node names are
    Ray's task indices); ``channel_details`` labels each edge with the Ray type hint of
    the value it carries.

    Example: ``"0 -> 1" in ray_dot(ray_dag)``.
    """
    tasks = _tasks(ray_dag)
    colours: dict[str, str] = {}
    lines = ["digraph compiled_graph {"]
    for t in tasks:
        label, shape, fill = _dot_label(t)
        if t.kind == "call" and not fill:
            aid = _actor(t.node)[1]  # one colour per actor, as Ray's
            fill = colours.setdefault(aid, f"#{(len(colours) * 2000 + 24000) % 0xFFFFFF:06X}")
        lines.append(f"\t{t.idx} [label={_quote(label)} fillcolor={_quote(fill)} "
                     f"shape={shape} style=filled]")
    by_idx = {t.idx: t for t in tasks}
    for t in tasks:
        for a in t.args:
            src = by_idx[a].node
            extra = type(src.type_hint).__name__ if channel_details and src is not None else ""
            lines.append(f"\t{a} -> {t.idx}" + (f" [label={_quote(extra)}]" if extra else ""))
    lines.append("}")
    return "\n".join(lines) + "\n"


def _ascii_label(t: _Task) -> str:
    head = f"Task {t.idx}  "
    if t.kind == "input":
        return head + "InputNode"
    if t.kind == "attr":
        return head + f"InputAttributeNode[{rp.attribute_source(t.node)[1]}]"
    if t.kind == "multi":
        return head + "MultiOutputNode"
    if t.kind == "output":
        return head + f"ClassMethodOutputNode[{_out_idx(t.node)}]"
    if t.kind == "call":
        aid = _actor(t.node)[1]
        return head + f"Actor: {aid[:6] or 'unknown'}... Method: {rp.method_name(t.node)}"
    return head + type(t.node).__name__


def ray_ascii(ray_dag: RayDag, graph_text: str = "") -> str:
    """The node and edge listing of Ray 2.60's ``visualize(format="ascii")`` (``+++>`` for
    accelerator edges, ``--->`` for the others) and its legend, then ``graph_text``.

    Example: ``"0 ---> 1" in ray_ascii(ray_dag)``.
    """
    tasks = _tasks(ray_dag)
    by_idx = {t.idx: t for t in tasks}
    out = ["Nodes Information:"]
    out += [f'{t.idx} [label="{_ascii_label(t)}"] ' for t in tasks]
    out += ["", "Edges Information:"]
    for t in tasks:
        for a in t.args:
            src = by_idx[a].node
            arrow = "+++>" if src is not None and accelerator_hint(src) else "--->"
            out.append(f"{a} {arrow} {t.idx}")
    out += ["", "Legend:", "+++> : Represents Accelerator-type data channels",
            "---> : Represents Shared Memory data channels"]
    if graph_text:
        out += ["", "Graph Built (cgc's view of the plan):", graph_text.rstrip()]
    return "\n".join(out) + "\n"
