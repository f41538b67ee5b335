"""Terminal views: the graph as text, and the schedule's time grid wrapped to the terminal.

Example::

    print(ascii_view(plan))                 # actors, edges with transports, programs
    print(schedule_ascii(plan, width=120))  # lanes of op tokens, one column per step
"""

from __future__ import annotations

import textwrap

from cgc.plan_schema import DRIVER
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.display import escape
from cgc.plan_schema.text import format_op
from cgc.viz.steps import step_plan
from cgc.viz.style import class_name, task_label

__all__ = ["ascii_view", "schedule_ascii"]


def ascii_view(plan: pb.Plan, width: int = 100) -> str:
    """Actors with their classes, every edge with its transport, one program per actor.

    Program lines wrap at ``width`` columns. Example: ``print(ascii_view(plan))``.
    """
    graph = plan.graph
    names = {n.id: n.name or task_label(n, graph, consts=False) for n in graph.nodes}
    out = [f"plan {plan.name!r}: {len(graph.actors)} actors, capacity {plan.config.capacity}"]
    out.append("actors:")
    for a in graph.actors:
        ext = " (existing actor)" if a.external.name or a.external.actor_id else ""
        out.append(f"  {a.name}: {class_name(a)}{ext}")
    out.append("edges:")
    for e in plan.lowered.edges:
        src = names.get(e.source.node, "?")
        src += f"[{e.source.output_index}]" if e.source.output_index else ""
        dst = names[e.target] if e.target < len(graph.nodes) else DRIVER
        out.append(f"  {src:>24} --{pb.Transport.Name(e.transport).lower():>6}--> {dst}")
    out.append("programs:")
    pad = max((len(p.actor) for p in plan.lowered.programs), default=0)
    for prog in plan.lowered.programs:
        pro = " ".join(format_op(op) for op in prog.prologue)
        body = " ".join(format_op(op) for op in prog.ops)
        text = (f"[{pro}] " if pro else "") + body
        lead = f"  {prog.actor:>{pad}}: "
        out += textwrap.wrap(text, max(40, width), initial_indent=lead,
                             subsequent_indent=" " * len(lead), break_on_hyphens=False)
    return "\n".join(escape(line) for line in out) + "\n"  # a name never breaks a line


def schedule_ascii(plan: pb.Plan, width: int = 100) -> str:
    """The schedule's time grid as text: a row per actor (and per comm stream, ``~``), a
    column per step, wrapped into bands at most ``width`` columns wide.

    Cells are ``cgc inspect``'s op tokens (``5SEND:c5→s1#0~``). Example::

        print(schedule_ascii(plan, width=120))
    """
    grid = step_plan(plan)
    comm = grid.comm_actors()
    rows: list[tuple[str, str, bool]] = []  # (label, actor, comm row)
    for a in grid.actors:
        rows.append((a, a, False))
        if a in comm:
            rows.append((f"{a} ~", a, True))
    cell = {(o.actor, o.comm_row, o.step): format_op(o.op) for o in grid.ops}
    label_w = max((len(r[0]) for r in rows), default=4) + 1
    col_w = max((len(t) for t in cell.values()), default=2) + 1
    per_band = max(1, (width - label_w) // col_w)
    out = [
        f"plan {plan.name!r}: schedule of one execution, {grid.width} steps, "
        f"capacity {plan.config.capacity} executions in flight",
        "(~ = comm stream; a SEND and its RECV share a step; +1 = serves the next execution)",
    ]
    for first in range(0, grid.width, per_band):
        steps = range(first, min(grid.width, first + per_band))
        out.append("")
        out.append("step".rjust(label_w - 1) + " " + "".join(str(s).ljust(col_w) for s in steps).rstrip())
        for label, actor, is_comm in rows:
            line = label.rjust(label_w - 1) + " "
            line += "".join(cell.get((actor, is_comm, s), "·").ljust(col_w) for s in steps)
            out.append(line.rstrip())
    return "\n".join(escape(line) for line in out) + "\n"  # a name never breaks a line
