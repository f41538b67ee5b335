"""cgc.compile / cgc.compile_file: the decisions a caller passes reach the plan."""

from __future__ import annotations

import textwrap

import pytest

import cgc
from cgc import InputNode
from cgc.errors import CompileError
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.errors import ConfigError
from cgc.plan_schema.values import decode_value


@cgc.actor
class Scaler:
    def step(self, x, scale=1):
        return x * scale


def _dag():
    a, b = Scaler.bind(), Scaler.bind()
    with InputNode() as inp:
        return b.step.bind(a.step.bind(inp.x), scale=inp.k)


def test_capacity_and_at_capacity_reach_the_plan():
    plan = cgc.compile(_dag(), capacity=6, at_capacity="raise").proto
    assert plan.config.capacity == 6 and plan.config.at_capacity == pb.AT_CAPACITY_RAISE
    assert cgc.compile(_dag()).proto.config.at_capacity == pb.AT_CAPACITY_WAIT


def test_rays_max_inflight_executions_is_the_capacity():
    assert cgc.compile(_dag(), _max_inflight_executions=5).proto.config.capacity == 5
    with pytest.raises(ConfigError, match="disagree"):
        cgc.compile(_dag(), capacity=4, _max_inflight_executions=5)


def test_example_kwargs_are_stored():
    plan = cgc.compile(_dag(), example_kwargs={"x": 2, "k": 3}).proto
    assert plan.has_example_inputs and not plan.example_args
    assert {nv.name: decode_value(nv.value) for nv in plan.example_kwargs} == {"k": 3, "x": 2}


def test_a_bad_capacity_is_a_compile_error():
    with pytest.raises(CompileError, match="capacity=0 is outside"):
        cgc.compile(_dag(), capacity=0)


def test_model_files_may_define_example_kwargs(tmp_path):
    model = tmp_path / "kw_model.py"
    model.write_text(
        textwrap.dedent(
            """
            import cgc
            from cgc import InputNode

            @cgc.actor
            class W:
                def f(self, x, scale=1):
                    return x * scale

            def build_dag():
                w = W.bind()
                with InputNode() as inp:
                    return w.f.bind(inp[0], scale=inp.scale)

            def example_inputs():
                return (2,)

            def example_kwargs():
                return {"scale": 5}
            """
        )
    )
    plan = cgc.compile_file(model, capacity=3).proto
    assert [decode_value(v) for v in plan.example_args] == [2]
    assert [(nv.name, decode_value(nv.value)) for nv in plan.example_kwargs] == [("scale", 5)]
    assert plan.config.capacity == 3
    model.write_text(model.read_text().replace('return {"scale": 5}', "return [5]"))
    with pytest.raises(CompileError, match="example_kwargs\\(\\) must return a dict"):
        cgc.compile_file(model)
