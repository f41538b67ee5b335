"""Tearing a graph down: wake everything, wait for the loops, free every resource.

Order matters: (1) poison every host channel by name (wakes blocked actors *and* driver
threads: pending ``get()``s raise instead of hanging); (2) ask live actors to stop (closes
communicators, covers channels the driver cannot reach); (3) wait up to the teardown timeout
for the loops to exit (they close their own endpoints, so writers unlink their segments);
(4) stop the monitor; (5) close the driver's endpoints; (6) kill the actors the plan
created; (7) unlink whatever a dead process left under the graph's prefix; (8) stop the
async pool.

Example: ``teardown_graph(graph)`` (``CompiledGraph.teardown`` calls it once).
"""

from __future__ import annotations

import logging
from typing import Any

from cgc.plan_schema import plan_pb2 as pb
from cgc.runtime.cluster import ray_session

__all__ = ["teardown_graph", "poison_all"]

log = logging.getLogger("cgc.runtime")


def poison_all(graph: Any) -> None:
    """Poison the driver's endpoints and every host ring of the graph on this node."""
    from cgc.runtime.endpoints import poison_channel

    graph.endpoints.poison()  # also reaches TCP channels, which have no name to poison by
    for ch in graph.plan.proto.lowered.channels:
        if ch.kind == pb.CHAN_HOST:
            try:
                poison_channel(graph.prefix, ch.id)
            except Exception:  # noqa: BLE001 - best effort
                pass


def teardown_graph(g: Any) -> None:
    """Tear ``g`` down (see module docstring); every step runs even if an earlier one fails."""
    try:
        _stop_everything(g)
    finally:
        try:
            from cgc.runtime.channels.shm import cleanup_segments

            cleanup_segments(g.prefix)
        except Exception:  # noqa: BLE001
            pass
        g.shutdown_pool()


def _stop_everything(g: Any) -> None:
    import ray

    poison_all(g)  # first: a get() blocked in a read holds the read lock until it wakes
    g.wake_waiters()  # an execute() waiting for buffered results to be fetched
    dead = g.dead_actors
    live = {n: h for n, h in g.actors.items() if n not in dead}
    # Only in the Ray connection the graph started in: after ray.shutdown() (and maybe a new
    # ray.init()) its handles are stale, and a call would start or reach another Ray.
    ray_up = bool(g.ray_session) and ray_session() == g.ray_session
    if ray_up:
        from cgc.runtime.actor_calls import stop_loop

        stops = []
        for h in live.values():
            try:
                stops.append(h.__ray_call__.remote(stop_loop, g.gid))
            except (Exception, SystemExit):  # noqa: BLE001 - the actor or Ray may be gone
                pass
        waits = (g.monitor.loop_refs(dead) if g.monitor is not None
                 else dict(zip(stops, live, strict=False)))
        _wait_loops(g, waits)
    if g.monitor is not None:
        g.monitor.stop()
    if ray_up and g.config.trace:
        _write_trace(g, live)
    g.close_endpoints()
    if ray_up:
        for name in g.created:
            try:
                ray.kill(g.actors[name], no_restart=True)
            except (Exception, SystemExit):  # noqa: BLE001 - already dead, or Ray is gone
                pass


def _write_trace(g: Any, live: dict[str, Any]) -> None:
    """Collect every live actor's recorded slices and write the graph's trace file."""
    import time

    import ray

    from cgc.plan_schema import DRIVER
    from cgc.runtime.actor_calls import collect_trace
    from cgc.runtime.trace import write_chrome_trace

    t0 = time.monotonic_ns()
    refs = {h.__ray_call__.remote(collect_trace, g.gid): n for n, h in live.items()}
    ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=10.0)
    mid = (t0 + time.monotonic_ns()) // 2
    actors = []
    for r in ready:
        try:
            got = ray.get(r)
        except Exception:  # noqa: BLE001 - an actor that died has no trace to give
            continue
        if got is None:
            continue
        name = refs[r]
        same_node = g.actor_nodes.get(name) == g.actor_nodes.get(DRIVER)
        got["offset_ns"] = 0 if same_node else mid - got["clock_ns"]
        actors.append({"actor": name, **got})
    order = {a.name: i for i, a in enumerate(g.plan.proto.graph.actors)}
    actors.sort(key=lambda a: order[a["actor"]])
    try:
        n = write_chrome_trace(g.config.trace, g.plan.proto, actors, g.trace_events or [])
        log.info("cgc: wrote %d slices to %s", n, g.config.trace)
    except OSError as exc:
        log.warning("cgc: cannot write the trace to %s: %s", g.config.trace, exc)


def _wait_loops(g: Any, waits: dict[Any, str]) -> None:
    """Wait for the loops to exit: briefly for actors we kill anyway, fully for external ones.

    Why: a loop stuck in a long user method cannot exit until the method returns; actors
    the plan created are killed next (their leftovers are unlinked by prefix), external
    actors must be left clean, so only they get the whole teardown timeout.
    """
    import time

    import ray

    if not waits:
        return
    deadline = time.monotonic() + g.teardown_timeout
    try:
        # A loop under the torch profiler writes its trace as it exits: give it the time.
        first = g.teardown_timeout if g.config.torch_profile else min(g.teardown_timeout, 2.0)
        _, pending = ray.wait(list(waits), num_returns=len(waits), timeout=first)
        external = [r for r in pending if waits[r] not in g.created]
        if external:
            _, pending = ray.wait(external, num_returns=len(external),
                                  timeout=max(0.0, deadline - time.monotonic()))
            pending = external and pending
    except (Exception, SystemExit):  # noqa: BLE001 - Ray shutting down: nothing to wait for
        return
    stuck = sorted(waits[r] for r in pending if waits[r] not in g.created)
    if stuck:
        log.warning("cgc: graph %r: the loops of %s did not stop within %.1f s (busy in a "
                    "method call?); they exit when it returns", g.name, ", ".join(stuck),
                    g.teardown_timeout)
