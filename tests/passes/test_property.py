"""Property tests: every plan lower() emits passes the simulator; swapped comm ops are
either proven safe or rejected."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from randgraphs import random_plans

from cgc.passes import LowerOptions, lower
from cgc.plan_schema import plan_pb2 as pb
from cgc.verify import VerifyError, verify_plan

_S = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_S
@given(random_plans(), st.sampled_from([None, False]))
def test_every_lowered_plan_verifies(plan, overlap):
    out = lower(plan, LowerOptions(overlap=overlap))
    assert out.lowered.schedule.verified_executions > out.config.capacity
    verify_plan(out, out.config.capacity * 2 + 1)
    tasks = {n.id for n in out.graph.nodes if n.kind in (pb.CALL, pb.COLLECTIVE)}
    computed = [
        op.task for p in out.lowered.programs for op in p.ops if op.kind in (pb.COMPUTE, pb.COLL)
    ]
    assert sorted(computed) == sorted(tasks)


@_S
@given(random_plans(max_tasks=30), st.data())
def test_swapped_comm_ops_are_safe_or_rejected(plan, data):
    out = lower(plan, LowerOptions(overlap=False))
    progs = [
        p
        for p in out.lowered.programs
        if sum(op.kind in (pb.SEND, pb.RECV, pb.COLL) for op in p.ops) >= 2
    ]
    if not progs:
        return
    prog = data.draw(st.sampled_from(progs))
    comm = [i for i, op in enumerate(prog.ops) if op.kind in (pb.SEND, pb.RECV, pb.COLL)]
    i, j = data.draw(st.lists(st.sampled_from(comm), min_size=2, max_size=2, unique=True))
    ops = list(prog.ops)
    ops[i], ops[j] = ops[j], ops[i]
    del prog.ops[:]
    prog.ops.extend(ops)
    try:
        verify_plan(out)
    except VerifyError as exc:
        assert str(exc)  # rejected, with a message
