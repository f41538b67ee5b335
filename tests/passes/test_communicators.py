"""Pass ``communicators``: groups, ranks, and the collective -> communicator map."""

from __future__ import annotations

import pytest
import shapes
from builders import GraphBuilder
from stages import run_pass, state_before

from cgc.errors import CompileError
from cgc.plan_schema import plan_pb2 as pb


def _comms(plan: pb.Plan):
    state = run_pass(state_before(plan, "communicators"), "communicators")
    low = state.lowered
    text = [f"comm {c.id}: {' '.join(c.members)}" for c in low.communicators]
    return "\n".join(text), state


def test_p2p_members_in_actor_order_and_shared_by_every_nccl_channel():
    text, state = _comms(shapes.two_writer_nccl())
    assert text == "comm 0: a b c"
    assert {ch.communicator for ch in state.lowered.channels if ch.kind == pb.CHAN_NCCL} == {0}


def test_a_collective_ranked_differently_gets_its_own_communicator():
    text, state = _comms(shapes.two_communicators())
    assert text == "comm 0: w0 w1\ncomm 1: w1 w0"
    assert state.coll_comm == {0: 1}


def test_a_collective_with_the_p2p_ranks_shares_it():
    text, state = _comms(shapes.allreduce())
    assert text == "comm 0: w0 w1" and state.coll_comm == {0: 0}


def test_cpu_members_get_a_communicator_like_gpu_ones():
    # The plan names no transport: the runtime binds one from where the members land.
    b = GraphBuilder()
    b.actor("w0")
    b.actor("w1", gpus=1)
    r0, r1 = b.allreduce([b.call("w0", "f", b.input(0)), b.call("w1", "f", b.input(0))])
    b.output(r0, r1)
    text, state = _comms(b.plan())
    assert text == "comm 0: w0 w1" and state.coll_comm == {0: 0}


def test_collective_members_on_one_actor_are_an_error():
    b = GraphBuilder()
    b.actor("w0", gpus=1)
    x = b.call("w0", "f", b.input(0))
    r = b.allreduce([x, x], actors=["w0", "w0"])
    b.output(*r)
    with pytest.raises(CompileError, match="two members of one collective are on the same"):
        _comms(b.plan())
