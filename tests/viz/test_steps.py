"""The time grid under every plan: the rules of ``cgc.viz.steps`` hold, and nothing is lost.

Checked on the compiler's shapes, on random lowered plans, and as golden text for a 1F1B
pipeline (``schedule_ascii``); run with CGC_UPDATE_GOLDEN=1 to rewrite the golden file.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "passes"))

import shapes  # noqa: E402
from randgraphs import random_plans  # noqa: E402

from cgc.passes import lower  # noqa: E402
from cgc.plan_schema import plan_pb2 as pb  # noqa: E402
from cgc.viz import schedule_ascii, schedule_chart  # noqa: E402
from cgc.viz.lanes import band_layout  # noqa: E402
from cgc.viz.steps import StepGrid, step_plan  # noqa: E402


def check_rules(plan: pb.Plan, grid: StepGrid) -> None:
    """Every op placed once; rows in program order; rendezvous in one step; data first."""
    total = sum(len(p.prologue) + len(p.ops) for p in plan.lowered.programs)
    assert len(grid.ops) == total and all(o.step >= 0 for o in grid.ops)
    by_key = {o.key: o for o in grid.ops}
    assert len(by_key) == total
    for actor in grid.actors:
        mine = [o for o in grid.ops if o.actor == actor]
        for row in (False, True):
            steps = [o.step for o in mine if o.comm_row == row]
            assert steps == sorted(steps) and len(set(steps)) == len(steps), (actor, row)
        for i, o in enumerate(mine):
            if o.op.kind == pb.COMPUTE:  # after what it read and received
                for before in mine[:i]:
                    if before.op.task == o.op.task and before.op.kind in (pb.READ, pb.RECV):
                        assert before.step < o.step
            if o.op.kind in (pb.WRITE, pb.SEND) and not o.comm_row:
                produce = [b for b in mine[:i] if b.op.kind == pb.COMPUTE
                           and b.op.task == o.op.task]
                assert all(b.step < o.step for b in produce)
    for a, b, kind in grid.links:
        src, dst = by_key[a], by_key[b]
        if kind == "host":
            assert src.op.kind == pb.WRITE and dst.op.kind == pb.READ and src.step < dst.step
        else:
            assert src.step == dst.step, (kind, a, b)
    assert all(o.matched for o in grid.ops)


@pytest.mark.parametrize("name", sorted(shapes.ALL))
def test_rules_hold_for_every_shape(name):
    plan = lower(shapes.ALL[name]())
    check_rules(plan, step_plan(plan))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_plans(max_tasks=40))
def test_rules_hold_for_random_plans(plan):
    lowered = lower(plan)
    grid = step_plan(lowered)
    check_rules(lowered, grid)
    chart = schedule_chart(lowered)  # every op a cell, every cell in a row
    assert len(chart.cells) == len(grid.ops)
    assert {c.row for c in chart.cells} <= {r.key for r in chart.rows}


def test_sends_meet_their_receives_and_hoisted_receives_are_marked():
    plan = lower(shapes.one_f_one_b(2, 4))
    grid = step_plan(plan)
    nccl = [(a, b) for a, b, k in grid.links if k == "nccl"]
    assert len(nccl) == 8  # 4 activations forward, 4 gradients back
    hoisted = sorted(o.key for o in grid.ops if o.hoisted)
    # s1 posts the receive of microbatch m+1 before computing microbatch m, ...
    assert [k for k in hoisted if k.startswith("s1.")] == ["s1.1", "s1.5", "s1.9"]
    assert all(by.op.kind == pb.RECV and by.comm_row
               for by in grid.ops if by.hoisted)


def test_a_plan_that_deadlocks_still_gets_a_grid():
    plan = lower(shapes.two_way_nccl())
    a, b = plan.lowered.programs
    # b receives before it sends, a too: each waits for the other (cgc check rejects it)
    sends = [i for i, op in enumerate(a.ops) if op.kind == pb.SEND]
    recvs = [i for i, op in enumerate(a.ops) if op.kind == pb.RECV]
    ops = list(a.ops)
    ops[sends[0]], ops[recvs[0]] = ops[recvs[0]], ops[sends[0]]
    del a.ops[:]
    a.ops.extend(ops)
    grid = step_plan(plan)
    assert all(o.step >= 0 for o in grid.ops)
    assert any(not o.matched for o in grid.ops)
    assert any(c.detail == "unmatched!" for c in schedule_chart(plan).cells)


def test_prefetched_ops_wait_for_nobody_and_say_so():
    plan = lower(shapes.two_way_nccl())
    b = plan.lowered.programs[1]
    first = b.ops[0]
    assert first.kind == pb.RECV
    pre = pb.Op()
    pre.CopyFrom(first)
    b.prologue.append(pre)  # receive execution 0's value before the loop,
    first.exec_offset = 1  # and in the loop, the next execution's
    grid = step_plan(plan)
    pro = next(o for o in grid.ops if o.actor == "b" and o.prologue)
    loop = next(o for o in grid.ops if o.actor == "b" and not o.prologue and o.index == 0)
    assert pro.matched and loop.execution == 1
    send = next(o for o in grid.ops if o.actor == "a" and o.op.kind == pb.SEND)
    assert pro.step == send.step
    cells = {c.key: c for c in schedule_chart(plan).cells}
    assert cells[loop.key].detail.endswith("i+1") and cells[pro.key].detail.startswith("prologue")


def test_bands_fit_the_width_and_balance():
    assert band_layout(5) == (5, 1)
    per, bands = band_layout(54)
    assert per * bands >= 54 and bands == 3
    per, bands = band_layout(100)
    assert per * bands >= 100 and per <= 18


def test_schedule_ascii_golden():
    text = schedule_ascii(lower(shapes.one_f_one_b(2, 4)), width=100)
    path = HERE / "golden" / "1f1b_2x4.schedule.txt"
    if os.environ.get("CGC_UPDATE_GOLDEN"):  # a missing golden fails: regenerate on purpose
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8")
    assert all(len(line) <= 100 for line in text.splitlines())
