"""Pass ``wake``: each actor's wake-ahead depth (hops from the driver along host channels)."""

from __future__ import annotations

import pytest
import shapes
from builders import GraphBuilder
from stages import channels_text, run_pass, state_before

from cgc.passes import PassInvariantError, lower, wake
from cgc.plan_schema import plan_pb2 as pb


def _depths_text(plan: pb.Plan) -> str:
    return " ".join(f"{p.actor}={p.wake_depth}" for p in plan.lowered.programs)


def test_chain_keeps_the_first_depth_of_an_actor_reached_twice():
    state = run_pass(state_before(shapes.chain(), "wake"), "wake")
    assert channels_text(state.plan).splitlines()[:3] == [
        "c1 host %1 @driver -> a slots=4 bytes=1048576 (default: host memory)",
        "c2 host %2 a -> b slots=2 bytes=1048576 (default: host memory)",
        "c3 host %3 b -> @driver,a slots=4 bytes=1048576 (default: host memory)",
    ]
    assert _depths_text(state.plan) == "a=1 b=2"  # a also reads c3 from b: stays at 1


def test_a_long_chain_counts_every_hop():
    b = GraphBuilder()
    x = b.input(0)
    for name in ("w0", "w1", "w2", "w3"):
        b.actor(name)
        x = b.call(name, "f", x)
    b.output(x)
    state = run_pass(state_before(b.plan("long"), "wake"), "wake")
    assert _depths_text(state.plan) == "w0=1 w1=2 w2=3 w3=4"


@pytest.mark.parametrize(("name", "want"), [
    ("whole_input", "a=1 b=1"),            # both read the driver's input channels
    ("two_way_nccl", "a=1 b=0"),           # b is reached over NCCL only: no doorbell
    ("1f1b_2x4", "s0=1 s1=0"),
    ("allreduce", "w0=1 w1=1"),
])
def test_only_host_channels_count(name, want):
    state = run_pass(state_before(shapes.ALL[name](), "wake"), "wake")
    assert _depths_text(state.plan) == want


def test_the_dump_shows_the_depths_and_lowering_is_deterministic():
    a, b = lower(shapes.chain()), lower(shapes.chain())
    assert a.SerializeToString(deterministic=True) == b.SerializeToString(deterministic=True)
    from cgc.plan_schema.text import format_plan_text

    assert "wake depths: a=1 b=2\n" in format_plan_text(a)


def test_postcondition_catches_a_skipped_hop():
    state = run_pass(state_before(shapes.chain(), "wake"), "wake")
    state.lowered.programs[1].wake_depth = 3  # b reads from a (depth 1): at most 2
    with pytest.raises(PassInvariantError, match="wake"):
        wake.post(state)


def test_precondition_refuses_depths_set_twice():
    state = run_pass(state_before(shapes.chain(), "wake"), "wake")
    with pytest.raises(PassInvariantError, match="already"):
        wake.pre(state)
