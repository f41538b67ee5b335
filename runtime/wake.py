"""Wake-ahead settings: each actor's depth in the graph and the window of bells to ring.

The depth of an actor is its distance in hops from the driver along the plan's host
channels (breadth-first, so actors called twice in one execution keep their first depth).
The driver rings depths ``2..1+K`` at submit and an actor at depth ``d`` rings ``d+K``
when it starts its work (``cgc.runtime.channels.bell``). ``K`` defaults to half the cores
of the driver's node: those readers spin while the data moves, the rest of the cores stay
free for the actors doing the work; below 4 cores wake-ahead is off (a spinner there
steals the core its upstream needs).

Example: ``actor_depths(plan.proto)`` → ``{"worker0": 1, "worker1": 2}``.
"""

from __future__ import annotations

import os

from cgc.plan_schema import DRIVER
from cgc.plan_schema import plan_pb2 as pb

__all__ = ["actor_depths", "wake_window"]


def actor_depths(plan: pb.Plan) -> dict[str, int]:
    """Hops from the driver to each actor along host channels (actors not reached: absent)."""
    succ: dict[str, set[str]] = {}
    for ch in plan.lowered.channels:
        if ch.kind == pb.CHAN_HOST:
            succ.setdefault(ch.writer, set()).update(r for r in ch.readers if r != DRIVER)
    depth = {DRIVER: 0}
    frontier = [DRIVER]
    while frontier:
        nxt = []
        for a in frontier:
            for b in sorted(succ.get(a, ())):
                if b not in depth:
                    depth[b] = depth[a] + 1
                    nxt.append(b)
        frontier = nxt
    depth.pop(DRIVER)
    return depth


def wake_window(setting: int, cores: int | None = None) -> int:
    """The window ``K``: ``setting`` when >= 0, else (auto) half the cores from 4 cores up."""
    if setting >= 0:
        return setting
    cores = cores or os.cpu_count() or 1
    return cores // 2 if cores >= 4 else 0
