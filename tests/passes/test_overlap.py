"""Pass ``overlap``: comm ops on the comm stream, receives hoisted as far as is safe."""

from __future__ import annotations

import shapes
from builders import GraphBuilder
from stages import programs_text, run_pass, state_before

from cgc.passes import LowerOptions
from cgc.passes.overlap import hoist_recvs
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.text import parse_program
from cgc.plan_schema.verify import verify_plan


def _with_programs(plan: pb.Plan, text: str) -> pb.Plan:
    """The plan before pass overlap, with its programs replaced by ``text`` (one per line)."""
    state = state_before(plan, "overlap")
    for i, line in enumerate(text.splitlines()):
        state.lowered.programs[i].CopyFrom(parse_program(line))
    return state.plan


def _independent_send(return_f: bool = False) -> pb.Plan:
    """b computes f while a computes g; b.h needs g over NCCL (f is returned too if asked)."""
    b = GraphBuilder()
    b.actor("a", gpus=1)
    b.actor("b", gpus=1)
    x = b.input(0)
    f = b.call("b", "f", x)
    g = b.call("a", "g", x, hint=pb.NCCL)
    h = b.call("b", "h", g, f)
    b.output(h, f) if return_f else b.output(h)
    return b.plan()


def _dependent_send() -> pb.Plan:
    """a's SEND needs what b writes first: b's RECV cannot move above that WRITE."""
    b = GraphBuilder()
    b.actor("a", gpus=1)
    b.actor("b", gpus=1)
    f = b.call("b", "f", b.input(0))
    g = b.call("a", "g", f, hint=pb.NCCL)
    b.output(b.call("b", "h", g))
    return b.plan()


def test_a_recv_moves_above_ops_its_sender_does_not_wait_for():
    plan = _with_programs(
        _independent_send(),
        "a: 3R:c1 3C 3SEND:c2→b@g0#0\nb: 2R:c1 2C 4RECV:c2←a@g0#0 4C 4W:c3",
    )
    assert hoist_recvs(plan) == 1
    assert programs_text(plan) == (
        "a: 3R:c1 3C 3SEND:c2→b@g0#0\nb: 4RECV:c2←a@g0#0 2R:c1 2C 4C 4W:c3"
    )
    verify_plan(plan)


def test_a_recv_stays_below_the_write_its_sender_reads():
    text = "a: 3R:c2 3C 3SEND:c3→b@g0#0\nb: 2R:c1 2C 2W:c2 4RECV:c3←a@g0#0 4C 4W:c4"
    plan = _with_programs(_dependent_send(), text)
    assert hoist_recvs(plan) == 0
    assert programs_text(plan) == text


def test_without_past_writes_a_recv_never_passes_a_write():
    text = "a: 3R:c1 3C 3SEND:c3→b@g0#0\nb: 2R:c1 2C 2W:c2 4RECV:c3←a@g0#0 4C 4W:c4"
    plan = _with_programs(_independent_send(return_f=True), text)
    assert hoist_recvs(plan, past_writes=False) == 0
    assert programs_text(plan) == text
    assert hoist_recvs(plan) == 1  # the bold variant passes the write (nobody waits on it)
    assert programs_text(plan).splitlines()[1] == "b: 4RECV:c3←a@g0#0 2R:c1 2C 2W:c2 4C 4W:c4"


def test_1f1b_hoists_receives_and_keeps_every_comm_order():
    state = run_pass(state_before(shapes.one_f_one_b(), "overlap"), "overlap")
    assert state.lowered.schedule.overlap
    s1 = programs_text(state.plan).splitlines()[1]
    assert s1.startswith("s1: 7RECV:c5←s0@g0#0~ 9RECV:c6←s0@g0#1~ 7C 8C")
    assert all(
        op.stream == (pb.COMM_STREAM if op.kind in (pb.SEND, pb.RECV, pb.COLL) else 0)
        for p in state.lowered.programs
        for op in p.ops
    )


def test_off_when_asked_or_when_nothing_is_on_a_gpu():
    state = run_pass(state_before(shapes.chain(), "overlap"), "overlap")
    assert not state.lowered.schedule.overlap
    # a communicator with a member without a GPU: nothing to overlap a comm stream with
    b = GraphBuilder()
    b.actor("w0")
    b.actor("w1", gpus=1)
    r0, r1 = b.allreduce([b.call("w0", "f", b.input(0)), b.call("w1", "f", b.input(0))])
    b.output(r0, r1)
    assert not run_pass(state_before(b.plan(), "overlap"), "overlap").lowered.schedule.overlap
    assert run_pass(state_before(shapes.allreduce(), "overlap"), "overlap").lowered.schedule.overlap
    opts = LowerOptions(overlap=False)
    state = run_pass(state_before(shapes.two_way_nccl(), "overlap", opts), "overlap")
    assert not state.lowered.schedule.overlap
    assert all(op.stream == pb.COMPUTE_STREAM for p in state.lowered.programs for op in p.ops)
