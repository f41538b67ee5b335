"""Failures: app exceptions, dead actors, timeouts, teardown hygiene."""

from __future__ import annotations

import os
import threading
import time

import pytest
import ray
import rt_graphs as G

from cgc.runtime import (
    ActorDiedError,
    DirectReturnError,
    GetTimeoutError,
    GraphTornDownError,
    RemoteError,
    SubmitTimeoutError,
)
from cgc.runtime.channels import list_segments


def _cgc_threads():
    return [t.name for t in threading.enumerate() if t.name.startswith("cgc-")]


def test_method_exception_keeps_type_and_graph_continues(ray_cluster):
    with G.check_chain_plan().start(get_timeout=30) as g:
        assert g.execute(3).get() == 13
        bad = g.execute(-1)
        with pytest.raises(ValueError) as info:
            bad.get()
        exc = info.value
        assert isinstance(exc, G.AppError) and isinstance(exc, RemoteError)
        assert (exc.actor, exc.method, exc.exec_index) == ("worker0", "check", 1)
        msg = str(exc)
        assert "worker0" in msg and "check" in msg and "execution 1" in msg
        assert "negative input -1" in msg
        assert "raise AppError" in exc.remote_traceback
        assert g.execute(5).get() == 15  # the graph keeps working


def test_error_in_one_output_of_many(ray_cluster):
    with G.multi_plan().start(get_timeout=30) as g:
        a, b = g.execute("x")  # split gives ("x", "xx"); b.add("xx") fails: str + int
        # Fail-fast, as in Ray: an error in one output is the whole execution's error.
        for ref in (a, b):
            with pytest.raises(TypeError, match="worker1"):
                ref.get()
        assert [r.get() for r in g.execute(1)] == [1, 102]


def test_unsendable_result_is_an_error_value(ray_cluster):
    with G.unsendable_plan().start(get_timeout=30) as g:
        with pytest.raises(TypeError, match="cannot be sent") as info:
            g.execute(1).get()
        assert info.value.actor == "worker0"
        assert g.execute(0).get() == 1  # the graph keeps working


def test_direct_return_edge_takes_one_tensor_and_fails_only_that_execution(ray_cluster):
    import numpy as np

    plan = G.direct_return_plan()
    assert [ch.direct_return for ch in plan.proto.lowered.channels
            if ch.writer == "echo"] == [True]
    with plan.start(get_timeout=30) as g:
        x, y = (r.get() for r in g.execute(np.arange(3.0)))
        assert x.tolist() == y.tolist() == [0.0, 1.0, 2.0]
        bad = g.execute({"x": np.arange(3.0)})  # a dict holding a tensor: wrapped
        for ref in bad:  # the driver's copy and the downstream worker's result
            with pytest.raises(DirectReturnError) as info:
                ref.get()
            exc = info.value
            assert isinstance(exc, RemoteError) and isinstance(exc, TypeError)
            assert (exc.actor, exc.method, exc.exec_index) == ("echo", "echo", 1)
            msg = str(exc)
            assert "echo.echo#0 (Echo.echo) returned a dict" in msg and "direct_return" in msg
        x, y = (r.get() for r in g.execute(np.ones(2)))  # the graph keeps serving
        assert x.tolist() == y.tolist() == [1.0, 1.0]


def test_get_timeout_names_where_actors_are_blocked(ray_cluster):
    with G.slow_plan().start() as g:
        ref = g.execute(1.5)
        with pytest.raises(GetTimeoutError) as info:
            ref.get(timeout=0.3)
        assert isinstance(info.value, TimeoutError)
        assert "worker" in str(info.value) and "slow" in str(info.value)
        assert ref.get(timeout=10) == 1.5  # a timeout does not lose the result


def test_submit_timeout_when_full(ray_cluster):
    with G.slow_plan().start(submit_timeout=0.3) as g:
        refs = [g.execute(0.6) for _ in range(g.capacity)]
        with pytest.raises(SubmitTimeoutError):
            g.execute(0.0)
        assert [r.get(timeout=10) for r in refs] == [0.6] * len(refs)


def test_killed_actor_fails_pending_and_future_gets_fast(ray_cluster):
    g = G.slow_chain_plan().start(get_timeout=30)
    assert g.execute(0.0).get() == 1.0
    pending = g.execute(60.0)  # worker0 sleeps far longer than the get timeout
    time.sleep(0.2)
    ray.kill(g.actors["worker1"])
    # The death, not the timeout and not the slow method, ends the wait.
    with pytest.raises(ActorDiedError, match="worker1") as info:
        pending.get()
    assert info.value.actor == "worker1"
    with pytest.raises(ActorDiedError):
        g.execute(4)
    g.teardown()
    assert list_segments(g.prefix) == []


def test_killed_actor_leaves_external_survivors_reusable(ray_cluster):
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(G)
    try:
        cls = ray.remote(G.Worker.__wrapped__)
        a, b = cls.remote(1), cls.remote(2)
    finally:
        cloudpickle.unregister_pickle_by_value(G)
    try:
        plan = G.two_actor_plan((a, b))
        g = plan.start(get_timeout=30)
        assert g.execute(0.1).get() == 0.2  # b.combine(a.slow(x), x)
        assert not g.created
        pending = g.execute(60.0)  # a sleeps far longer than the get timeout
        time.sleep(0.2)
        ray.kill(a)
        with pytest.raises(ActorDiedError):  # the death ends the wait, not the timeout
            pending.get()
        g.teardown()
        # The survivor answers normal calls and has no loop thread left.
        assert ray.get(b.add.remote(1), timeout=10) == 3
        names = ray.get(b.__ray_call__.remote(
            lambda self: [t.name for t in threading.enumerate()]), timeout=10)
        assert not [n for n in names if n.startswith("cgc-")]
    finally:
        ray.kill(b)


def test_teardown_is_idempotent_and_leaves_nothing(ray_cluster):
    before = set(_cgc_threads())
    g = G.fanout_plan(2).start(get_timeout=30)
    pids = [ray.get(h.pid.remote(), timeout=10) for h in g.actors.values()]
    pending = g.execute(1)
    g2 = g.execute(2)
    assert g2.get() == (2 + 0) + (2 + 1)
    g.teardown()
    g.teardown()
    assert list_segments(g.prefix) == []
    assert set(_cgc_threads()) <= before
    # A result that was not read before teardown raises instead of hanging.
    try:
        pending.get(timeout=5)
    except GraphTornDownError:
        pass
    with pytest.raises(GraphTornDownError):
        g.execute(3)
    # The created actors are gone.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in pids):
        time.sleep(0.1)
    assert not any(os.path.exists(f"/proc/{p}/stat") and
                   open(f"/proc/{p}/stat").read().split()[2] not in "ZX" for p in pids)


def test_context_manager_tears_down_on_error(ray_cluster):
    with pytest.raises(RuntimeError, match="boom"):
        with G.echo_plan().start() as g:
            raise RuntimeError("boom")
    assert g.closing and list_segments(g.prefix) == []
