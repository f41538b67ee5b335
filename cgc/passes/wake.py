"""Pass ``wake``: each actor's wake-ahead depth, stored in ``Program.wake_depth``.

The depth of an actor is its distance in hops from the driver along the plan's host
channels, breadth-first (an actor reached twice, say one that reads the driver's input and
a later stage's result, keeps its first depth); an actor no host channel from the driver
reaches has depth 0 (no doorbell). At run time the driver rings depths ``2..1+K`` at submit
and an actor at depth ``d`` rings ``d+K`` when its first compute starts
(``cgc.runtime.channels.bell``); the window ``K`` depends on the cores of the machine that
runs the plan, so it stays a run-time setting (``start(wake_ahead=)``).

Example: for ``inp -> a.f -> b.g -> output`` the programs get ``a: 1``, ``b: 2``.
"""

from __future__ import annotations

import networkx as nx

from cgc.passes.state import LowerState, require
from cgc.plan_schema import DRIVER
from cgc.plan_schema import plan_pb2 as pb

__all__ = ["assign_wake_depths", "pre", "post"]

_NAME = "wake"


def _depths(low: pb.Lowered) -> dict[str, int]:
    """Hops from the driver along host channels (breadth-first: the first depth wins)."""
    g = nx.DiGraph()
    g.add_node(DRIVER)
    g.add_edges_from((ch.writer, r) for ch in low.channels if ch.kind == pb.CHAN_HOST
                     for r in ch.readers if r != DRIVER)
    return dict(nx.single_source_shortest_path_length(g, DRIVER))


def assign_wake_depths(state: LowerState) -> None:
    """Set ``wake_depth`` of every program (0 for actors the driver does not reach).

    Example: ``[p.wake_depth for p in plan.lowered.programs] == [1, 2]`` for a chain a -> b.
    """
    depth = _depths(state.lowered)
    for prog in state.lowered.programs:
        prog.wake_depth = depth.get(prog.actor, 0)


def pre(state: LowerState) -> None:
    low = state.lowered
    require(len(low.programs) == len(state.plan.graph.actors), _NAME,
            "needs one program per actor (pass schedule first)")
    require(all(p.wake_depth == 0 for p in low.programs), _NAME, "depths already set")


def post(state: LowerState) -> None:
    low = state.lowered
    depth = {p.actor: p.wake_depth for p in low.programs}
    require(all(0 <= d <= len(low.programs) for d in depth.values()), _NAME,
            "a depth beyond the number of actors")
    # Every host channel's reader is at most one hop below its writer (the driver is 0).
    for ch in low.channels:
        if ch.kind != pb.CHAN_HOST:
            continue
        top = 0 if ch.writer == DRIVER else depth[ch.writer]
        if ch.writer != DRIVER and top == 0:
            continue
        for r in ch.readers:
            if r != DRIVER:
                require(1 <= depth[r] <= top + 1, _NAME,
                        f"{r} reads c{ch.id} from {ch.writer} (depth {top}) but has depth "
                        f"{depth[r]}")
