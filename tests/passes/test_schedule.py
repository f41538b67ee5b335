"""Pass ``schedule``: per-actor programs from one global order, and the timed makespan."""

from __future__ import annotations

import pytest
import shapes
from builders import GraphBuilder
from stages import programs_text, run_pass, state_before

from cgc.errors import CompileError
from cgc.passes import LowerOptions, lower
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.text import format_op
from cgc.plan_schema.verify.observers import timed_makespan


def _scheduled(plan: pb.Plan, options: LowerOptions | None = None):
    return run_pass(state_before(plan, "schedule", options), "schedule")


def test_chain_programs():
    state = _scheduled(shapes.chain())
    assert programs_text(state.plan) == (
        "a: 2R:c1 2C 2W:c2 4R:c3 4C 4W:c4\n"  # reads right before, writes right after
        "b: 3R:c2 3C 3W:c3"
    )
    assert state.lowered.schedule.makespan_us == 320  # 3 calls of 100 us, 2 transfers


def test_p2p_and_collective_ops_carry_their_communicator():
    state = _scheduled(shapes.two_communicators())
    assert programs_text(state.plan) == (
        "w0: 2R:c1 2C 2SEND:c2→w1@g0#0 4C 6COLL@g1#0 6W:c4\n"
        "w1: 3RECV:c2←w0@g0#0 3C 5COLL@g1#0 5W:c3"
    )


def test_makespan_is_the_simulators_timing():
    state = _scheduled(shapes.one_f_one_b(3, 5), LowerOptions(costs={"s1.bwd": 250}))
    task_us = {}
    for node in state.plan.graph.nodes:
        if node.kind == pb.CALL:
            task_us[node.id] = 250.0 if (node.actor, node.method) == ("s1", "bwd") else 100.0
    assert state.lowered.schedule.makespan_us == timed_makespan(state.plan, task_us, 10.0)


def test_contradictory_bind_orders_are_an_error_naming_the_tasks():
    b = GraphBuilder()
    b.actor("a")
    b.actor("b")
    f1 = b.call("a", "f1", b.input(0))
    h = b.call("b", "h", f1)
    f2 = b.call("a", "f2", h)
    b.output(f2)
    # a binds f2 before f1, but f2 needs h, which needs f1: no order of a's tasks exists
    b.g.nodes[f1].bind_index, b.g.nodes[f2].bind_index = 1, 0
    with pytest.raises(CompileError, match=r"cannot order the tasks(.|\n)*a: next task a\.f2"):
        lower(b.plan())


def test_1f1b_interleaves_forwards_and_backwards():
    plan = lower(shapes.one_f_one_b(2, 4))
    g = plan.graph
    for prog, want in zip(plan.lowered.programs, ["FFBFBFBB", "FBFBFBFB"], strict=True):
        got = "".join(
            g.nodes[op.task].method[0].upper() for op in prog.ops if op.kind == pb.COMPUTE
        )
        assert got == want
    s0 = [format_op(op) for op in plan.lowered.programs[0].ops]
    # stage 0 runs its second forward before it waits for the first gradient (Ray does not)
    first_recv = next(i for i, t in enumerate(s0) if "RECV" in t)
    second_fwd = [i for i, t in enumerate(s0) if t.endswith("C")][1]
    assert second_fwd < first_recv


def test_1f1b_makespan_beats_serialized():
    plan = lower(shapes.one_f_one_b(2, 4), LowerOptions(overlap=False))
    serial = 16 * 100 + 8 * 10
    assert plan.lowered.schedule.makespan_us < serial


def test_costs_are_overridable_and_recorded():
    plan = lower(shapes.chain(), LowerOptions(costs={"a.f": 1000, "transfer": 1}))
    costs = {c.key: c.micros for c in plan.lowered.schedule.costs}
    assert costs["a.f"] == 1000 and costs["transfer"] == 1
    assert plan.lowered.schedule.makespan_us == 1000 + 1 + 100 + 1 + 100
