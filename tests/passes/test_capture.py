"""Pass ``capture`` and the verifier's region checks: which COMPUTE ops an actor replays as a
CUDA graph comes from the method's or the actor's mark, and a plan that names anything else
is refused with the actor and op."""

from __future__ import annotations

import pytest

import cgc
from cgc import InputNode
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.verify import PlanStructureError, verify_plan


@cgc.actor
class Marked:
    @cgc.method(cuda_graph=True)
    def step(self, x):
        return x

    def plain(self, x):
        return x


@cgc.actor(cuda_graph=True)
class AllMarked:
    def step(self, x):
        return x


def _plan(dag) -> pb.Plan:
    return cgc.compile(dag, name="cap").proto


def _computes(prog: pb.Program) -> list[int]:
    return [i for i, op in enumerate(prog.ops) if op.kind == pb.COMPUTE]


def test_the_marked_method_is_captured_and_the_other_is_not():
    a = Marked.bind()
    with InputNode() as inp:
        dag = a.plain.bind(a.step.bind(inp))
    plan = _plan(dag)
    prog = plan.lowered.programs[0]
    steps = [i for i in _computes(prog) if plan.graph.nodes[prog.ops[i].task].method == "step"]
    assert list(prog.captured_ops) == steps and len(steps) == 1


def test_the_actor_option_marks_every_method_and_options_can_set_it():
    a, b = AllMarked.bind(), Marked.options(cuda_graph=True).bind()
    with InputNode() as inp:
        dag = b.plain.bind(a.step.bind(inp))
    plan = _plan(dag)
    for prog in plan.lowered.programs:
        assert list(prog.captured_ops) == _computes(prog)
    assert [n.cuda_graph for n in plan.graph.nodes if n.kind == pb.CALL] == [True, True]


def test_bad_marks_are_type_errors():
    with pytest.raises(TypeError, match="cuda_graph must be True or False"):
        cgc.method(cuda_graph="yes")
    with pytest.raises(TypeError, match="cuda_graph must be True or False"):
        Marked.options(cuda_graph=1)


@pytest.fixture()
def captured() -> pb.Plan:
    a = Marked.bind()
    with InputNode() as inp:
        dag = a.plain.bind(a.step.bind(inp))
    return _plan(dag)


def _refused(plan: pb.Plan, match: str) -> None:
    with pytest.raises(PlanStructureError, match=match):
        verify_plan(plan)


def test_a_region_must_be_a_marked_compute(captured):
    verify_plan(captured)  # as compiled
    prog = captured.lowered.programs[0]
    read = next(i for i, op in enumerate(prog.ops) if op.kind == pb.READ)
    bad = pb.Plan()
    bad.CopyFrom(captured)
    del bad.lowered.programs[0].captured_ops[:]
    bad.lowered.programs[0].captured_ops.append(read)
    _refused(bad, "captured op .* is a READ; only a COMPUTE can be replayed")
    bad.CopyFrom(captured)
    plain = next(i for i in _computes(prog)
                 if captured.graph.nodes[prog.ops[i].task].method == "plain")
    bad.lowered.programs[0].captured_ops.append(plain)
    _refused(bad, "not marked for capture")


def test_regions_are_ascending_and_in_range(captured):
    n = len(captured.lowered.programs[0].ops)
    m = captured.lowered.programs[0].captured_ops[0]
    for ops in ([n], [m, m]):
        bad = pb.Plan()
        bad.CopyFrom(captured)
        del bad.lowered.programs[0].captured_ops[:]
        bad.lowered.programs[0].captured_ops.extend(ops)
        _refused(bad, "captured_ops must be ascending indices")
