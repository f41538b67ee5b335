"""Pass ``capacity``: ring depths from the pipeline depth, and the plan's one capacity."""

from __future__ import annotations

import shapes
from stages import run_pass, state_before

from cgc.passes import LowerOptions
from cgc.passes.capacity import MAX_CAPACITY
from cgc.plan_schema import plan_pb2 as pb


def _slots(plan: pb.Plan, options: LowerOptions | None = None) -> tuple[int, list[int]]:
    state = run_pass(state_before(plan, "capacity", options), "capacity")
    return state.plan.config.capacity, [ch.slots for ch in state.lowered.channels]


def test_chain_depth_three_holds_four_executions():
    # a.f (stage 0) -> b.g (1) -> a.h (2): 3 stages + the one being submitted
    cap, slots = _slots(shapes.chain())
    assert cap == 4
    assert slots == [4, 2, 4, 4]  # driver channels hold the capacity; a -> b double-buffers


def test_nccl_channels_are_rendezvous():
    cap, slots = _slots(shapes.two_communicators())
    assert cap == 3 and slots == [3, 1, 3, 3]


def test_one_stage_still_double_buffers():
    cap, slots = _slots(shapes.whole_input())
    assert cap == 2 and slots == [2, 2, 2, 2]


def test_forced_capacity_sizes_the_driver_channels():
    cap, slots = _slots(shapes.chain(), LowerOptions(capacity=MAX_CAPACITY * 4))
    assert cap == 32 and slots == [32, 2, 32, 32]


def test_forced_slots_bound_the_capacity():
    cap, slots = _slots(shapes.chain(), LowerOptions(slots=3, capacity=6))
    assert cap == 3 and slots == [3, 3, 3, 3]
