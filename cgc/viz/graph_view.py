"""The graph view: actors as clusters, tasks as boxes, edges coloured by transport.

Every task is labelled with its actor's class and name over the method and call index,
the way Ray's own graph view names them (``Stage:w1`` over ``fwd #2``); every edge says
its transport (``host``, ``nccl``, ``local``, ``device_copy``).

Example::

    Path("g.dot").write_text(graph_dot(plan))
"""

from __future__ import annotations

from html import escape as html_escape
from itertools import pairwise

from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.display import escape as shown
from cgc.plan_schema.weight_sync import sync_summary
from cgc.viz.style import actor_tint, class_name, quote, task_label

__all__ = ["graph_dot", "TRANSPORT_STYLE"]

TRANSPORT_STYLE = {
    pb.LOCAL: 'color="#888888", style=dashed',
    pb.HOST: 'color="#333333"',
    pb.NCCL: 'color="#1f5fbf", penwidth=2.2',
    pb.DEVICE_COPY: 'color="#b35900", style=bold',
}
SYNC_STYLE = 'color="#2b8c3e", penwidth=3'


def _sync_edges(plan: pb.Plan, edges: dict[tuple[int, int, int], pb.Edge]) -> dict[int, str]:
    """Receive node -> the DOT edge of its weight sync: one edge per target (not one per
    bucket), labelled with the transfer plan and the buckets' transport."""
    out = {}
    for s, t in zip(plan.graph.weight_syncs, plan.lowered.transfers, strict=False):
        for rid in s.recv_nodes:
            edge = edges.get((s.send_node, 0, rid))
            how = pb.Transport.Name(edge.transport).lower() if edge else "?"
            label = f"weight sync {s.name!r} ({how})\n{sync_summary(s, t)}"
            out[rid] = f"  n{s.send_node} -> n{rid} [{SYNC_STYLE}, label={quote(label)}];"
    return out


def _html(text: str) -> str:
    """``text`` as HTML label text, escaped for display first (``cgc.plan_schema.display``)."""
    return html_escape(shown(text))


def _task_html(node: pb.Node, graph: pb.Graph, actor: pb.Actor) -> str:
    name, _, consts = task_label(node, graph).partition("\n")
    extra = f'<BR/><FONT POINT-SIZE="9">{_html(consts)}</FONT>' if consts else ""
    return (
        f'<<FONT POINT-SIZE="9" COLOR="#555555">{_html(class_name(actor))}:'
        f"{_html(actor.name)}</FONT><BR/><B>{_html(name)}</B>{extra}>"
    )


def graph_dot(plan: pb.Plan) -> str:
    """DOT source of the plan's graph (see the module docstring).

    Example: ``Path("g.dot").write_text(graph_dot(plan))``.
    """
    graph = plan.graph
    edges = {(e.source.node, e.source.output_index, e.target): e for e in plan.lowered.edges}
    lines = [
        f"digraph {quote(plan.name or 'plan')} {{",
        "  rankdir=LR; compound=true; fontname=Helvetica;",
        '  node [shape=box, style="rounded,filled", fontname=Helvetica, fontsize=11];',
        "  edge [fontname=Helvetica, fontsize=9];",
    ]
    for i, actor in enumerate(graph.actors):
        opts = actor.options
        res = [f"gpu={opts.num_gpus:g}"] if opts.HasField("num_gpus") and opts.num_gpus else []
        if actor.external.name or actor.external.actor_id:
            held = actor.external.placement
            gpu = next((r.amount for r in held.resources if r.name == "GPU"), 0.0)
            res.extend([f"gpu={gpu:g}"] if gpu else [])
            res.append("existing actor")
        title = f"{actor.name}: {class_name(actor)}" + (f" [{', '.join(res)}]" if res else "")
        lines.append(f"  subgraph cluster_{i} {{")
        lines.append(
            f'    label={quote(title)}; style="rounded,filled"; fillcolor="{actor_tint(i)}";'
        )
        for node in graph.nodes:
            if node.actor == actor.name and node.kind in (pb.CALL, pb.COLLECTIVE):
                shape = ", shape=hexagon" if node.kind == pb.COLLECTIVE else ""
                lines.append(
                    f"    n{node.id} [label={_task_html(node, graph, actor)}, "
                    f"tooltip={quote(node.name)}, fillcolor=white{shape}];"
                )
        lines.append("  }")
    consumed = {a.ref.node for n in graph.nodes for a in n.args if a.HasField("ref")}
    consumed |= {k.arg.ref.node for n in graph.nodes for k in n.kwargs if k.arg.HasField("ref")}
    for node in graph.nodes:
        if node.kind == pb.INPUT and node.id not in consumed:
            continue  # only its attributes are used: they stand for it
        if node.kind in (pb.INPUT, pb.INPUT_ATTR):
            lines.append(
                f'  n{node.id} [label={quote(task_label(node, graph))}, fillcolor="#9ecae1"];'
            )
        elif node.kind == pb.OUTPUT:
            lines.append(f'  n{node.id} [label="output", fillcolor="#fee391"];')
    order = {a.name: i for i, a in enumerate(graph.actors)}
    syncs = _sync_edges(plan, edges)
    for node in graph.nodes:
        if node.id in syncs:
            lines.append(syncs[node.id])
            continue
        refs = [a.ref for a in node.args if a.HasField("ref")]
        refs += [k.arg.ref for k in node.kwargs if k.arg.HasField("ref")]
        for ref in refs:
            edge = edges.get((ref.node, ref.output_index, node.id))
            style = TRANSPORT_STYLE.get(edge.transport, "") if edge else ""
            label = pb.Transport.Name(edge.transport).lower() if edge else ""
            src = graph.nodes[ref.node] if ref.node < len(graph.nodes) else pb.Node()
            if src.num_returns > 1:
                label = f"[{ref.output_index}] {label}"
            attrs = [a for a in (style, f"label={quote(label)}" if label else "") if a]
            # Why: an edge back to an earlier actor (a pipeline's gradients) would pull
            # that actor's tasks after the later actor's; left out of the ranking, every
            # actor keeps one column and the edge is drawn backwards.
            if order.get(src.actor, -1) > order.get(node.actor, 1 << 30):
                attrs.append("constraint=false")
            lines.append(f"  n{ref.node} -> n{node.id} [{', '.join(attrs)}];")
    for coll in graph.collectives:  # members of one collective, tied together
        for a, b in pairwise(coll.nodes):
            lines.append(
                f'  n{a} -> n{b} [dir=none, style=dotted, color="#1f5fbf", constraint=false];'
            )
    lines.append("}")
    return "\n".join(lines) + "\n"
