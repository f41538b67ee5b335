"""Ray's own DAG objects trace to the same graph as the equivalent cgc builder program."""

from __future__ import annotations

import sys

import frontend_models as m
import pytest
import ray
from ray.dag import InputNode as RayInput
from ray.dag import MultiOutputNode as RayMulti
from ray.experimental.collective import allreduce as ray_allreduce

import cgc
from cgc.errors import CompileError, UnsupportedNodeError
from cgc.frontend import InputNode, MultiOutputNode, allreduce, record_ray_bind_sites, trace
from cgc.plan_schema import plan_pb2 as pb

OPTS = dict(num_cpus=1, resources={"b": 1.0, "a": 2.0}, runtime_env={"env_vars": {"X": "1"}})
CgcWorker = cgc.actor(**OPTS)(m.Worker)
RayWorker = ray.remote(**OPTS)(m.Worker)


class _Two:
    def two(self, x):
        return x, x


CgcTwo = cgc.actor(cgc.method(num_returns=2)(_Two.two) and _Two)
RayTwo = ray.remote(_Two)


def _strip(g: pb.Graph) -> bytes:
    """The graph without source locations (the two programs sit on different lines)."""
    g2 = pb.Graph()
    g2.CopyFrom(g)
    for a in g2.actors:
        a.ClearField("loc")
    for n in g2.nodes:
        n.ClearField("loc")
        for h in n.hints:
            h.hint.ClearField("loc")
    for c in g2.collectives:
        c.ClearField("loc")
        c.hint.ClearField("loc")
    return g2.SerializeToString(deterministic=True)


def _chain(W, Input, Multi):
    ws = [W.bind(i, bias=0.5) for i in range(3)]
    with Input() as inp:
        a = ws[0].fwd.bind(inp[0], scale=2.0)
        b = ws[1].fwd.bind(inp.y).with_tensor_transport("nccl", _static_shape=True)
        c = ws[2].add.bind(a, b)
        d = ws[0].add.bind(c, [1, 2])
        return Multi([d, b])


def test_chain_matches_builder():
    ray_g = trace(_chain(RayWorker, RayInput, RayMulti)).graph
    cgc_g = trace(_chain(CgcWorker, InputNode, MultiOutputNode)).graph
    assert _strip(ray_g) == _strip(cgc_g)
    assert [n.name for n in ray_g.nodes][-3:] == ["worker2.add#0", "worker0.add#1", "output"]
    assert ray_g.actors[0].options.runtime_env_json == '{"env_vars":{"X":"1"}}'
    assert ray_g.actors[0].cls.qualname == "Worker"


def test_bind_sites_give_source_lines():
    # (that recording restores Ray is tested in test_ray_private.py)
    with record_ray_bind_sites():
        dag = _chain(RayWorker, RayInput, RayMulti)
    g = trace(dag).graph
    assert g.nodes[-1].loc.function == "_chain"  # the line inside the model function
    chain_lines = range(_chain.__code__.co_firstlineno, _chain.__code__.co_firstlineno + 8)
    assert g.nodes[-1].loc.line in chain_lines and g.actors[0].loc.line in chain_lines
    assert g.actors[0].loc.file.endswith("test_ray_adapter.py")
    fwd1 = next(n for n in g.nodes if n.name == "worker1.fwd#0")
    assert fwd1.hints[0].hint.transport == pb.NCCL and fwd1.hints[0].hint.static_shape
    assert fwd1.hints[0].hint.loc.line == fwd1.loc.line


def _multi(W, Two, Input, Multi, unpack):
    s, w = Two.bind(), W.bind()
    with Input() as inp:
        if unpack:
            a, b = s.two.bind(inp)
        else:
            n = s.two.options(num_returns=2).bind(inp)
            a, b = n if isinstance(n, tuple) else (n[0], n[1])
        return Multi([w.add.bind(a, b), b])


def test_multi_return_matches_builder():
    RayTwoM = ray.remote(type("_Two", (), {"two": ray.method(num_returns=2)(_Two.two)}))
    RayTwoM.__ray_metadata__.modified_class.__ray_actor_class__.__module__ = __name__
    cgc_g = trace(_multi(CgcWorker, CgcTwo, InputNode, MultiOutputNode, True)).graph
    with record_ray_bind_sites():  # ClassNode binds of multi-return methods unpack here
        ray_g = trace(_multi(RayWorker, RayTwoM, RayInput, RayMulti, True)).graph
    two = next(n for n in ray_g.nodes if n.method == "two")
    assert two.num_returns == 2
    assert _strip(ray_g) == _strip(cgc_g)


def test_multi_return_options_without_unpacking_is_rejected_clearly():
    s, w = RayTwo.bind(), RayWorker.bind()
    with RayInput() as inp:
        n = s.two.options(num_returns=2).bind(inp)
        dag = w.fwd.bind(n)
    with pytest.raises(CompileError, match="returns 2 values but is used as one value"):
        trace(dag)


def test_collective_on_class_nodes_matches_builder():
    def build(W, Input, Multi, red):
        w0, w1 = W.bind(), W.bind()
        with Input() as inp:
            r = red.bind([w0.grad.bind(inp), w1.grad.bind(inp)])
            return Multi([w0.add.bind(r[0], 1), w1.add.bind(r[1], 1)])

    with record_ray_bind_sites():
        ray_g = trace(build(RayWorker, RayInput, RayMulti, ray_allreduce)).graph
    cgc_g = trace(build(CgcWorker, InputNode, MultiOutputNode, allreduce)).graph
    assert len(ray_g.collectives) == 1
    assert _strip(ray_g) == _strip(cgc_g)


def test_ray_signature_errors_name_the_line():
    w = RayWorker.bind()
    with record_ray_bind_sites():
        with RayInput() as inp:
            line = sys._getframe().f_lineno + 1
            dag = w.fwd.bind(inp, 1, 2)
    with pytest.raises(CompileError) as info:
        trace(dag)
    assert f"test_ray_adapter.py:{line}: worker.fwd#0 (Worker.fwd)" in str(info.value)


def test_ray_dangling_and_unknown_method():
    w = RayWorker.bind()
    with RayInput() as inp:
        x = w.fwd.bind(inp)
        w.log.bind(x)
        dag = w.add.bind(x, 1)
    with pytest.raises(CompileError, match=r"worker\.log#1 \(Worker\.log\).*reaches no output"):
        trace(dag)


def test_function_nodes_are_refused():
    @ray.remote
    def f(x):
        return x

    with RayInput() as inp:
        dag = f.bind(inp)
    with pytest.raises(CompileError, match="FunctionNode") as info:
        trace(dag)
    # Ray raises NotImplementedError here; code catching that keeps working on cgc.
    assert isinstance(info.value, NotImplementedError)
    assert isinstance(info.value, UnsupportedNodeError)
    assert "only actor method calls" in str(info.value)


def test_live_handles_become_external_actors(ray_cluster):
    # Placeable live actors: what each holds is read from it when the graph is traced.
    # (Ray's workers cannot import this test folder: its classes travel by value.)
    ray.cloudpickle.register_pickle_by_value(m)
    live = ray.remote(num_cpus=0)(m.Worker)
    h = live.options(name="live_w", namespace="cgc_test", num_cpus=0.5).remote()
    h2 = live.remote()
    try:
        with RayInput() as inp:
            a = h.fwd.bind(inp)
            dag = RayMulti([h2.add.bind(a, 1), h.fwd.bind(a)])
        res = trace(dag)
        g = res.graph
        ext = {a.name: a.external for a in g.actors}
        assert set(res.live_handles) == set(ext)
        named = next(a for a in g.actors if a.external.name == "live_w")
        assert named.external.namespace == "cgc_test"
        assert named.external.actor_id == h._ray_actor_id.hex()
        assert res.live_handles[named.name] is h
        assert res.classes[named.name] is m.Worker
        assert [n.bind_index for n in g.nodes if n.actor == named.name] == [0, 1]
        node_id = ray.get_runtime_context().get_node_id()
        held = {a.name: a.external.placement for a in g.actors}
        assert all(p.observed and p.node_id == node_id and not p.gpu_ids
                   for p in held.values())
        assert [(r.name, r.amount) for r in held[named.name].resources] == [("CPU", 0.5)]
        with RayInput() as inp2:
            r0, r1 = ray_allreduce.bind([h.grad.bind(inp2), h2.grad.bind(inp2)])
        g2 = trace(RayMulti([r0, r1])).graph
        assert len(g2.collectives) == 1 and g2.collectives[0].hint.transport == pb.NCCL
    finally:
        ray.cloudpickle.unregister_pickle_by_value(m)
        ray.kill(h)
        ray.kill(h2)


def test_recording_does_not_import_ray_and_patches_modules_imported_inside():
    import subprocess
    import textwrap

    script = textwrap.dedent("""
        import sys
        from cgc.frontend import record_ray_bind_sites
        with record_ray_bind_sites():
            assert "ray" not in sys.modules
            from ray.dag import class_node, dag_node
            inside = dag_node.DAGNode.__init__.__qualname__
        assert inside != "DAGNode.__init__", inside
        assert dag_node.DAGNode.__init__.__qualname__ == "DAGNode.__init__"
        assert class_node._UnboundClassMethodNode.bind.__qualname__ == "_UnboundClassMethodNode.bind"
        assert "cgc" not in type(dag_node.__loader__).__module__
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr


def test_a_live_actor_that_never_answers_is_named_after_the_timeout(ray_cluster):
    from cgc.frontend.live_actors import observe

    pending = RayWorker.options(resources={"cgc_test_never_scheduled": 1}).remote()
    try:
        with pytest.raises(CompileError, match=r"model\.py:3: live actor Worker \(id [0-9a-f]+\) "
                                               r"did not say what it holds within 1 s"):
            observe([pending], ["Worker"], ["model.py:3"], timeout_s=1.0)
    finally:
        ray.kill(pending)
