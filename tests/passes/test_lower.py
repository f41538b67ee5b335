"""lower() end to end on hand-built graphs: shapes, schedules, options, errors.

Each pass has its own tests in ``test_<pass>.py``; these check what comes out of the whole
pipeline.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import shapes

from cgc.errors import CompileError
from cgc.passes import PIPELINE, LowerOptions, PassInvariantError, lower
from cgc.plan_schema import DRIVER
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.defaults import DEFAULTS, LIMITS
from cgc.plan_schema.errors import ConfigError
from cgc.plan_schema.verify import verify_plan
from cgc.plan_schema.verify.simulate import simulate


@pytest.mark.parametrize("name", sorted(shapes.ALL))
def test_shapes_compile_to_verified_plans(name):
    plan = lower(shapes.ALL[name]())
    assert plan.lowered.schedule.verified_executions == 2
    assert verify_plan(plan).all_executions
    # what two executions decide holds for many more, with the driver at capacity
    simulate(plan, plan.config.capacity * 3, plan.config.capacity)


def test_every_pass_has_its_own_test_file():
    here = Path(__file__).parent
    missing = [p.name for p in PIPELINE if not (here / f"test_{p.name}.py").is_file()]
    assert not missing, f"passes without a test file: {missing}"
    assert len({p.name for p in PIPELINE}) == len(PIPELINE)


def test_a_broken_postcondition_names_the_pass():
    from dataclasses import replace

    i = next(k for k, p in enumerate(PIPELINE) if p.name == "extract")
    real = PIPELINE[i]
    PIPELINE[i] = replace(real, run=lambda state: None)  # a pass that forgets its job
    try:
        with pytest.raises(PassInvariantError, match="internal error in pass extract"):
            lower(shapes.whole_input())
    finally:
        PIPELINE[i] = real


def test_chain_channels_and_driver_ends():
    plan = lower(shapes.chain())
    low = plan.lowered
    assert [c.id for c in low.channels] == [1, 2, 3, 4]
    assert low.channels[0].writer == DRIVER and list(low.input_channels) == [1]
    assert list(low.channels[2].readers) == [DRIVER, "a"]  # one write serves both
    assert list(low.output_channels) == [4, 3]
    local = [e for e in low.edges if e.transport == pb.LOCAL]
    assert len(local) == 1 and local[0].channel == 0 and local[0].reason == "same actor"
    assert plan.config.get_timeout_s == DEFAULTS["get_timeout_s"]
    assert plan.config.default_slot_bytes == DEFAULTS["default_slot_bytes"]


def test_two_writer_and_two_way_nccl():
    for f in (shapes.two_writer_nccl, shapes.two_way_nccl):
        plan = lower(f())
        nccl = [c for c in plan.lowered.channels if c.kind == pb.CHAN_NCCL]
        ends = {e for c in nccl for e in (c.writer, *c.readers)}
        assert nccl and set(plan.lowered.communicators[0].members) == ends


def test_overlap_can_be_forced_off():
    plan = lower(shapes.two_way_nccl(), LowerOptions(overlap=False))
    assert not plan.lowered.schedule.overlap
    assert all(op.stream == pb.COMPUTE_STREAM for p in plan.lowered.programs for op in p.ops)


def test_slots_override_sets_capacity():
    plan = lower(shapes.chain(), LowerOptions(slots=1))
    assert plan.config.capacity == 1
    assert all(c.slots == 1 for c in plan.lowered.channels)


def test_capacity_and_at_capacity_options_reach_the_plan():
    plan = lower(shapes.chain(), LowerOptions(capacity=16, at_capacity="raise"))
    assert plan.config.capacity == 16 and plan.config.at_capacity == pb.AT_CAPACITY_RAISE
    low = plan.lowered
    for cid in [*low.input_channels, *low.output_channels]:
        assert low.channels[cid - 1].slots >= 16
    assert lower(shapes.chain()).config.at_capacity == pb.AT_CAPACITY_WAIT


@pytest.mark.parametrize("cap", [0, LIMITS.capacity + 1])
def test_capacity_outside_its_limit_is_a_compile_error(cap):
    with pytest.raises(CompileError, match=rf"capacity={cap} is outside 1\.\.{LIMITS.capacity}"):
        lower(shapes.chain(), LowerOptions(capacity=cap))


def test_unknown_at_capacity_is_a_config_error():
    with pytest.raises(ConfigError, match="at_capacity must be 'wait' or 'raise'"):
        lower(shapes.chain(), LowerOptions(at_capacity="drop"))


def test_rings_beyond_the_memory_limit_are_a_compile_error():
    from dataclasses import replace

    tight = replace(LIMITS, ring_bytes=4 << 20)
    with pytest.raises(CompileError, match="rings would reserve .* Limits.ring_bytes"):
        lower(shapes.chain(), LowerOptions(limits=tight))


def test_lower_is_deterministic():
    a = lower(shapes.one_f_one_b(3, 5)).SerializeToString(deterministic=True)
    b = lower(shapes.one_f_one_b(3, 5)).SerializeToString(deterministic=True)
    assert a == b
