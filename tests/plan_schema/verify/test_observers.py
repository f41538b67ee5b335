"""The simulator's observers: happens-before clocks and timing of one execution."""

from __future__ import annotations

import shapes

from cgc.passes import LowerOptions, lower
from cgc.plan_schema import DRIVER
from cgc.plan_schema.verify.observers import HappensBefore, timed_makespan, vector_clocks
from cgc.plan_schema.verify.simulate import Moved, simulate


def test_clocks_follow_program_order_data_and_rendezvous():
    plan = lower(shapes.two_way_nccl(), LowerOptions(overlap=False))
    # a: 2R:c1 2C 2SEND:c2→b 4RECV:c3←b 4C 4SEND:c4→b
    # b: 3RECV:c2←a 3C 3SEND:c3→a 5RECV:c4←a 5C 5W:c5
    vc = vector_clocks(plan)
    assert vc[("a", 1)] == {"a": 1, DRIVER: 0}  # a's compute after the driver's write
    assert vc[("b", 0)] == vc[("a", 2)] == {"a": 2, "b": 0, DRIVER: 0}  # one rendezvous
    assert vc[("a", 3)]["b"] == 2  # a's RECV completes with b's SEND
    assert vc[("b", 5)] == {"a": 5, "b": 5, DRIVER: 0}


def test_every_step_names_its_processes():
    plan = lower(shapes.allreduce(), LowerOptions(overlap=False))
    steps: list[tuple[Moved, ...]] = []

    class Record:
        def step(self, moved):
            steps.append(moved)

    simulate(plan, 1, 1, Record())
    coll = [s for s in steps if s[0].op.kind == 6]
    assert [[m.proc for m in s] for s in coll] == [["w0", "w1"]]  # rank order
    assert sum(len(s) for s in steps) == sum(len(p.ops) for p in plan.lowered.programs) + 3


def test_timing_adds_costs_along_the_critical_path():
    plan = lower(shapes.chain())  # a.f -> b.g -> a.h, 2 host transfers
    f, g, h = 2, 3, 4
    assert timed_makespan(plan, {f: 1000, g: 100, h: 100}, 1.0) == 1202
    assert timed_makespan(plan, {f: 1, g: 1, h: 1}, 0.0) == 3


def test_clocks_do_not_depend_on_stepping_order():
    plan = lower(shapes.one_f_one_b(3, 4), LowerOptions(overlap=False))
    hb = HappensBefore()
    simulate(plan, 1, 1, hb)
    reversed_plan = type(plan)()
    reversed_plan.CopyFrom(plan)
    reversed_plan.lowered.programs.reverse()  # the simulator steps processes in this order
    hb2 = HappensBefore()
    simulate(reversed_plan, 1, 1, hb2)
    assert hb.clocks == hb2.clocks
