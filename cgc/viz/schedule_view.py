"""The schedule view: every actor's program on one time grid (``cgc viz PLAN --schedule``).

One lane per actor, plus a second row for its comm stream when it has one; one column per
step of ``steps.step_plan``. A SEND and its RECV sit in the same column joined by a blue
line, a WRITE and its READ by a grey dashed one, the members of a collective by a dotted
one. Each cell says what the op does, with whom, on which channel, and which execution it
serves (``i``, or ``i+1`` for a prefetch); receives hoisted above an earlier computation
have an orange border. The title carries the plan's capacity (executions in flight).

Example::

    Path("s.dot").write_text(schedule_dot(plan))
"""

from __future__ import annotations

from cgc.plan_schema import DRIVER
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.text import format_op
from cgc.viz.lanes import Cell, LaneChart, LegendEntry, Link, Row, lanes_dot
from cgc.viz.steps import StepGrid, StepOp, step_plan
from cgc.viz.style import actor_tint, class_name, task_label

__all__ = ["schedule_chart", "schedule_dot", "OP_STYLE"]

# kind -> (fill, border)
OP_STYLE = {
    pb.READ: ("#f2f2f2", "#8c8c8c"),
    pb.WRITE: ("#f2f2f2", "#8c8c8c"),
    pb.COMPUTE: ("#ffffff", "#222222"),
    pb.SEND: ("#c6dbef", "#1f5fbf"),
    pb.RECV: ("#c6dbef", "#1f5fbf"),
    pb.COLL: ("#dadaeb", "#6a51a3"),
}
_HOISTED = "#d95f02"
_UNMATCHED = "#cb181d"
_LINKS = {
    "nccl": ("#1f5fbf", "solid", True, 1.6),
    "host": ("#7f7f7f", "dashed", True, 1.0),
    "coll": ("#6a51a3", "dotted", False, 1.6),
}


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _peer(name: str) -> str:
    return "driver" if name == DRIVER else name


def _cell_text(o: StepOp, plan: pb.Plan) -> tuple[str, str]:
    op, graph, low = o.op, plan.graph, plan.lowered
    ex = "i" if not op.exec_offset else f"i+{op.exec_offset}"
    chan = low.channels[op.channel - 1] if 0 < op.channel <= len(low.channels) else None
    if op.kind == pb.COMPUTE:
        node = graph.nodes[op.task] if op.task < len(graph.nodes) else pb.Node()
        return _short(task_label(node, graph, consts=False), 28), f"task {op.task} · {ex}"
    if op.kind == pb.READ:
        src = _peer(chan.writer) if chan else "?"
        return f"R c{op.channel}", _short(f"←{src}", 14) + f" · {ex}"
    if op.kind == pb.WRITE:
        dst = [_peer(r) for r in chan.readers] if chan else ["?"]
        to = dst[0] if len(dst) == 1 else f"{len(dst)} readers"
        out = f".{op.output_index}" if op.output_index else ""
        return f"W{out} c{op.channel}", _short(f"→{to}", 14) + f" · {ex}"
    if op.kind in (pb.SEND, pb.RECV):
        arrow = "→" if op.kind == pb.SEND else "←"
        kind = "SEND" if op.kind == pb.SEND else "RECV"
        return f"{kind} c{op.channel}", _short(f"{arrow}{op.peer} #{op.seq}", 14) + f" · {ex}"
    node = graph.nodes[op.task] if op.task < len(graph.nodes) else pb.Node()
    kind = task_label(node, graph, consts=False).split(" #")[0]
    return _short(kind, 28), f"#{node.collective} seq {op.seq} · {ex}"


def _tooltip(o: StepOp, plan: pb.Plan) -> str:
    node = plan.graph.nodes[o.op.task] if o.op.task < len(plan.graph.nodes) else None
    where = f" {node.name}" if node is not None and node.name else ""
    loc = f" ({node.loc.file}:{node.loc.line})" if node is not None and node.loc.file else ""
    section = "prologue" if o.prologue else "loop"
    return f"{o.actor} {section} op {o.index}: {format_op(o.op)}{where}{loc}"


def _lighter(hex_colour: str) -> str:
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return "#{:02x}{:02x}{:02x}".format(*((c + 255) // 2 for c in (r, g, b)))


def schedule_chart(plan: pb.Plan) -> LaneChart:
    """The plan's schedule as a ``LaneChart`` (see the module docstring).

    Example: ``schedule_chart(plan).width`` is the number of steps of one execution.
    """
    grid = step_plan(plan)
    actors = {a.name: a for a in plan.graph.actors}
    above = _comm_row_above(grid)
    rows: list[Row] = []
    for i, name in enumerate(grid.actors):
        cls = class_name(actors[name]) if name in actors else ""
        own = [Row(name, name, cls, actor_tint(i))]
        if name in above:
            comm_row = Row(name + "~", name, "comm stream", _lighter(actor_tint(i)))
            own.insert(0 if above[name] else 1, comm_row)
        rows += own
    cells = []
    for o in grid.ops:
        fill, border = OP_STYLE.get(o.op.kind, ("#ffffff", "#444444"))
        title, detail = _cell_text(o, plan)
        width = 1.0
        if o.hoisted:
            border, width = _HOISTED, 2.2
        if not o.matched:
            border, width, detail = _UNMATCHED, 2.2, "unmatched!"
        if o.prologue:
            detail = "prologue · " + detail
        cells.append(Cell(
            o.key, o.actor + ("~" if o.comm_row else ""), o.step, title, detail,
            fill=fill, border=border, penwidth=width, dashed=o.comm_row,
            tooltip=_tooltip(o, plan),
        ))
    links = [Link(a, b, *_LINKS[kind]) for a, b, kind in grid.links]
    return LaneChart(_title(plan, grid.width, len(grid.ops)), rows, cells, links,
                     _legend(grid))


def _comm_row_above(grid: StepGrid) -> dict[str, bool]:
    """For each actor with a comm stream: draw its row above the compute row?

    Above when most of its SEND/RECV/COLL partners are in lanes above it, so that their
    joining lines cross as few rows as possible (both ends of a 2-stage pipeline's lines
    then sit in adjacent rows).
    """
    index = {a: i for i, a in enumerate(grid.actors)}
    by_key = {o.key: o for o in grid.ops}
    up: dict[str, int] = dict.fromkeys(grid.comm_actors(), 0)
    for a, b, kind in grid.links:
        if kind == "host":
            continue
        for me, other in ((by_key[a], by_key[b]), (by_key[b], by_key[a])):
            if me.comm_row:
                up[me.actor] += 1 if index[other.actor] < index[me.actor] else -1
    return {a: n > 0 for a, n in up.items()}


def _title(plan: pb.Plan, steps: int, ops: int) -> str:
    info = plan.lowered.schedule
    n = len(plan.graph.actors)
    line2 = [f"{n} actor{'s' if n != 1 else ''}", f"{ops} ops in {steps} steps",
             f"capacity {plan.config.capacity} executions in flight"]
    line3 = [f"scheduler {info.scheduler}"] if info.scheduler else []
    line3.append("overlap on" if info.overlap else "overlap off")
    if info.makespan_us:
        line3.append(f"simulated makespan {info.makespan_us:g} us")
    return (f"plan {plan.name or '?'}: schedule of one execution (i)\n"
            + " · ".join(line2) + "\n" + " · ".join(line3))


def _legend(grid: StepGrid) -> list[LegendEntry]:
    kinds = {o.op.kind for o in grid.ops}
    out = [LegendEntry("fwd #0", "compute: method #call, task id, execution",
                       *OP_STYLE[pb.COMPUTE])]
    if kinds & {pb.READ, pb.WRITE}:
        out.append(LegendEntry("R c1 / W c2", "read / write a host channel", *OP_STYLE[pb.READ]))
    if kinds & {pb.SEND, pb.RECV}:
        out.append(LegendEntry("SEND / RECV", "NCCL send / receive, #seq", *OP_STYLE[pb.SEND]))
    if pb.COLL in kinds:
        out.append(LegendEntry("allreduce", "collective", *OP_STYLE[pb.COLL]))
    if any(o.comm_row for o in grid.ops):
        out.append(LegendEntry("dashed", "on the comm stream (its own row)", "#ffffff", "#444444"))
    if any(o.hoisted for o in grid.ops):
        out.append(LegendEntry("RECV", "hoisted: runs under an earlier compute",
                               OP_STYLE[pb.RECV][0], _HOISTED))
    if any(o.op.exec_offset for o in grid.ops):
        out.append(LegendEntry("i+1", "serves the next execution (prefetch)"))
    if any(not o.matched for o in grid.ops):
        out.append(LegendEntry("unmatched!", "no partner in this execution",
                               "#ffffff", _UNMATCHED))
    links = {k for _, _, k in grid.links}
    if "nccl" in links:
        out.append(LegendEntry("", "send → recv (same step)", border=_LINKS["nccl"][0],
                               line_style="solid"))
    if "host" in links:
        out.append(LegendEntry("", "write → read", border=_LINKS["host"][0], line_style="dashed"))
    if "coll" in links:
        out.append(LegendEntry("", "collective members", border=_LINKS["coll"][0],
                               line_style="dotted"))
    return out


def schedule_dot(plan: pb.Plan) -> str:
    """DOT source of the schedule view (pinned layout; Graphviz's neato draws it).

    Example: ``Path("s.dot").write_text(schedule_dot(plan))``.
    """
    return lanes_dot(schedule_chart(plan))
