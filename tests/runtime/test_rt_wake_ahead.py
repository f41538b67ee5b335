"""Wake-ahead: doorbells wake waiting readers before their data arrives; values, idle cost."""

from __future__ import annotations

import os
import threading
import time

import pytest
import ray
import rt_graphs as G
from idle_cpu import is_quiet, quiet_window

from cgc.runtime.channels import ShmRingReader, ShmRingWriter, list_segments
from cgc.runtime.channels.bell import Bells
from cgc.runtime.channels.futex import HAVE_WAITV
from cgc.runtime.driver.wake import wake_window

needs_waitv = pytest.mark.skipif(not HAVE_WAITV, reason="futex_waitv needs Linux >= 5.16")


def _depths(plan) -> dict[str, int]:
    return {p.actor: p.wake_depth for p in plan.proto.lowered.programs}


def test_depths_and_window():
    assert _depths(G.chain_plan(3)) == {"worker0": 1, "worker1": 2, "worker2": 3}
    fan = _depths(G.fanout_plan(3))
    assert sorted(fan.values()) == [1, 1, 1, 2]
    assert wake_window(-1, cores=2) == 0 and wake_window(-1, cores=16) == 8
    assert wake_window(3, cores=2) == 3 and wake_window(0, cores=64) == 0


@needs_waitv
def test_a_rung_reader_keeps_waiting_for_its_value(tmp_path):
    name = f"cgc-test-bell-{os.getpid()}-"
    bells = Bells.create(name + "bell", depths=2)
    w = ShmRingWriter.create(name + "c", slots=2, slot_bytes=4096)
    r = ShmRingReader.attach(name + "c", 0)
    r.set_bell(bells, 2)
    got = []
    t = threading.Thread(target=lambda: got.append(r.read(timeout=10)))
    t.start()
    time.sleep(0.1)
    for _ in range(3):  # rung without data: wakes, spins, sleeps again; no value invented
        bells.ring(2)
        time.sleep(0.01)
    assert got == [] and t.is_alive()
    w.write("value")
    t.join(timeout=10)
    assert got == ["value"]
    r.detach()
    w.close()
    bells.close()
    assert list_segments(name) == []


@needs_waitv
def test_chain_with_wake_ahead_runs_right_and_idles_cheaply(ray_cluster):
    with G.chain_plan(4).start(get_timeout=30, wake_ahead=2) as g:
        assert g.bells is not None and g.bell_ahead == [2, 3]
        for i in range(200):
            assert g.execute(i).get() == i + 1 + 2 + 3 + 4
        refs = [g.execute(i) for i in range(4)]  # pipelined
        assert [r.get() for r in refs] == [i + 10 for i in range(4)]
        pids = [ray.get(h.pid.remote(), timeout=10) for h in g.actors.values()]
        time.sleep(0.3)  # the last wake-ups of the run settle
        windows = quiet_window(pids)  # rung bells must not leave readers spinning
        prefix = g.prefix
    assert is_quiet(windows[-1]), f"CPU seconds per actor, per 1 s window: {windows}"
    assert list_segments(prefix) == []


def test_wake_ahead_off_makes_no_bells(ray_cluster):
    with G.chain_plan(3).start(get_timeout=30, wake_ahead=0) as g:
        assert g.bells is None
        assert g.execute(1).get() == 7
