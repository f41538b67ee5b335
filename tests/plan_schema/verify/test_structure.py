"""The structure check: everything the runtime takes for granted, and the plan's bounds.

The runtime runs ``verify_plan`` at start, so each case here is a plan that must be
refused with a typed error naming what is wrong, never run (or crash with an IndexError).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import shapes

from cgc.passes import lower
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.defaults import LIMITS, MIN_SLOT_BYTES
from cgc.plan_schema.verify import PlanLimitError, PlanStructureError, check_structure, verify_plan


def _plan(name: str = "two_communicators") -> pb.Plan:
    return lower(shapes.ALL[name]())


def _set(path: str, value):
    """A mutation that sets ``plan.<path>`` (dots and [i] indexes) to ``value``."""

    def mutate(plan: pb.Plan) -> None:
        obj = plan
        parts = path.replace("[", ".").replace("]", "").split(".")
        for p in parts[:-1]:
            obj = obj[int(p)] if p.isdigit() else getattr(obj, p)
        setattr(obj, parts[-1], value)

    return mutate


# (mutation, what the message must say). Plan two_communicators:
#   nodes 0 input, 1 input[0], 2 w0.f, 3 w1.g, 4 w0.h, 5/6 allreduce members, 7 output
#   c1 host @driver -> w0, c2 nccl w0 -> w1, c3 host w1 -> @driver, c4 host w0 -> @driver
#   w0: 2R:c1 2C 2SEND:c2→w1@g0#0 4C 6COLL@g1#0 6W:c4
#   w1: 3RECV:c2←w0@g0#0 3C 5COLL@g1#0 5W:c3
CASES = {
    # what runtime/driver/plan.py check_runnable checked
    "no actors": (lambda p: p.graph.ClearField("actors"), "no actors"),
    "no programs": (lambda p: p.lowered.ClearField("programs"), "one program per actor"),
    "program order": (lambda p: p.lowered.programs.reverse(), "one program per actor"),
    "channel ids": (_set("lowered.channels[1].id", 7), "channel ids must be 1, 2"),
    "unknown endpoint": (_set("lowered.channels[0].writer", "zed"), "unknown writer or reader"),
    "no readers": (lambda p: p.lowered.channels[2].ClearField("readers"), "unknown writer or"),
    "source node": (_set("lowered.channels[1].source.node", 99), "source node 99 does not"),
    "nccl communicator": (_set("lowered.channels[1].communicator", 5), "communicator 5 does not"),
    "driver channel": (lambda p: p.lowered.input_channels.append(99), "c99"),
    "op task": (_set("lowered.programs[0].ops[1].task", 999), "serves node 999"),
    "op channel": (_set("lowered.programs[0].ops[0].channel", 99), "channel c99"),
    # malformed but checksummed (issue 9)
    "arg ref": (_set("graph.nodes[3].args[0].ref.node", 999), "takes node 999, which does"),
    "arg output": (_set("graph.nodes[3].args[0].ref.output_index", 4), "takes output 4"),
    "forward ref": (_set("graph.nodes[2].args[0].ref.node", 4), "comes after it"),
    "node kind": (_set("graph.nodes[3].kind", 42), r"node %3 \(w1\.g#0\) kind has the unknown"),
    "op kind": (_set("lowered.programs[0].ops[1].kind", 12), "op of actor w0 has the unknown"),
    "op stream": (_set("lowered.programs[0].ops[1].stream", 3), "stream has the unknown"),
    "channel kind": (_set("lowered.channels[0].kind", 1), "channel c1 kind"),
    "device": (_set("lowered.channels[0].device", 9), "channel c1 device"),
    "at_capacity": (_set("config.at_capacity", 4), "ExecConfig.at_capacity"),
    "collective kind": (_set("graph.collectives[0].kind", 0), "collective 0 kind"),
    "reduce op": (_set("graph.collectives[0].reduce_op", 17), "collective 0 reduce_op"),
    "member ref": (lambda p: p.graph.collectives[0].nodes.append(50), "names node 50"),
    "member collective": (_set("graph.nodes[5].collective", 3), "collective 3, which does"),
    "input key": (_set("graph.nodes[1].key_kind", 0), "key_kind has the unknown"),
    "input index": (_set("graph.nodes[1].index", 4), "positional argument 4 of 1"),
    "no output": (_set("graph.nodes[7].kind", pb.CALL), "exactly one INPUT and one OUTPUT"),
    "edge channel": (_set("lowered.edges[0].channel", 40), "uses channel c40"),
    "edge node": (_set("lowered.edges[0].target", 40), "names a node that does not exist"),
    "communicator member": (lambda p: p.lowered.communicators[1].members.append("q"), "members"),
    "op communicator": (_set("lowered.programs[0].ops[2].communicator", 1), "communicator 1,"),
    "coll communicator": (_set("lowered.programs[0].ops[4].communicator", 0), "rank order"),
    "coll communicator range": (_set("lowered.programs[0].ops[4].communicator", 9), "9, which"),
    "comm on a compute": (_set("lowered.programs[0].ops[1].communicator", 1), "only SEND, RECV"),
    "extract on a compute": (lambda p: p.lowered.programs[0].ops[1].extract.append(1), "only a"),
    "extract off the whole input": (
        lambda p: p.lowered.programs[0].ops[0].extract.append(1),
        "does not carry the whole input",
    ),
    "peer on a read": (_set("lowered.programs[0].ops[0].peer", "w1"), "only SEND and RECV"),
    "exec offset": (_set("lowered.programs[0].ops[1].exec_offset", 2), "exec_offset 2"),
    "output channel": (lambda p: p.lowered.output_channels.reverse(), "not the output's"),
    "read nobody writes": (
        lambda p: p.lowered.programs[1].ops.pop(),  # w1 never writes c3, the driver reads it
        "actor w1.*missing",
    ),
    "capacity over driver slots": (_set("config.capacity", 9), "driver channel c1 holds 3"),
    "capacity 0": (_set("config.capacity", 0), "not lowered"),
    "nan timeout": (_set("config.get_timeout_s", float("nan")), "get_timeout_s is NaN"),
    "wake depth": (_set("lowered.programs[1].wake_depth", 3), "w1's wake_depth 3 is beyond"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_plan_is_refused_naming_the_fault(case):
    mutate, match = CASES[case]
    plan = _plan()
    check_structure(plan)  # the unmutated plan is fine
    mutate(plan)
    with pytest.raises(PlanStructureError, match=match):
        verify_plan(plan)


def test_extract_that_misses_an_attribute_is_refused():
    plan = _plan("whole_input")
    read = plan.lowered.programs[0].ops[0]
    assert list(read.extract) == [1]
    del read.extract[:]
    with pytest.raises(PlanStructureError, match="no READ before it extracts it"):
        verify_plan(plan)


LIMIT_CASES = {
    "capacity": (_set("config.capacity", 2**32 - 1), "ExecConfig.capacity"),
    "num_returns": (_set("graph.nodes[2].num_returns", 10**9), "num_returns of node %2"),
    "slots": (_set("lowered.channels[0].slots", 2**20), "Channel c1 slots"),
    "slot_bytes": (_set("lowered.channels[0].slot_bytes", 2**40), "c1 slot_bytes"),
    "ring bytes": (
        lambda p: [setattr(c, "slot_bytes", 1 << 30) for c in p.lowered.channels],
        "shared memory of all rings",
    ),
    "spin": (_set("config.spin_us", 2**31), "ExecConfig.spin_us"),
    "buffered": (_set("config.max_buffered_results", 2**31), "max_buffered_results"),
    "default slot bytes": (_set("config.default_slot_bytes", 2**50), "default_slot_bytes"),
}


@pytest.mark.parametrize("case", sorted(LIMIT_CASES))
def test_absurd_values_are_refused_naming_field_and_limit(case):
    mutate, field = LIMIT_CASES[case]
    plan = _plan()
    if case == "ring bytes":
        for ch in plan.lowered.channels:
            ch.slots = 12
        plan.config.capacity = 1
    mutate(plan)
    with pytest.raises(PlanLimitError, match=field) as ei:
        verify_plan(plan)
    assert ei.value.limit == getattr(LIMITS, ei.value.name) < ei.value.value
    assert f"Limits.{ei.value.name}" in str(ei.value)


def test_a_plan_of_format_1_4_with_communicator_backends_still_verifies():
    # Format 1.5 reserved Communicator field 2 (``backend``, never read by the runtime):
    # an older plan's value is an unknown field, kept byte for byte and ignored.
    plan = _plan()
    old = pb.Plan()
    old.CopyFrom(plan)
    for c in old.lowered.communicators:
        legacy = pb.Communicator()
        legacy.ParseFromString(b"\x12\x04nccl" + c.SerializeToString())  # field 2: "nccl"
        c.CopyFrom(legacy)
    data = old.SerializeToString(deterministic=True)
    assert data != plan.SerializeToString(deterministic=True) and b"\x12\x04nccl" in data
    read = pb.Plan.FromString(data)
    assert read.SerializeToString(deterministic=True) == data
    verify_plan(read)


def test_the_ring_bound_counts_what_the_runtime_reserves():
    # A host channel of slot size 0 takes the config's default, a tiny one the floor
    # (ring_slot_bytes): the bound adds up those sizes, not the fields as written.
    plan = _plan("chain")
    host = [c for c in plan.lowered.channels if c.kind == pb.CHAN_HOST]
    for c in host:
        c.slot_bytes = 0
    plan.config.default_slot_bytes = 8192
    reserved = sum(c.slots * 8192 for c in host)
    check_structure(plan, replace(LIMITS, ring_bytes=reserved))
    with pytest.raises(PlanLimitError, match="shared memory of all rings"):
        check_structure(plan, replace(LIMITS, ring_bytes=reserved - 1))
    for c in host:
        c.slot_bytes = 1
    floored = sum(c.slots * MIN_SLOT_BYTES for c in host)
    check_structure(plan, replace(LIMITS, ring_bytes=floored))
    with pytest.raises(PlanLimitError, match="shared memory of all rings"):
        check_structure(plan, replace(LIMITS, ring_bytes=floored - 1))


def test_limits_can_be_raised_by_a_user_with_a_reason():
    plan = _plan("chain")
    plan.config.capacity = 2000
    for cid in [*plan.lowered.input_channels, *plan.lowered.output_channels]:
        plan.lowered.channels[cid - 1].slots = 2000
    with pytest.raises(PlanLimitError, match="ExecConfig.capacity is 2,000"):
        verify_plan(plan)
    roomy = replace(LIMITS, capacity=4096, slots=4096, ring_bytes=1 << 40)
    assert verify_plan(plan, limits=roomy).all_executions


def test_more_executions_than_the_limit_are_refused():
    with pytest.raises(PlanLimitError, match="executions"):
        verify_plan(_plan("chain"), LIMITS.executions + 1)


def test_a_malformed_plan_is_an_invalid_plan_file_not_a_deadlock():
    from cgc.plan_schema import PlanFormatError
    from cgc.plan_schema.errors import EXIT_INVALID_PLAN

    assert issubclass(PlanLimitError, PlanFormatError)
    assert PlanStructureError.exit_code == PlanLimitError.exit_code == EXIT_INVALID_PLAN
