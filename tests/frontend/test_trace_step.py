"""A step of plain Ray actor calls, traced: the same graph as the DAG API, run exactly.

Real Ray, live actors: ``cgc.compile(step, example_inputs=...)`` and ``@cgc.trace``.
"""

from __future__ import annotations

import asyncio

import pytest
import ray
import torch
import trace_models as tm
from ray.dag import InputNode as RayInput
from ray.dag import MultiOutputNode as RayMulti

import cgc
from cgc.errors import CompileError, TraceError
from cgc.frontend import trace
from cgc.frontend.step_tracer import trace_step
from cgc.plan_schema import plan_pb2 as pb
from cgc.runtime.errors import GraphTornDownError


@pytest.fixture(scope="module")
def stages(ray_cluster):
    a, b = tm.Stage.remote(2.0), tm.Stage.remote(3.0)
    ray.get([a.fwd.remote(0), b.fwd.remote(0)])
    yield a, b
    for h in (a, b):
        ray.kill(h)


def _strip(g: pb.Graph) -> bytes:
    g2 = pb.Graph()
    g2.CopyFrom(g)
    for a in g2.actors:
        a.ClearField("loc")
    for n in g2.nodes:
        n.ClearField("loc")
        for h in n.hints:
            h.hint.ClearField("loc")
    return g2.SerializeToString(deterministic=True)


def test_a_step_and_its_dag_are_one_graph(stages):
    a, b = stages

    def step(x, y):
        h = a.fwd.remote(x, scale=0.5)
        p, q = b.split.remote(h)
        return [b.add.remote(p, y), q]

    stepped = trace(trace_step(step, (1, 2)).output).graph
    with RayInput() as inp:
        h = a.fwd.bind(inp[0], scale=0.5)
        p, q = b.split.bind(h)
        dag = RayMulti([b.add.bind(p, inp[1]), q])
    assert _strip(stepped) == _strip(trace(dag).graph)
    # the same program traced twice gives the same bytes
    assert trace(trace_step(step, (1, 2)).output).graph.SerializeToString(
        deterministic=True) == stepped.SerializeToString(deterministic=True)


def test_compile_runs_the_step_exactly(stages):
    a, b = stages
    weights = ray.put(torch.full((3,), 10.0))

    def step(x, bias):
        h = a.fwd.remote(x, 2.0)                    # a constant
        m = b.add.remote(h, weights)                # a ray.put object passed in
        return {"out": b.fwd.remote(m, bias=bias), "mid": h}

    x = torch.arange(3.0)
    plan = cgc.compile(step, example_inputs=(x, 1.0))
    assert plan.name == "step"
    with plan.start() as graph:
        out, mid = (r.get(timeout=30) for r in graph.execute(x, 1.0))
    want_mid = x * 2.0 * 2.0
    assert torch.equal(mid, want_mid)
    assert torch.equal(out, (want_mid + 10.0) * 3.0 + 1.0)
    # and eager Ray agrees
    got = step(x, 1.0)
    assert torch.equal(ray.get(got["out"]), out)


def test_calls_to_one_actor_keep_program_order(stages):
    a, _ = stages
    log_actor = tm.Stage.remote()

    def step(x):
        log_actor.push.remote(x)                  # results nobody reads: still called
        second = log_actor.push.remote(a.fwd.remote(x))
        return log_actor.log.remote(second)

    with pytest.raises(CompileError, match="push"):
        cgc.compile(step, example_inputs=(1,))    # a dangling result is refused, as in DAGs

    def ordered(x):
        one = log_actor.push.remote(x)
        two = log_actor.push.remote(a.fwd.remote(x))
        return [one, two, log_actor.log.remote(two)]

    plan = cgc.compile(ordered, example_inputs=(1,))
    with plan.start() as graph:
        one, two, seen = (r.get(timeout=30) for r in graph.execute(5))
    assert (one, two, seen[-2:]) == (1, 2, [5, 10.0])
    ray.kill(log_actor)


def test_num_returns_from_the_method_and_from_options(stages):
    a, b = stages

    def step(x):
        head, tail = a.split.remote(x)                       # @ray.method(num_returns=2)
        left, right = b.pair.options(num_returns=2).remote(tail)
        return head, left, right

    traced = trace_step(step, (torch.ones(3),))
    assert traced.layout == ("tuple",)
    plan = cgc.compile(step, example_inputs=(torch.ones(3),))
    with plan.start() as graph:
        vals = [r.get(timeout=30) for r in graph.execute(torch.arange(3.0))]
    assert [v.tolist() for v in vals] == [[0.0], [1.0, 2.0], [1.0, 2.0]]


def _hint(step, *args) -> list[int]:
    g = trace(trace_step(step, args).output).graph
    return [h.hint.transport for n in g.nodes for h in n.hints]


def test_rdt_tensor_transport_becomes_the_edge_hint(stages):
    a, b = stages
    assert _hint(lambda x: b.fwd.remote(a.fwd_gloo.remote(x)), 1) == [pb.HOST]
    for ray_name, cgc_kind in (("gloo", pb.HOST), ("nccl", pb.NCCL),
                               ("cuda_ipc", pb.NCCL), ("nixl", pb.AUTO)):
        def step(x, t=ray_name):
            return b.fwd.remote(a.fwd.options(tensor_transport=t).remote(x))
        assert _hint(step, 1) == [cgc_kind], ray_name
    # NCCL between actors that hold no GPU cannot hold (Ray's RDT nccl needs GPUs too)
    with pytest.raises(CompileError, match="GPU"):
        cgc.compile(lambda x: b.fwd.remote(a.fwd.options(tensor_transport="nccl").remote(x)),
                    example_inputs=(1,))


def test_rdt_gloo_step_runs_through_cgc(stages):
    a, b = stages

    @cgc.trace
    def step(x):
        return b.fwd.remote(a.fwd_gloo.remote(x))

    x = torch.arange(4.0)
    try:
        assert torch.equal(ray.get(step(x)), x * 6.0)
        edges = step.plan.proto.lowered.edges
        assert any(e.transport == pb.HOST and e.reason == "ray rdt gloo: host hint"
                   for e in edges)
    finally:
        step.teardown()


def test_the_decorator_returns_refs_ray_get_await_and_get_take(stages):
    a, b = stages

    @cgc.trace(capacity=2)
    def step(x):
        return {"y": b.fwd.remote(a.fwd.remote(x)), "x": x}

    try:
        assert step.plan is None
        first = step(1.0)
        assert step.plan is not None and step.plan.name == "step"
        assert ray.get(first["y"]) == 6.0 and first["x"].get() == 1.0
        second = step(ray.put(2.0))                      # a ref argument is its value
        assert second["y"].get(timeout=30) == 12.0

        async def run() -> float:
            return await step(3.0)["y"]

        assert asyncio.run(run()) == 18.0
        with pytest.raises(TraceError, match="traced with 1 positional"):
            step(1.0, 2.0)
    finally:
        step.teardown()
    # the live actors are still the user's after teardown
    assert ray.get(a.fwd.remote(1.0)) == 2.0


def test_keyword_arguments_of_the_step_are_keyword_inputs(stages):
    a, b = stages

    def step(x, *, scale):
        return b.fwd.remote(a.fwd.remote(x), scale=scale)

    plan = cgc.compile(step, example_inputs=(1.0,), example_kwargs={"scale": 10.0})
    assert list(plan.proto.graph.keyword_fields) == ["scale"]
    with plan.start() as graph:
        assert graph.execute(1.0, scale=10.0).get(timeout=30) == 60.0


def test_inspect_names_the_rdt_transport_and_how_cgc_took_it(stages):
    from cgc.plan_schema.text import format_plan_text

    a, b = stages
    plan = cgc.compile(lambda x: b.fwd.remote(a.fwd.options(tensor_transport="nixl").remote(x)),
                       example_inputs=(1,), name="nixl")
    text = format_plan_text(plan.proto)
    assert "hint[0]=auto(rdt:nixl)" in text
    assert "(ray rdt nixl: auto hint: not both GPU actors)" in text


def test_a_collective_among_the_step_s_actors(stages):
    from ray.experimental.collective import allreduce
    from ray.experimental.util.types import ReduceOp as RayReduceOp

    a, b = stages

    def step(x):
        r0, r1 = allreduce.bind([a.fwd.remote(x), b.fwd.remote(x)], op=RayReduceOp.MAX)
        return [a.add.remote(r0, 1), b.add.remote(r1, 2)]

    plan = cgc.compile(step, example_inputs=(torch.ones(2),))
    g = plan.proto.graph
    assert [c.kind for c in g.collectives] == [pb.ALLREDUCE]
    with plan.start(communicator="cpu") as graph:
        got = [r.get(timeout=60) for r in graph.execute(torch.ones(2))]
    assert [t.tolist() for t in got] == [[4.0, 4.0], [5.0, 5.0]]  # max(2, 3) + 1, + 2


def test_compile_takes_a_decorated_step_without_starting_it(stages):
    a, b = stages

    @cgc.trace
    def step(x):
        return b.fwd.remote(a.fwd.remote(x))

    plan = cgc.compile(step, example_inputs=(1.0,))
    assert step.graph is None and step.plan is None  # compiling did not run the step
    assert [n.method for n in plan.proto.graph.nodes if n.method] == ["fwd", "fwd"]


def test_a_call_after_teardown_raises_at_once_and_starts_nothing(stages):
    a, b = stages

    @cgc.trace
    def step(x):
        return b.fwd.remote(a.fwd.remote(x))

    assert ray.get(step(1.0)) == 6.0
    plan = step.plan
    step.teardown()
    with pytest.raises(GraphTornDownError, match=r"step\(\) was torn down after teardown\(\)"
                       r".*\(stage0 \(Stage\), stage1 \(Stage\)\) are left as they are"):
        step(1.0)
    assert step.graph is None and step.plan is plan  # not traced nor started again
    step.teardown()  # idempotent
    assert ray.get(a.fwd.remote(1.0)) == 2.0


AFTER_SHUTDOWN = """
import sys, time, ray, cgc
sys.path.insert(0, sys.argv[1])
import trace_models as tm
from cgc.runtime.errors import GraphTornDownError

ray.init("local", num_cpus=2, include_dashboard=False)
a, b = tm.Stage.remote(2.0), tm.Stage.remote(3.0)

@cgc.trace
def step(x):
    return b.fwd.remote(a.fwd.remote(x))

print("value", ray.get(step(1.0)), flush=True)
ray.shutdown()
if sys.argv[2] == "teardown":
    step.teardown()
t0 = time.monotonic()
try:
    step(1.0)
except GraphTornDownError as exc:
    print("refused", round(time.monotonic() - t0, 3), exc, flush=True)
print("ray up", ray.is_initialized(), flush=True)
"""


@pytest.mark.parametrize("then", ["teardown", "nothing"])
def test_a_call_after_ray_shutdown_names_the_dead_actors_and_starts_no_ray(then, tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run([sys.executable, "-c", AFTER_SHUTDOWN, str(Path(__file__).parent),
                          then], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0] == "value 6.0"
    refused = next(ln for ln in lines if ln.startswith("refused"))
    assert float(refused.split()[1]) < 1.0, refused  # at once, not after Ray's retries
    assert "Ray has shut down since it started, so its actors are dead: stage0 (Stage), " \
           "stage1 (Stage)" in refused
    assert lines[-1] == "ray up False"
