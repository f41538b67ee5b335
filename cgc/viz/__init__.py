"""Drawing plans, offline, from the plan file alone (no Ray, no cluster).

* ``graph_dot``: the graph view, actors as clusters and edges coloured by transport;
* ``schedule_dot``: the schedule view, every program on one time grid (``lanes`` draws
  it, ``steps`` places the ops);
* ``ascii_view`` / ``schedule_ascii``: the same for a terminal;
* ``render``: DOT to png/svg/pdf (Graphviz: the ``dot`` program, or pygraphviz) or .dot.

Example::

    from cgc import viz
    viz.render(viz.schedule_dot(plan), Path("plan.schedule.png"))
"""

from __future__ import annotations

from cgc.viz.ascii_view import ascii_view, schedule_ascii
from cgc.viz.graph_view import graph_dot
from cgc.viz.render import FORMATS, RenderError, output_format, render
from cgc.viz.schedule_view import schedule_chart, schedule_dot

__all__ = [
    "graph_dot",
    "schedule_dot",
    "schedule_chart",
    "ascii_view",
    "schedule_ascii",
    "render",
    "output_format",
    "RenderError",
    "FORMATS",
]
