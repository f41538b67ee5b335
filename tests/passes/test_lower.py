"""lower() on hand-built graphs: transports, channels, programs, schedule shapes, errors."""

from __future__ import annotations

import pytest
import shapes
from builders import GraphBuilder

from cgc.errors import CompileError
from cgc.passes import PIPELINE, LowerOptions, lower
from cgc.plan_schema import DRIVER
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.text import format_op
from cgc.verify import verify_plan


@pytest.mark.parametrize("name", sorted(shapes.ALL))
def test_shapes_compile_to_verified_plans(name):
    plan = lower(shapes.ALL[name]())
    assert plan.lowered.schedule.verified_executions > plan.config.capacity
    verify_plan(plan, plan.config.capacity * 3)


def test_pipeline_is_an_explicit_ordered_list():
    assert [p.name for p in PIPELINE] == [
        "transports",
        "channels",
        "communicators",
        "schedule",
        "capacity",
        "config",
        "overlap",
        "verify",
    ]


def test_chain_channels_and_driver_ends():
    plan = lower(shapes.chain())
    low = plan.lowered
    assert [c.id for c in low.channels] == [1, 2, 3, 4]
    assert low.channels[0].writer == DRIVER and list(low.input_channels) == [1]
    assert list(low.channels[2].readers) == [DRIVER, "a"]  # one write serves both
    assert list(low.output_channels) == [4, 3]
    local = [e for e in low.edges if e.transport == pb.LOCAL]
    assert len(local) == 1 and local[0].channel == 0 and local[0].reason == "same actor"
    assert plan.config.get_timeout_s == 60 and plan.config.default_slot_bytes == 1 << 20


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


def test_two_writer_and_two_way_nccl():
    for f in (shapes.two_writer_nccl, shapes.two_way_nccl):
        plan = lower(f())
        assert any(c.kind == pb.CHAN_NCCL for c in plan.lowered.channels)
        assert plan.lowered.communicators[0].backend == "nccl"


def test_costs_are_overridable_and_recorded():
    plan = lower(shapes.chain(), LowerOptions(costs={"a.f": 1000, "transfer": 1}))
    costs = {c.key: c.micros for c in plan.lowered.schedule.costs}
    assert costs["a.f"] == 1000 and costs["transfer"] == 1
    assert plan.lowered.schedule.makespan_us == 1000 + 1 + 100 + 1 + 100


def test_overlap_can_be_forced_off():
    plan = lower(shapes.two_way_nccl(), LowerOptions(overlap=False))
    assert not plan.lowered.schedule.overlap
    assert all(op.stream == pb.COMPUTE_STREAM for p in plan.lowered.programs for op in p.ops)


def test_slots_override_sets_capacity():
    plan = lower(shapes.chain(), LowerOptions(slots=1))
    assert plan.config.capacity == 1
    assert all(c.slots == 1 for c in plan.lowered.channels)


def _hinted(hint, gpus=(1, 1), to_output=False, device=0):
    b = GraphBuilder()
    b.actor("a", gpus=gpus[0])
    b.actor("b", gpus=gpus[1])
    x = b.input(0)
    y = b.call("a", "f", x, hint=hint, device=device)
    if to_output:
        b.output(y)
    else:
        b.output(b.call("b", "g", y))
    return b.plan()


def test_nccl_to_driver_is_an_error_naming_the_node():
    with pytest.raises(CompileError, match=r"a\.f#0 \(A\.f, model\.py:12\).*driver") as ei:
        lower(_hinted(pb.NCCL, to_output=True))
    assert ei.value.exit_code == 3


def test_nccl_on_cpu_actor_is_an_error():
    with pytest.raises(CompileError, match="'b' has no GPU"):
        lower(_hinted(pb.NCCL, gpus=(1, 0)))


def test_auto_hint_picks_nccl_between_gpu_actors_only():
    assert lower(_hinted(pb.AUTO)).lowered.channels[1].kind == pb.CHAN_NCCL
    ch = lower(_hinted(pb.AUTO, gpus=(1, 0))).lowered.channels[1]
    assert ch.kind == pb.CHAN_HOST and "not both GPU" in ch.reason
    ch = lower(_hinted(pb.AUTO, device=pb.CPU)).lowered.channels[1]
    assert ch.kind == pb.CHAN_HOST and ch.device == pb.CPU


def test_same_actor_nccl_hint_becomes_local():
    b = GraphBuilder()
    b.actor("a", gpus=1)
    y = b.call("a", "f", b.input(0), hint=pb.NCCL)
    b.output(b.call("a", "g", y))
    plan = lower(b.plan())
    edge = next(e for e in plan.lowered.edges if e.source.node == y)
    assert edge.transport == pb.LOCAL and "nccl hint not needed" in edge.reason


def test_lower_is_deterministic():
    a = lower(shapes.one_f_one_b(3, 5)).SerializeToString(deterministic=True)
    b = lower(shapes.one_f_one_b(3, 5)).SerializeToString(deterministic=True)
    assert a == b
