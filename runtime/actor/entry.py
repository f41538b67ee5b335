"""The functions the driver runs inside actors with ``actor.__ray_call__`` (one graph each).

Set-up rounds ``setup_probe`` → ``setup_writers`` → ``setup_start``, then ``wait_loop``
(in Ray's ``_ray_system`` concurrency group, watched by the driver's monitor),
``stop_loop`` (teardown) and ``where_blocked`` (timeout reports). ``self`` is the actor
instance; the loops live in ``cgc.runtime.actor.loops.LOOPS`` by graph id, so several graphs
can share an actor.

Example: ``handle.__ray_call__.remote(setup_probe, gid, plan_bytes, "w0", opts)``.
"""

from __future__ import annotations

import time
from typing import Any

from cgc.plan_schema import plan_pb2 as pb
from cgc.runtime.actor.executor import ActorLoop
from cgc.runtime.actor.host import user_object
from cgc.runtime.actor.loop_state import LoopOptions
from cgc.runtime.actor.loops import EXITS, LOOPS, LOOPS_CHANGED, LOOPS_LOCK, TRACES
from cgc.runtime.channels.shm import shm_free_bytes
from cgc.runtime.embedded import plan_modules, register
from cgc.runtime.errors import SetupError

__all__ = ["setup_probe", "setup_writers", "setup_start", "wait_loop", "stop_loop",
           "where_blocked", "collect_trace", "cuda_graph_stats"]

# Called as actor.__ray_call__.remote(fn, ...): ``self`` is the actor instance.


def setup_probe(self: Any, gid: str, plan_bytes: bytes, actor: str,
                opts: LoopOptions) -> dict:
    """Build this actor's loop for graph ``gid``; return where the actor runs."""
    import os

    import ray

    plan = pb.Plan.FromString(plan_bytes)
    register(plan_modules(plan))  # values of model-file classes from any actor unpickle here
    loop = ActorLoop(gid, plan, actor, user_object(self), opts)
    with LOOPS_LOCK:
        LOOPS[gid] = loop
    ctx = ray.get_runtime_context()
    # shm_free: this node's free /dev/shm, which the driver checks the rings against
    return {"node": ctx.get_node_id(), "pid": os.getpid(),
            "ip": ray.util.get_node_ip_address(), "shm_free": shm_free_bytes(), **loop.probe()}


def _loop(gid: str) -> ActorLoop:
    with LOOPS_LOCK:
        loop = LOOPS.get(gid)
    if loop is None:
        raise SetupError(f"graph {gid} is not set up on this actor (torn down?)")
    return loop


def setup_writers(self: Any, gid: str, tcp: set[int], ip: str,
                  transports: dict[int, str]) -> dict[str, Any]:
    """Create the writing ends of this actor's host channels (``tcp``: ids bound to TCP);
    as rank 0 of an NCCL-bound communicator, make its unique id.

    Returns ``{"addrs": {channel: (ip, port)} of TCP writers, "nccl_ids": {comm: id}}``.
    """
    loop = _loop(gid)
    loop.transports = dict(transports)
    return {"addrs": loop.open_writers(tcp, ip), "nccl_ids": loop.make_nccl_ids()}


def setup_start(self: Any, gid: str, timeout: float, addrs: dict[int, tuple[str, int]],
                nccl_ids: dict[int, bytes] | None = None) -> float:
    """Attach readers, join communicators, warm every edge, start the loop thread.

    Returns the seconds spent; on failure the actor's part is closed again.
    """
    t0 = time.perf_counter()
    loop = _loop(gid)
    try:
        loop.open_readers_and_comms(timeout, addrs, nccl_ids)
        loop.warm(timeout)
        loop.start()
    except BaseException:
        loop.poison()
        loop.close()
        with LOOPS_LOCK:
            LOOPS.pop(gid, None)
        raise
    return time.perf_counter() - t0


def wait_loop(self: Any, gid: str) -> dict[str, Any]:
    """Block until the loop of ``gid`` exits, or until another loop of this actor exits.

    Returns ``{"exited": True, "crash": traceback or None}`` when ``gid``'s loop is gone,
    ``{"exited": False, "crash": None}`` when another loop exited first: the caller issues
    the wait again. Why: this runs in Ray's ``_ray_system`` group, which has one thread; a
    waiter that held it until its own loop exited would queue the waiters of every other
    graph on the actor behind it, so their exits (a crash, a teardown) went unseen.
    """
    seen_change = False
    with LOOPS_CHANGED:
        while True:
            if gid in EXITS:
                return {"exited": True, "crash": EXITS.pop(gid)}
            if gid not in LOOPS:
                return {"exited": True, "crash": None}
            if seen_change:
                return {"exited": False, "crash": None}
            LOOPS_CHANGED.wait()
            seen_change = True


def stop_loop(self: Any, gid: str, wait_s: float = 0.0) -> bool:
    """Poison the loop's endpoints so it exits (close them if it never started); wait up
    to ``wait_s`` for it to exit. Returns True once this graph's loop is gone.

    Only ``gid``'s loop is touched: other graphs on the same actor keep running.
    """
    with LOOPS_LOCK:
        loop = LOOPS.get(gid)
    if loop is None:
        return True
    loop.stopping = True
    loop.poison()
    if loop.thread is None:  # set-up did not get as far as the loop: clean up here
        loop.close()
        loop.exited.set()
        with LOOPS_CHANGED:
            LOOPS.pop(gid, None)
            LOOPS_CHANGED.notify_all()
        return True
    return loop.exited.wait(wait_s) if wait_s > 0 else loop.exited.is_set()


def where_blocked(self: Any, gid: str) -> dict[str, Any]:
    """Which op the loop of ``gid`` is at, as ``ActorLoop.where`` reports it."""
    with LOOPS_LOCK:
        loop = LOOPS.get(gid)
    if loop is None:
        return {"actor": "", "execution": -1, "op": "", "token": "", "waiting": "no loop"}
    return loop.where()


def collect_trace(self: Any, gid: str) -> dict | None:
    """This actor's recorded op slices of graph ``gid`` (and forget them); None if none.

    ``clock_ns`` is this process's ``time.monotonic_ns()`` at the call, for the driver's
    clock-offset estimate.
    """
    import os

    with LOOPS_LOCK:
        recs = TRACES.pop(gid, None)
    if recs is None:
        return None
    return {"pid": os.getpid(), "clock_ns": time.monotonic_ns(),
            "prologue": recs[0].snapshot(), "events": recs[1].snapshot()}


def cuda_graph_stats(self: Any, gid: str) -> dict[str, Any]:
    """This actor's captured calls of graph ``gid``: captures, replays, eager runs, why."""
    with LOOPS_LOCK:
        loop = LOOPS.get(gid)
    return {} if loop is None else loop.graph_stats()
