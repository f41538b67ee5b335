"""The driver's monitor thread: notices a dead actor or a crashed loop and fails the graph.

Each actor runs ``wait_loop`` in Ray's ``_ray_system`` concurrency group; its ref resolves
only when the loop exits (a crash, or teardown) or fails when the actor dies. The monitor
``ray.wait``s on those refs with a 0.5 s poll (so it notices its own stop quickly), and on
the first one that resolves outside teardown records an ``ActorDiedError`` (or
``GraphFailedError`` with the loop's traceback) and tears the graph down, which poisons
every channel so blocked readers and writers wake. That group has one thread per actor:
with several graphs on one actor, a waiter returns ``{"exited": False}`` when another
graph's loop exits, and the monitor issues it again (so each graph's waiter gets a turn).

Example::

    mon = Monitor(graph, waiters={ref: "w0"}); mon.start(); ...; mon.stop()
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from cgc.runtime.driver.session import ray_calls
from cgc.runtime.errors import ActorDiedError, GraphFailedError
from cgc.runtime.ray_internals import call_in_actor

__all__ = ["Monitor", "POLL_S"]

LATE_REASON_S = 3.0  # how long a clean exit waits for the real cause
POLL_S = 0.5


class Monitor:
    """Watches the per-actor ``wait_loop`` refs of one graph."""

    def __init__(self, graph: Any, waiters: dict[Any, str]) -> None:
        self.graph = graph
        self.waiters = dict(waiters)  # ref -> actor name, still pending
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"cgc-monitor-{graph.gid}",
                                       daemon=True)

    def start(self) -> None:
        self.thread.start()

    def is_current_thread(self) -> bool:
        """True when called from the monitor's own thread."""
        return threading.current_thread() is self.thread

    def stop(self) -> None:
        """Stop polling and join (unless called from the monitor thread itself)."""
        self._stop.set()
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join(timeout=2 * POLL_S + 1)

    def _run(self) -> None:
        try:
            self._watch()
        except SystemExit:  # Ray shut down under us: stop quietly
            return
        except Exception as exc:  # noqa: BLE001 - say so: failures would go unnoticed now
            import ray

            if ray.is_initialized() and not self._stop.is_set():
                logging.getLogger("cgc.runtime").warning(
                    "cgc: the monitor of graph %r stopped (%s: %s); actor deaths will only "
                    "show as timeouts", self.graph.name, type(exc).__name__, exc)

    def _watch(self) -> None:
        while not self._stop.is_set() and self.waiters:
            # Why the gate: checking that the graph's Ray session is alive and calling Ray
            # must be one step, or ray.shutdown() in another thread could come between them
            # (a Ray call after it starts a new local Ray, or waits on a dead session's refs).
            with ray_calls(self.graph.ray_session) as ok:
                if not ok:
                    return
                failure = self._poll()
            if failure is not None:
                _, cls, msg, kw = failure
                if not self.graph.closing:
                    self.graph.fail(cls, msg, **kw)
                return

    def _poll(self) -> tuple[int, type, str, dict] | None:
        """One round: wait briefly for a loop to exit; its reason when one did."""
        import ray

        ready, _ = ray.wait(list(self.waiters), num_returns=1, timeout=POLL_S)
        if self._stop.is_set() or self.graph.closing:
            return None
        ready = self._exits(ready)
        if not ready:
            return None
        # Give the others a moment: a crash poisons channels, and the loops it wakes
        # exit cleanly right after; report the real cause, not the first clean exit.
        more, _ = ray.wait(list(self.waiters), num_returns=len(self.waiters), timeout=0.2)
        more = self._exits(more)
        reasons = [self._classify(r) for r in dict.fromkeys(ready + more)]
        reasons.sort(key=lambda x: x[0])
        if reasons[0][0] == 2 and self.waiters:
            # Only clean exits so far: the loop that crashed (or the actor that died) may
            # still be reporting on a loaded machine; its reason is the one to give.
            late, _ = ray.wait(list(self.waiters), num_returns=len(self.waiters),
                               timeout=LATE_REASON_S)
            late = self._exits(late)
            reasons += [self._classify(r) for r in late]
            reasons.sort(key=lambda x: x[0])
        return reasons[0]

    def _exits(self, ready: list[Any]) -> list[Any]:
        """The refs of ``ready`` that report an exit (or a death); wait again on the others.

        A ``wait_loop`` also returns ``{"exited": False}`` when another graph's loop on the
        same actor exited (the waiters take turns on one thread): issue it again.
        """
        import ray

        from cgc.runtime.actor.entry import wait_loop

        out = []
        for ref in ready:
            try:
                got = ray.get(ref, timeout=5)
            except Exception:  # noqa: BLE001 - a death or a lost ref: _classify says which
                out.append(ref)
                continue
            if got["exited"]:
                out.append(ref)
                continue
            name = self.waiters.pop(ref)
            again = call_in_actor(self.graph.actors[name], wait_loop, self.graph.gid,
                                  system_group=True)
            self.waiters[again] = name
        return out

    def _classify(self, ref: Any) -> tuple[int, type, str, dict]:
        import ray

        name = self.waiters.pop(ref)
        g = self.graph
        try:
            crash = ray.get(ref, timeout=5)["crash"]
        except ray.exceptions.RayActorError as exc:
            g.mark_dead(name)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return (0, ActorDiedError,
                    f"graph {g.name!r}: actor {name} died ({first}); the graph was torn down",
                    {"actor": name})
        except Exception as exc:  # noqa: BLE001 - anything else: still a failure
            return (1, GraphFailedError,
                    f"graph {g.name!r}: lost actor {name}'s loop: {type(exc).__name__}: {exc}",
                    {})
        if crash:
            return (1, GraphFailedError,
                    f"graph {g.name!r}: actor {name}'s loop crashed; the graph was torn "
                    f"down:\n{crash}", {})
        return (2, GraphFailedError,
                f"graph {g.name!r}: actor {name}'s loop stopped (a peer failed)", {})

    def where_blocked(self, timeout: float = 1.0) -> list[dict[str, Any]]:
        """Ask each live actor which op its loop is at (for timeout reports).

        One row per actor: ``{"actor", "execution", "op", "token", "waiting"}``.
        """
        import ray

        from cgc.runtime.actor.entry import where_blocked

        g = self.graph
        names = [n for n in g.actors if n not in g.dead_actors]
        out = []
        with ray_calls(g.ray_session) as ok:
            if not ok:  # Ray's session ended: nobody to ask
                return []
            refs = [call_in_actor(g.actors[n], where_blocked, g.gid) for n in names]
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
            for n, r in zip(names, refs, strict=True):
                row = {"actor": n, "execution": -1, "op": "", "token": "", "waiting": ""}
                if r in ready:
                    try:
                        row.update({k: v for k, v in ray.get(r).items() if v != ""})
                        row["actor"] = n
                    except Exception as exc:  # noqa: BLE001
                        row["waiting"] = f"unknown ({type(exc).__name__})"
                else:
                    row["waiting"] = "not answering (busy in a method call?)"
                out.append(row)
        for n in sorted(g.dead_actors):
            out.append({"actor": n, "execution": -1, "op": "", "token": "", "waiting": "dead"})
        return out
