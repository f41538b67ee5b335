"""Fault suite, actor side: SIGKILL at every position, a method that never returns, app
exceptions at every op position, inside a multi-return method and inside a collective.
Every case checks its bound (generous deadlines, never wall-clock claims) and that nothing
is left behind."""

from __future__ import annotations

import os
import signal

import fault_graphs as F
import pytest
import ray

from cgc.runtime import ActorDiedError, GetTimeoutError, GraphFailedError


def _pids(g) -> list[int]:
    return [ray.get(h.pid.remote(), timeout=30) for h in g.actors.values()]


@pytest.mark.parametrize("position", [0, 1, 2])
def test_sigkill_at_every_position_of_a_chain(ray_cluster, leaves_nothing, position):
    g = F.chain(3, name=f"f_kill{position}").start(get_timeout=30)
    try:
        assert g.execute(1).get() == 7
        pids = _pids(g)
        pending = g.execute(60.0)  # stage 0 sleeps far past the get timeout
        os.kill(pids[position], signal.SIGKILL)
        # The death ends the wait (not the slow method, not the get timeout).
        with pytest.raises(ActorDiedError, match=f"stage{position}|stage"):
            pending.get()
        with pytest.raises(GraphFailedError):
            g.execute(2)
    finally:
        g.teardown()
    leaves_nothing(g, pids)


def test_method_that_never_returns_times_out_with_a_hang_report(ray_cluster, leaves_nothing):
    g = F.hang().start()
    try:
        pids = _pids(g)
        ref = g.execute(1)
        with pytest.raises(GetTimeoutError) as info:
            ref.get(timeout=1.0)
        report = str(info.value)
        assert "stage.forever#0" in report and "the method forever to return" in report
        [row] = info.value.blocked
        assert (row["actor"], row["execution"], row["op"]) == ("stage", 0, "1")
    finally:
        g.teardown()
    leaves_nothing(g, pids)


@pytest.mark.parametrize("fail_at", [0, 1, 2])
def test_app_exception_at_every_position_keeps_the_graph_going(ray_cluster, leaves_nothing,
                                                               fail_at):
    # Execution 1's input -1 reaches stage i as -1 + (1 + ... + i).
    fail_on = -1 + fail_at * (fail_at + 1) // 2
    plan = F.chain(3, fail_at=fail_at, fail_on=fail_on, name=f"f_app{fail_at}")
    with plan.start(get_timeout=30) as g:
        refs = [g.execute(1), g.execute(-1), g.execute(2)]
        assert refs[0].get() == 7
        with pytest.raises(F.Boom, match=f"k={fail_at + 1}") as info:
            refs[1].get()
        assert info.value.actor == f"stage{fail_at}" and info.value.exec_index == 1
        assert refs[2].get() == 8
        pids = _pids(g)
    leaves_nothing(g, pids)


def test_app_exception_inside_a_multi_return_method(ray_cluster, leaves_nothing):
    with F.multi_return().start(get_timeout=30) as g:
        for ref in g.execute(-5):
            with pytest.raises(F.Boom, match="pair fails on -5"):
                ref.get()
        assert [r.get() for r in g.execute(3)] == [13, -3]
        pids = _pids(g)
    leaves_nothing(g, pids)


def test_app_exception_inside_a_collective_member(ray_cluster, leaves_nothing):
    with F.collective().start(get_timeout=30) as g:
        for ref in g.execute(-1):
            with pytest.raises(F.Boom, match="member 1"):
                ref.get()
        # sum over members of x*k, per element: 1*1 + 1*2 = 3; four elements.
        assert [r.get() for r in g.execute(1)] == [12.0, 12.0]
        pids = _pids(g)
    leaves_nothing(g, pids)
