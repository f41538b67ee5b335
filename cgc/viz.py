"""Drawing plans: the graph view (DOT), the schedule view (DOT), and a terminal view.

Everything is built from the plan file alone, offline: no Ray, no cluster. Rendering a DOT
source to png/svg/pdf needs the Graphviz ``dot`` binary; ``.dot`` output and the terminal
view need nothing.
"""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

from cgc.errors import CompileError
from cgc.plan_schema import DRIVER
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.text import format_op
from cgc.plan_schema.values import value_to_text

__all__ = ["graph_dot", "schedule_dot", "ascii_view", "render", "FORMATS"]

FORMATS = ("png", "svg", "pdf", "dot")
_PALETTE = ("#dbe9f6", "#fde2c8", "#d9f0d3", "#f2d7ee", "#fff2b2", "#e0e0e0", "#cfe8e6", "#f6d2d2")
_TRANSPORT_STYLE = {
    pb.LOCAL: 'color="#888888", style=dashed',
    pb.HOST: 'color="#333333"',
    pb.NCCL: 'color="#1f5fbf", penwidth=2.2',
    pb.DEVICE_COPY: 'color="#b35900", style=bold',
}


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _node_label(node: pb.Node, graph: pb.Graph) -> str:
    if node.kind == pb.INPUT:
        return "input"
    if node.kind == pb.INPUT_ATTR:
        return f"input[{node.index}]" if node.key_kind == pb.INDEX else f"input.{node.field}"
    if node.kind == pb.OUTPUT:
        return "output"
    if node.kind == pb.COLLECTIVE:
        coll = graph.collectives[node.collective]
        op = pb.CollectiveKind.Name(coll.kind).lower()
        return f"{op}#{node.collective}\\n{node.actor}"
    consts = [value_to_text(a.constant, 16) for a in node.args if a.HasField("constant")]
    consts += [
        f"{k.name}={value_to_text(k.arg.constant, 16)}"
        for k in node.kwargs
        if k.arg.HasField("constant")
    ]
    extra = f"\\n({', '.join(consts)})" if consts else ""
    return f"{node.method}#{node.bind_index}{extra}"


def graph_dot(plan: pb.Plan) -> str:
    """DOT source of the plan's graph: actors as clusters, edges coloured by transport.

    Example: ``Path("g.dot").write_text(graph_dot(plan))``.
    """
    graph = plan.graph
    edges = {(e.source.node, e.source.output_index, e.target): e for e in plan.lowered.edges}
    lines = [
        f"digraph {_q(plan.name or 'plan')} {{",
        "  rankdir=LR; compound=true; fontname=Helvetica;",
        '  node [shape=box, style="rounded,filled", fontname=Helvetica, fontsize=11];',
        "  edge [fontname=Helvetica, fontsize=9];",
    ]
    for i, actor in enumerate(graph.actors):
        opts = actor.options
        res = [f"gpu={opts.num_gpus:g}"] if opts.HasField("num_gpus") and opts.num_gpus else []
        title = f"{actor.name}: {actor.cls.qualname}" + (f" [{', '.join(res)}]" if res else "")
        lines.append(f"  subgraph cluster_{i} {{")
        lines.append(
            f'    label={_q(title)}; style="rounded,filled"; fillcolor="{_PALETTE[i % 8]}";'
        )
        for node in graph.nodes:
            if node.actor == actor.name and node.kind in (pb.CALL, pb.COLLECTIVE):
                shape = ", shape=hexagon" if node.kind == pb.COLLECTIVE else ""
                lines.append(
                    f"    n{node.id} [label={_q(_node_label(node, graph))}, fillcolor=white{shape}];"
                )
        lines.append("  }")
    consumed = {a.ref.node for n in graph.nodes for a in n.args if a.HasField("ref")}
    consumed |= {k.arg.ref.node for n in graph.nodes for k in n.kwargs if k.arg.HasField("ref")}
    for node in graph.nodes:
        if node.kind == pb.INPUT and node.id not in consumed:
            continue  # only its attributes are used: they stand for it
        if node.kind in (pb.INPUT, pb.INPUT_ATTR):
            lines.append(
                f'  n{node.id} [label={_q(_node_label(node, graph))}, fillcolor="#9ecae1"];'
            )
        elif node.kind == pb.OUTPUT:
            lines.append(f'  n{node.id} [label="output", fillcolor="#fee391"];')
    for node in graph.nodes:
        refs = [a.ref for a in node.args if a.HasField("ref")]
        refs += [k.arg.ref for k in node.kwargs if k.arg.HasField("ref")]
        for ref in refs:
            edge = edges.get((ref.node, ref.output_index, node.id))
            style = _TRANSPORT_STYLE.get(edge.transport, "") if edge else ""
            label = pb.Transport.Name(edge.transport).lower() if edge else ""
            if graph.nodes[ref.node].num_returns > 1:
                label = f"[{ref.output_index}] {label}"
            attrs = ", ".join(a for a in (style, f"label={_q(label)}" if label else "") if a)
            lines.append(f"  n{ref.node} -> n{node.id} [{attrs}];")
    for coll in graph.collectives:  # members of one collective, tied together
        for a, b in pairwise(coll.nodes):
            lines.append(
                f'  n{a} -> n{b} [dir=none, style=dotted, color="#1f5fbf", constraint=false];'
            )
    lines.append("}")
    return "\n".join(lines) + "\n"


def _op_token(op: pb.Op) -> str:
    return format_op(op)


def schedule_dot(plan: pb.Plan) -> str:
    """DOT source of the schedule: one row of ops per actor, rendezvous edges between rows."""
    lines = [
        f"digraph {_q((plan.name or 'plan') + ' schedule')} {{",
        "  rankdir=LR; newrank=true; fontname=Helvetica;",
        '  node [shape=box, style="rounded,filled", fillcolor=white, fontname=Courier, fontsize=10];',
    ]
    sends: dict[tuple[int, str, str, int], str] = {}
    recvs: dict[tuple[int, str, str, int], str] = {}
    colls: dict[tuple[int, int], list[str]] = {}
    for i, prog in enumerate(plan.lowered.programs):
        ops = [(f"p{i}_pro{j}", op) for j, op in enumerate(prog.prologue)]
        ops += [(f"p{i}_op{j}", op) for j, op in enumerate(prog.ops)]
        lines.append(f"  subgraph cluster_{i} {{")
        lines.append(f'    label={_q(prog.actor)}; style=filled; fillcolor="{_PALETTE[i % 8]}";')
        for name, op in ops:
            fill = "#c6dbef" if op.kind in (pb.SEND, pb.RECV, pb.COLL) else "white"
            lines.append(f'    {name} [label={_q(_op_token(op))}, fillcolor="{fill}"];')
            if op.kind == pb.SEND:
                sends[(op.channel, prog.actor, op.peer, op.seq)] = name
            elif op.kind == pb.RECV:
                recvs[(op.channel, op.peer, prog.actor, op.seq)] = name
            elif op.kind == pb.COLL:
                colls.setdefault((op.task, op.seq), []).append(name)
        chain = " -> ".join(n for n, _ in ops)
        if len(ops) > 1:
            lines.append(f"    {chain} [style=invis, weight=10];")
        lines.append("  }")
    for key, src in sorted(sends.items()):
        if key in recvs:
            lines.append(f'  {src} -> {recvs[key]} [color="#1f5fbf", constraint=false];')
    for members in colls.values():
        for a, b in pairwise(members):
            lines.append(
                f'  {a} -> {b} [dir=none, style=dotted, color="#1f5fbf", constraint=false];'
            )
    lines.append("}")
    return "\n".join(lines) + "\n"


def ascii_view(plan: pb.Plan) -> str:
    """A terminal view: actors, edges with transports, and one line per actor program."""
    graph = plan.graph
    names = {n.id: n.name or _node_label(n, graph).replace("\\n", " ") for n in graph.nodes}
    out = [f"plan {plan.name!r}: {len(graph.actors)} actors, capacity {plan.config.capacity}"]
    out.append("edges:")
    for e in plan.lowered.edges:
        src = names[e.source.node] + (f"[{e.source.output_index}]" if e.source.output_index else "")
        dst = names[e.target] if e.target < len(graph.nodes) else DRIVER
        out.append(f"  {src:>24} --{pb.Transport.Name(e.transport).lower():>6}--> {dst}")
    out.append("programs:")
    width = max((len(p.actor) for p in plan.lowered.programs), default=0)
    for prog in plan.lowered.programs:
        pro = " ".join(_op_token(op) for op in prog.prologue)
        body = " ".join(_op_token(op) for op in prog.ops)
        out.append(f"  {prog.actor:>{width}}: " + (f"[{pro}] " if pro else "") + body)
    return "\n".join(out) + "\n"


def render(dot_source: str, out: Path) -> Path:
    """Write ``dot_source`` to ``out``; its suffix picks the format (png, svg, pdf, dot).

    Raises:
        CompileError: unknown suffix, or the Graphviz ``dot`` binary is missing.
    """
    fmt = out.suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise CompileError(
            f"{out}: unknown picture format {fmt!r}; use one of {', '.join(FORMATS)}"
        )
    if fmt == "dot":
        out.write_text(dot_source)
        return out
    import graphviz

    try:
        data = graphviz.Source(dot_source).pipe(format=fmt)
    except graphviz.ExecutableNotFound:
        raise CompileError(
            "the Graphviz 'dot' program is not installed (apt-get install graphviz); "
            f"write DOT instead with -o {out.with_suffix('.dot')}"
        ) from None
    out.write_bytes(data)
    return out
