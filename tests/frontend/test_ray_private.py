"""Ray's internals that the frontend uses: all present and behaving on the installed Ray
(instance attributes checked on sample objects), and a clear error naming the Ray version
when one is missing. That no package touches them outside the registry
(``cgc.runtime.ray_internals``) is tests/runtime/test_ray_internals.py's scan."""

from __future__ import annotations

import importlib

import frontend_models as m
import pytest
import ray
from ray.dag import InputNode, MultiOutputNode
from ray.experimental.collective import allreduce
from ray.experimental.util.types import ReduceOp

from cgc.errors import CompileError, RayVersionError
from cgc.frontend import ray_private as rp
from cgc.frontend import record_ray_bind_sites, trace
from cgc.runtime.ray_internals import check as ri_check


class _Two:
    @ray.method(num_returns=2)
    def two(self, x):
        return x, x


Worker = ray.remote(num_cpus=0)(m.Worker)
Two = ray.remote(num_cpus=0)(_Two)


def _class_node_graph():
    """A graph over ClassNode actors with every kind of node the adapter reads."""
    w0, w1, t = Worker.bind(1), Worker.bind(2, bias=0.5), Two.bind()
    with record_ray_bind_sites():
        with InputNode() as inp:
            i0 = inp[0]
            x0 = w0.fwd.bind(i0, scale=3)
            x1 = w1.fwd.bind(inp.y).with_tensor_transport("nccl", _static_shape=True)
            a, b = t.two.bind(x0)
            b.with_tensor_transport()
            r0, r1 = allreduce.bind([w0.grad.bind(x0), w1.grad.bind(x1)], op=ReduceOp.MAX)
            out = MultiOutputNode([a, b, r0, r1])
    return dict(w0=w0, w1=w1, t=t, inp=inp, i0=i0, x0=x0, x1=x1, a=a, b=b, r0=r0, r1=r1, out=out)


def _function_node():
    @ray.remote
    def f(x):
        return x

    with InputNode() as inp:
        return f.bind(inp)


@pytest.fixture
def live_graph(ray_cluster):
    """Calls and a collective on live actor handles (Ray builds these itself). The actors
    ask for a resource the cluster lacks: they are never scheduled, only their handles
    are used."""
    pending = Worker.options(resources={"cgc_test_never_scheduled": 1})
    h0, h1 = pending.remote(), pending.remote()
    with InputNode() as inp:
        c0 = h0.grad.bind(inp)
        c1 = h0.fwd.bind(inp)
        r0, r1 = allreduce.bind([c0, h1.grad.bind(inp)])
    try:
        yield dict(h0=h0, h1=h1, c0=c0, c1=c1, r0=r0, r1=r1)
    finally:
        ray.kill(h0)
        ray.kill(h1)


def _samples(g: dict, live: dict) -> list:
    objs = list(g.values()) + list(live.values()) + [_function_node(), g["w0"].fwd]
    objs += [o._type_hint for o in (g["x1"], g["b"])]
    objs += [o._collective_op for o in (g["r0"], live["r0"])]
    objs += [Worker, Worker.__ray_metadata__]
    objs += [live["h0"].fwd]  # a live handle's ActorMethod (the step tracer reads it)
    return objs


def test_installed_ray_has_every_internal_cgc_uses(live_graph):
    problems = rp.check_private_api(_samples(_class_node_graph(), live_graph))
    assert not problems, (
        f"Ray {ray.__version__} differs from the Ray {rp.WRITTEN_FOR} that "
        "cgc/runtime/ray_internals was written for:\n" + "\n".join(problems)
    )
    rp.require()  # the adapter's own check agrees


def test_accessors_read_what_ray_stores():
    g = _class_node_graph()
    inp, x0, x1, w0 = g["inp"], g["x0"], g["x1"], g["w0"]
    attr0 = g["i0"]
    assert rp.bound_args(x0) == (attr0,) and rp.attribute_source(attr0) == (inp, 0)
    assert rp.bound_kwargs(x0) == {"scale": 3}
    assert rp.bound_args(w0) == (1,) and rp.bound_kwargs(g["w1"]) == {"bias": 0.5}
    assert rp.parent_actor(x0) is w0 and rp.method_name(x0) == "fwd"
    assert rp.scan_nodes([(1, {"k": [x0]}), x1]) == [x0, x1]
    assert x0 in rp.downstream(attr0)
    assert sorted(map(str, (rp.attribute_source(a)[1] for a in rp.input_attributes(inp)))) == [
        "0",
        "y",
    ]
    assert [rp.method_name(c) for c in rp.call_chain(w0)] == ["fwd", "grad", "allreduce.ReduceOp.MAX"]
    assert rp.original_class(rp.actor_body(w0)) is m.Worker
    assert rp.remote_class(Worker) is m.Worker and rp.remote_class(m.Worker) is m.Worker
    assert rp.declared_num_returns(_Two.two) == 2
    two_call, index = rp.output_of(g["b"])
    assert index == 1 and rp.method_name(two_call) == "two" and rp.output_of(x0) is None
    assert rp.type_hint(x1) == rp.RayTypeHint(
        auto=False,
        transport="accelerator",
        communicator=None,
        device="default",
        static_shape=True,
        direct_return=False,
    )
    assert rp.type_hint(g["b"]).auto and rp.type_hint(x0) is None
    assert rp.actor_body(_function_node()).__name__ == "f"
    assert rp.unbound_call(w0.fwd.options(num_returns=1)) == (w0, "fwd", {"num_returns": 1})
    coll = rp.collective_of(g["r0"])  # w0's member
    assert (coll.kind, coll.reduce_op, coll.actors) == ("allreduce", "MAX", [w0, g["w1"]])
    assert coll.key == rp.collective_of(g["r1"]).key
    assert rp.parent_actor(g["r1"]) is g["w1"]


def test_accessors_on_live_handles(live_graph):
    h0, h1 = live_graph["h0"], live_graph["h1"]
    assert rp.handle_id(h0) == h0._actor_id.hex() != rp.handle_id(h1)
    assert rp.handle_class(h0) == (m.Worker.__module__, "Worker")
    assert rp.parent_actor(live_graph["c0"]) is h0
    assert [rp.live_bind_index(live_graph[k]) for k in ("c0", "c1")] == [0, 1]
    coll = rp.collective_of(live_graph["r0"])
    assert coll.kind == "allreduce" and coll.reduce_op == "SUM"
    assert [rp.handle_id(h) for h in coll.actors] == [rp.handle_id(h0), rp.handle_id(h1)]
    assert coll.hint.transport == "accelerator" and not coll.hint.auto


def _plain_graph():
    w = Worker.bind()
    with InputNode() as inp:
        return w.fwd.bind(inp), w


def test_a_missing_module_level_internal_is_a_clear_compile_error():
    dag, _ = _plain_graph()
    scanner = importlib.import_module("ray.dag.py_obj_scanner")
    ri_check._module_level_ok.cache_clear()
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.delattr(scanner, "_PyObjScanner")
            with pytest.raises(RayVersionError) as info:
                trace(dag)
    finally:
        ri_check._module_level_ok.cache_clear()
    msg = str(info.value)
    assert f"Ray {ray.__version__} has no ray.dag.py_obj_scanner._PyObjScanner" in msg
    assert f"written for Ray {rp.WRITTEN_FOR}" in msg
    assert isinstance(info.value, CompileError) and info.value.exit_code == 3
    trace(dag)  # Ray restored: traces again


def test_a_missing_instance_attribute_is_a_clear_compile_error():
    dag, w = _plain_graph()
    del w._bound_options  # as if a Ray release had renamed it
    with pytest.raises(RayVersionError, match=r"no ray\.dag\.class_node\.ClassNode\._bound_options"):
        trace(dag)


def test_a_missing_patch_target_is_a_clear_error_and_nothing_stays_patched():
    dag_node = importlib.import_module("ray.dag.dag_node")
    init = dag_node.DAGNode.__init__
    with pytest.MonkeyPatch.context() as mp:
        mp.delattr(dag_node.DAGNode, "with_tensor_transport")
        with pytest.raises(RayVersionError, match=r"DAGNode\.with_tensor_transport"):
            with record_ray_bind_sites():
                pass
        assert dag_node.DAGNode.__init__ is init


def test_recording_restores_every_patch_target():
    targets = [rp.PATCH_NODE_INIT, rp.PATCH_TENSOR_TRANSPORT, rp.PATCH_CLASS_METHOD_BIND,
               rp.PATCH_COLLECTIVE_BIND]

    def current():
        return [rp.patch_original(t, importlib.import_module(t.module))[1] for t in targets]

    before = current()
    with record_ray_bind_sites():
        inside = current()
    assert current() == before
    assert all(a is not b for a, b in zip(inside, before, strict=True))
    assert {(t.module, t.owner, t.attr) for t in targets} <= {
        (u.module, *u.name.rpartition(".")[::2]) for u in rp.PRIVATE_API if u.use is rp.Use.PATCH
    }


def test_a_missing_collective_internal_is_reported_once_collectives_are_loaded():
    # require() skips Ray's collective modules until something imports them (they import
    # torch); a graph with a collective has imported them, and then they are checked.
    ops = importlib.import_module("ray.experimental.collective.operations")
    ri_check._module_level_ok.cache_clear()
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.delattr(ops, "_bind")
            with pytest.raises(RayVersionError, match=r"collective\.operations\._bind"):
                rp.require()
    finally:
        ri_check._module_level_ok.cache_clear()
    rp.require()  # Ray restored: passes again
