"""A graph lives and ends with the Ray session it started in (Ray's lifecycle).

``ray.shutdown()`` - the user's, a test fixture's, or Ray's own at interpreter exit - first
tears down every compiled graph in Ray's registry (``ray_internals.compiled_dag_registry``).
Each Ray session in which a cgc graph starts gets one entry there, ``HOOK``; when Ray calls
it, while Ray is still up, it

1. tears down every cgc graph of this process (``plan.start()`` graphs and the drop-in's
   alike; a teardown already under way in another thread is waited for), and kills the
   actors a graph lists in ``kill_at_session_end`` (the drop-in's live actors: Ray's
   shutdown kills its compiled graphs' actors), then
2. closes the session's gate: no cgc thread calls Ray for that session again.

The gate is how a background thread (the monitor, a teardown started by a failure or by the
garbage collector) calls Ray: ``with ray_calls(graph.ray_session) as ok: if ok: ray...``.
Checking that the session is alive and registering the call happen under one lock, and
closing waits for every call already inside to return (each is bounded by its own timeout),
so no cgc thread is ever inside Ray once its session ended - no ``ray.wait`` on a dead
session's refs, no Ray call that would start a second local Ray from a background thread.

Example::

    with ray_calls(graph.ray_session) as ok:
        if ok:
            ready, _ = ray.wait(refs, timeout=0.5)
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from cgc.runtime.driver.cluster import forget_local_ray, ray_session
from cgc.runtime.ray_internals import compiled_dag_registry

__all__ = ["HOOK", "track_session", "ray_calls", "session_ended", "end_session"]

log = logging.getLogger("cgc.runtime")

# The key of cgc's entry in Ray's registry (Ray's own keys are uuid4 hex strings).
HOOK_KEY = "cgc-session-hook"
# How long closing the gate waits for calls inside Ray; each is bounded by its own timeout
# (the monitor's polls, a teardown's wait), so this only guards against a hang.
CLOSE_WAIT_S = 120.0


class _Gate:
    """Ray calls of cgc threads, per session: many at once, none after the session closed."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._inside: dict[int, int] = {}  # thread id -> calls it is inside now
        self._closed: set[str] = set()

    @contextlib.contextmanager
    def calls(self, session: str) -> Iterator[bool]:
        me = threading.get_ident()
        with self._cond:
            ok = bool(session) and session not in self._closed and ray_session() == session
            if ok:
                self._inside[me] = self._inside.get(me, 0) + 1
        try:
            yield ok
        finally:
            if ok:
                with self._cond:
                    n = self._inside[me] - 1
                    if n:
                        self._inside[me] = n
                    else:
                        del self._inside[me]
                    self._cond.notify_all()

    def closed(self, session: str) -> bool:
        with self._cond:
            return session in self._closed

    def close(self, session: str) -> None:
        """Refuse new calls for ``session``; wait for other threads' calls to return."""
        me = threading.get_ident()
        deadline = time.monotonic() + CLOSE_WAIT_S
        with self._cond:
            self._closed.add(session)
            while any(t != me for t in self._inside):
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("cgc: %d thread(s) still inside Ray calls at ray.shutdown()",
                                sum(1 for t in self._inside if t != me))
                    return
                self._cond.wait(left)


_GATE = _Gate()


def ray_calls(session: str) -> contextlib.AbstractContextManager[bool]:
    """A context in which a cgc thread may call Ray for ``session``: it yields True while
    that session is this process's live Ray connection and has not ended; the session's end
    waits for the context to exit.

    Example: ``with ray_calls(g.ray_session) as ok: ok and ray.kill(h)``.

    Raises:
        Nothing of its own.
    """
    return _GATE.calls(session)


def session_ended(session: str) -> bool:
    """True once ``ray.shutdown()`` ended ``session`` (cgc's hook ran for it).

    Example: ``session_ended(graph.ray_session)`` after ``ray.shutdown()`` is True.
    """
    return _GATE.closed(session)


def end_session() -> None:
    """Tear down every cgc graph of this process, then close the current session's gate.

    Ray's ``ray.shutdown()`` calls this (through ``HOOK``) before it disconnects; calling it
    by hand does the same without shutting Ray down.

    Example: ``end_session(); assert not cgc.runtime.driver.graph.live_graphs()``.

    Raises:
        Nothing; a graph whose teardown fails is logged.
    """
    from cgc.runtime.driver.graph import live_graphs, teardown_all

    session = ray_session()
    graphs = live_graphs(include_closing=True)
    teardown_all()
    kill = [h for g in graphs if g.ray_session == session for h in g.kill_at_session_end]
    if kill:
        _kill(session, kill)
    if session:
        _GATE.close(session)
    forget_local_ray()


def _kill(session: str, handles: list[Any]) -> None:
    import ray

    with _GATE.calls(session) as ok:
        for h in handles if ok else ():
            try:
                ray.kill(h)
            except (Exception, SystemExit):  # noqa: BLE001 - already gone
                pass


class _SessionHook:
    """cgc's entry in Ray's registry of compiled graphs (Ray calls ``teardown``)."""

    def teardown(self, kill_actors: bool = False) -> None:
        # Why kill_actors is not passed on: the actors a graph created die with it; the
        # user's own actors are killed only where Ray would (``kill_at_session_end``).
        try:
            end_session()
        except Exception:  # noqa: BLE001 - never break the user's ray.shutdown()
            log.exception("cgc: tearing down cgc's graphs at ray.shutdown() failed")

    def get_id(self) -> str:
        return HOOK_KEY

    def __repr__(self) -> str:
        return "<cgc session hook>"


HOOK = _SessionHook()  # kept alive here: Ray's registry holds weak references


def track_session() -> None:
    """Make sure the current Ray session's ``ray.shutdown()`` runs ``end_session`` first
    (``start()`` calls this once Ray is up; Ray replaces its registry at every shutdown,
    so each session is registered anew).

    Example: ``track_session()`` after ``ray.init()``.

    Raises:
        Nothing; a Ray without the registry is reported once by ``ray_internals``.
    """
    registry = compiled_dag_registry()
    if registry is not None and registry.get(HOOK_KEY) is not HOOK:
        registry[HOOK_KEY] = HOOK
