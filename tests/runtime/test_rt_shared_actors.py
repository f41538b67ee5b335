"""Several plans on the same live actors: they run side by side and tear down independently.

The shape is a prefill/decode-style pair: two plans over the same two actors (a "prefill"
plan and a "decode" plan, each a two-stage chain), started from live handles.
"""

from __future__ import annotations

import logging
import os
import threading
import time

import pytest
import ray
import rt_graphs as G

import cgc
from cgc import InputNode


@pytest.fixture
def pair(ray_cluster):
    """Two live Worker actors (k=1, k=10) the plans bind; killed after the test."""
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(G)
    try:
        cls = ray.remote(G.Worker.__wrapped__)
        a, b = cls.remote(1), cls.remote(10)
    finally:
        cloudpickle.unregister_pickle_by_value(G)
    yield a, b
    for h in (a, b):
        ray.kill(h)


def _prefill_plan(a, b):
    with InputNode() as inp:
        dag = b.add.bind(a.add.bind(inp))  # x + 1 + 10
    return cgc.compile(dag, name="t_prefill")


def _decode_plan(a, b):
    with InputNode() as inp:
        dag = a.add.bind(b.add.bind(b.add.bind(inp)))  # x + 10 + 10 + 1
    return cgc.compile(dag, name="t_decode")


def _loop_threads(h) -> list[str]:
    names = ray.get(h.__ray_call__.remote(
        lambda self: [t.name for t in threading.enumerate()]), timeout=10)
    return sorted(n for n in names if n.startswith("cgc-loop-"))


@pytest.mark.parametrize("first_down", ["prefill", "decode"])
def test_teardown_of_one_plan_is_prompt_and_spares_the_other(pair, first_down, caplog):
    """Each plan's loop stops on its own signal: teardown never falls back to waiting out
    its timeout (that fallback logs "did not stop within"; it used to, for 10 s)."""
    a, b = pair
    caplog.set_level(logging.WARNING, logger="cgc.runtime")
    prefill = _prefill_plan(a, b).start(get_timeout=30)
    decode = _decode_plan(a, b).start(get_timeout=30)
    try:
        for i in range(20):  # interleaved executions of both plans on the same actors
            assert prefill.execute(i).get() == i + 11
            assert decode.execute(i).get() == i + 21
        assert len(_loop_threads(a)) == 2 and len(_loop_threads(b)) == 2
        down, up, want = ((prefill, decode, 21) if first_down == "prefill"
                          else (decode, prefill, 11))
        down.teardown()
        assert "did not stop" not in caplog.text
        # Only the torn-down plan's loop stopped; the other still answers, correctly.
        assert [r for r in (_loop_threads(a) + _loop_threads(b)) if down.gid in r] == []
        assert len(_loop_threads(a)) == 1 and len(_loop_threads(b)) == 1
        for i in range(20):
            assert up.execute(i).get() == i + want
        up.teardown()
        assert "did not stop" not in caplog.text
        assert _loop_threads(a) == [] and _loop_threads(b) == []
        # The actors stay usable for plain calls.
        assert ray.get(a.add.remote(1), timeout=10) == 2
    finally:
        prefill.teardown()
        decode.teardown()


def test_pipelined_plans_on_shared_actors_keep_their_own_order(pair):
    a, b = pair
    with _prefill_plan(a, b).start(get_timeout=30) as p, \
            _decode_plan(a, b).start(get_timeout=30) as d:
        refs = [(p.execute(i), d.execute(i)) for i in range(4)]
        assert [(rp.get(), rd.get()) for rp, rd in refs] == [(i + 11, i + 21) for i in range(4)]


def _wait_gone(pid: int) -> None:
    """Wait until the process ``pid`` is gone (ray.kill returns before it is)."""
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{pid}"), "the killed actor's process is still alive"


def test_a_dead_shared_actor_fails_both_plans(pair):
    from cgc.runtime import ActorDiedError

    a, b = pair
    p = _prefill_plan(a, b).start(get_timeout=30)
    d = _decode_plan(a, b).start(get_timeout=30)
    try:
        assert p.execute(1).get() == 12 and d.execute(1).get() == 22
        pid = ray.get(b.pid.remote(), timeout=10)
        ray.kill(b)
        _wait_gone(pid)
        for g in (p, d):  # the second plan's waiter is queued behind the first's: still seen
            with pytest.raises(ActorDiedError):  # the death itself, not a get timeout
                g.execute(2).get()
    finally:
        p.teardown()
        d.teardown()
