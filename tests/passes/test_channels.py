"""Pass ``channels``: one channel per node output and kind, the edge table, driver ends."""

from __future__ import annotations

import shapes
from builders import GraphBuilder
from stages import channels_text, run_pass, state_before

from cgc.passes.channels import EXTRACTED
from cgc.plan_schema import plan_pb2 as pb


def _channels(plan: pb.Plan) -> pb.Plan:
    return run_pass(state_before(plan, "channels"), "channels").plan


def _edges(plan: pb.Plan) -> list[tuple[int, int, int, int, str]]:
    return [
        (e.source.node, e.source.output_index, e.target, e.channel, e.reason)
        for e in plan.lowered.edges
    ]


def test_chain_one_write_serves_every_reader():
    plan = _channels(shapes.chain())
    assert channels_text(plan) == (
        "c1 host %1 @driver -> a slots=1 bytes=1048576 (default: host memory)\n"
        "c2 host %2 a -> b slots=1 bytes=1048576 (default: host memory)\n"
        "c3 host %3 b -> @driver,a slots=1 bytes=1048576 (default: host memory)\n"
        "c4 host %4 a -> @driver slots=1 bytes=1048576 (default: host memory)\n"
        "driver writes [1], reads [4, 3]"
    )
    assert (2, 0, 4, 0, "same actor") in _edges(plan)  # a local edge has no channel


def test_nccl_outputs_get_one_channel_for_all_readers():
    plan = _channels(shapes.two_writer_nccl())
    assert channels_text(plan).splitlines()[1] == (
        "c2 nccl %2 a -> b,c comm=0 bytes=1048576 (nccl hint)"
    )


def test_whole_input_readers_take_attributes_out_of_it():
    plan = _channels(shapes.whole_input())
    # a reads the whole input (c1) and gets inp[0] (%1) from it: no channel for %1
    assert channels_text(plan) == (
        "c1 host %0 @driver -> a slots=1 bytes=1048576 (default: host memory)\n"
        "c2 host %2 @driver -> b slots=1 bytes=1048576 (default: host memory)\n"
        "c3 host %4 a -> @driver slots=1 bytes=1048576 (default: host memory)\n"
        "c4 host %5 b -> @driver slots=1 bytes=1048576 (default: host memory)\n"
        "driver writes [1, 2], reads [3, 4]"
    )
    assert (1, 0, 4, 1, EXTRACTED) in _edges(plan)


def test_an_attribute_with_a_device_move_keeps_its_own_channel():
    b = GraphBuilder()
    b.actor("a", gpus=1)
    x, i0 = b.whole(), b.input(0)
    f = b.call("a", "f", x)
    g = b.call("a", "g", f)
    b.g.nodes[i0].hints.add(output_index=0).hint.device = pb.GPU
    b.output(b.call("a", "h", i0, g))
    plan = _channels(b.plan())
    sources = [ch.source.node for ch in plan.lowered.channels]
    assert i0 in sources and x in sources
    assert not any(e.reason == EXTRACTED for e in plan.lowered.edges)


def test_declared_tensor_sizes_the_slots_within_the_limit():
    from dataclasses import replace

    from cgc.passes import LowerOptions
    from cgc.plan_schema.defaults import LIMITS

    b = GraphBuilder()
    b.actor("a")
    b.actor("b")
    y = b.call("a", "f", b.input(0))
    spec = b.g.nodes[y].hints.add(output_index=0).hint
    spec.transport, spec.spec.dtype = pb.HOST, "float32"
    spec.spec.shape.extend([1024, 1024])
    b.output(b.call("b", "g", y))
    plan = _channels(b.plan())
    assert plan.lowered.channels[1].slot_bytes == 4 * 1024 * 1024 + 4096
    small = replace(LIMITS, slot_bytes=1 << 20)
    b2 = pb.Plan()
    b2.CopyFrom(b.plan())
    state = state_before(b2, "channels", LowerOptions(limits=small))
    plan = run_pass(state, "channels").plan
    assert plan.lowered.channels[1].slot_bytes == 1 << 20


def _flagged(transport: int, gpus: float) -> pb.Plan:
    b = GraphBuilder()
    b.actor("a", gpus=gpus)
    b.actor("b", gpus=gpus)
    y = b.call("a", "f", b.input(0), hint=transport)
    for h in b.g.nodes[y].hints:
        h.hint.direct_return = h.hint.static_shape = True
    b.output(b.call("b", "g", y))
    return b.plan()


def test_direct_return_and_static_shape_bind_where_the_hint_chose_a_device():
    """As in Ray: an "auto" hint that chose host memory leaves them off; "shm" (cgc's
    explicit host choice) and device edges keep them."""
    for transport, gpus, kept in ((pb.AUTO, 0, False), (pb.AUTO, 1, True),
                                  (pb.HOST, 0, True), (pb.NCCL, 1, True)):
        ch = _channels(_flagged(transport, gpus)).lowered.channels[1]
        assert (ch.direct_return, ch.static_shape) == (kept, kept), (transport, gpus)
