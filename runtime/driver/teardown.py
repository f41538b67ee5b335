"""Tearing a graph down: wake everything, wait for the loops, free every resource.

Order matters: (1) poison every host channel by name (wakes blocked actors *and* driver
threads: pending ``get()``s raise instead of hanging); (2) ask live actors to stop this graph's loop (closes
communicators, covers channels the driver cannot reach; other graphs sharing an actor keep
running); (3) wait up to the teardown timeout for the loops to exit (they close their own endpoints, so writers unlink their segments);
(4) stop the monitor; (5) close the driver's endpoints; (6) kill the actors the plan
created; (7) unlink whatever a dead process left under the graph's prefix; (8) stop the
async pool.

Example: ``teardown_graph(graph)`` (``CompiledGraph.teardown`` calls it once).
"""

from __future__ import annotations

import logging
from typing import Any

from cgc.plan_schema import plan_pb2 as pb
from cgc.runtime.driver.session import ray_calls
from cgc.runtime.ray_internals import call_in_actor

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
            from cgc.runtime.channels import janitor
            from cgc.runtime.channels.shm import cleanup_segments

            cleanup_segments(g.prefix)
            janitor.forget(g.prefix)
        except Exception:  # noqa: BLE001
            pass
        g.shutdown_pool()


def _stop_everything(g: Any) -> None:
    import ray

    poison_all(g)  # first: a get() blocked in a read holds the read lock until it wakes
    g.wake_waiters()  # an execute() waiting for buffered results to be fetched
    dead = g.dead_actors
    live = {n: h for n, h in g.actors.items() if n not in dead}
    # Only in the Ray session the graph started in, checked and called under the session
    # gate: after ray.shutdown() (and maybe a new ray.init()) its handles are stale, and a
    # call would start or reach another Ray. ray.shutdown() waits for these calls to return.
    with ray_calls(g.ray_session) as ray_up:
        if ray_up:
            _stop_loops(g, live)
    if g.monitor is not None:
        g.monitor.stop()
    with ray_calls(g.ray_session) as ray_up:
        if ray_up and g.config.trace:
            _write_trace(g, live)
    g.close_endpoints()
    with ray_calls(g.ray_session) as ray_up:
        if not ray_up:
            return
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
    from cgc.runtime.actor.entry import collect_trace
    from cgc.runtime.trace import write_chrome_trace

    t0 = time.monotonic_ns()
    refs = {call_in_actor(h, collect_trace, g.gid): n for n, h in live.items()}
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


def _stop_loops(g: Any, live: dict[str, Any]) -> None:
    """Stop this graph's loop on every live actor and wait for them to exit.

    Each ``stop_loop`` call waits inside the actor for this graph's loop only (not the
    monitor's ``wait_loop`` refs: those share Ray's one-thread ``_ray_system`` group with
    the waiters of other graphs on the same actor, so they can sit queued behind a graph
    that keeps running). Actors the plan created are waited for briefly (they are killed
    next; their leftovers are unlinked by prefix); external actors must be left clean, so
    they get the whole teardown timeout (a loop stuck in a long user method cannot exit
    until the method returns).
    """
    import time

    import ray

    from cgc.runtime.actor.entry import stop_loop

    if not live:
        return
    full = g.teardown_timeout
    # A loop under the torch profiler writes its trace as it exits: give it the time.
    brief = full if g.config.torch_profile else min(full, 2.0)
    waits: dict[Any, str] = {}
    for name, h in live.items():
        wait_s = brief if name in g.created else full
        try:
            waits[call_in_actor(h, stop_loop, g.gid, wait_s)] = name
        except (Exception, SystemExit):  # noqa: BLE001 - the actor or Ray may be gone
            pass
    deadline = time.monotonic() + full + 1.0  # the actors time their own waits
    stuck = []
    try:
        pending = list(waits)
        while pending:
            ready, pending = ray.wait(pending, num_returns=len(pending),
                                      timeout=max(0.0, deadline - time.monotonic()))
            for r in ready:
                try:
                    if not ray.get(r) and waits[r] not in g.created:
                        stuck.append(waits[r])
                except (Exception, SystemExit):  # noqa: BLE001 - died meanwhile: nothing to wait
                    pass
            if not ready:
                break
        stuck += [waits[r] for r in pending if waits[r] not in g.created]
    except (Exception, SystemExit):  # noqa: BLE001 - Ray shutting down: nothing to wait for
        return
    if stuck:
        log.warning("cgc: graph %r: the loops of %s did not stop within %.1f s (busy in a "
                    "method call?); they exit when it returns", g.name,
                    ", ".join(sorted(stuck)), full)
