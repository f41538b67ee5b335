"""Pass ``transports``: every edge's transport and the reason, and hints that cannot hold."""

from __future__ import annotations

import pytest
import shapes
from builders import GraphBuilder
from stages import run_pass, state_before

from cgc.errors import CompileError
from cgc.ir import attrs as A
from cgc.passes import lower
from cgc.plan_schema import plan_pb2 as pb


def edges_text(plan: pb.Plan) -> str:
    s = run_pass(state_before(plan, "transports"), "transports")
    return "\n".join(
        f"%{u}.{k} -> %{v}: {pb.Transport.Name(d[A.TRANSPORT])} ({d[A.REASON]})"
        for u, v, k, d in sorted(s.g.edges(keys=True, data=True))
    )


def test_chain_edges():
    assert edges_text(shapes.chain()) == (
        "%1.0 -> %2: HOST (default: host memory)\n"
        "%2.0 -> %3: HOST (default: host memory)\n"
        "%2.0 -> %4: LOCAL (same actor)\n"
        "%3.0 -> %4: HOST (default: host memory)\n"
        "%3.0 -> %5: HOST (default: host memory)\n"
        "%4.0 -> %5: HOST (default: host memory)"
    )


def test_nccl_hint_and_collective_inputs():
    assert edges_text(shapes.two_communicators()) == (
        "%1.0 -> %2: HOST (default: host memory)\n"
        "%1.0 -> %4: HOST (default: host memory)\n"
        "%2.0 -> %3: NCCL (nccl hint)\n"
        "%3.0 -> %5: LOCAL (same actor)\n"
        "%4.0 -> %6: LOCAL (same actor)\n"
        "%5.0 -> %7: HOST (default: host memory)\n"
        "%6.0 -> %7: HOST (default: host memory)"
    )


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


def _live(plan: pb.Plan, name: str, gpu_ids: list[str]) -> pb.Plan:
    """Make actor ``name`` a live one, with the placement read from it when compiled."""
    a = next(x for x in plan.graph.actors if x.name == name)
    a.ClearField("options")
    a.external.actor_id = f"{name}00"
    p = a.external.placement
    p.observed, p.node_id = True, "node1"
    p.resources.add(name="CPU", amount=1.0)
    if gpu_ids:
        p.resources.add(name="GPU", amount=0.5)
    p.gpu_ids.extend(gpu_ids)
    return plan


def test_live_actors_holding_gpu_ids_are_gpu_actors():
    plan = _live(_live(_hinted(pb.NCCL, gpus=(0, 0)), "a", ["0"]), "b", ["0"])
    low = lower(plan).lowered
    assert low.channels[1].kind == pb.CHAN_NCCL
    assert [list(c.members) for c in low.communicators] == [["a", "b"]]
    plan = _live(_live(_hinted(pb.AUTO, gpus=(0, 0)), "a", ["0"]), "b", ["1"])
    assert lower(plan).lowered.channels[1].kind == pb.CHAN_NCCL


def test_nccl_to_a_live_actor_without_gpu_names_what_it_holds():
    plan = _live(_live(_hinted(pb.NCCL, gpus=(0, 0)), "a", ["0"]), "b", [])
    with pytest.raises(CompileError) as ei:
        lower(plan)
    msg = str(ei.value)
    assert "actor 'b' has no GPU (a live actor holding {CPU: 1}, no GPU)" in msg
    assert "Cls.options(num_gpus=1).remote()" in msg


def test_a_live_actor_read_without_placement_is_no_gpu_actor():
    """A plan of format 1.2 (or a named actor not read at compile time) has no placement:
    the compiler cannot take it for a GPU actor."""
    plan = _hinted(pb.NCCL, gpus=(1, 0))
    next(x for x in plan.graph.actors if x.name == "b").external.name = "served"
    with pytest.raises(CompileError, match="what it holds was not read when compiled"):
        lower(plan)
