"""``cgc.ray_compat``: Ray Compiled Graph programs run unchanged on cgc — Ray's
``experimental_compile`` arguments, refs that ``ray.get`` and ``await`` take, Ray's
exception types and semantics (fail-fast, raise at capacity, the buffered-results limit)."""

from __future__ import annotations

import asyncio
import copy
import pickle
import time

import pytest

ray = pytest.importorskip("ray")

import compat_actors  # noqa: E402
from compat_actors import AppError, Counter  # noqa: E402
from ray.dag import InputNode, MultiOutputNode  # noqa: E402
from ray.exceptions import (  # noqa: E402
    ActorDiedError,
    RayCgraphCapacityExceeded,
    RayChannelError,
    RayChannelTimeoutError,
    RayTaskError,
)

import cgc.ray_compat  # noqa: E402
from cgc.ray_compat import CompiledDAG  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def compat(ray_cluster):
    # Ray's workers cannot import this test folder: ship its classes by value.
    ray.cloudpickle.register_pickle_by_value(compat_actors)
    cgc.ray_compat.install()
    yield
    cgc.ray_compat.uninstall()
    ray.cloudpickle.unregister_pickle_by_value(compat_actors)


@pytest.fixture
def counter():
    h = Counter.remote()
    yield h
    ray.kill(h)


@pytest.fixture
def compiled():
    """``compiled(dag, **kw)``: ``dag.experimental_compile(**kw)``, torn down after the test."""
    made: list[CompiledDAG] = []

    def compile_dag(dag, **kw) -> CompiledDAG:
        c = dag.experimental_compile(**kw)
        made.append(c)
        return c

    yield compile_dag
    for c in made:
        c.teardown()


def test_experimental_compile_returns_a_cgc_graph_that_ray_get_reads(counter, compiled):
    with InputNode() as inp:
        dag = counter.inc.bind(inp)
    c = compiled(dag)
    assert isinstance(c, CompiledDAG)
    assert ray.get(c.execute(2)) == 2
    refs = [c.execute(1) for _ in range(3)]
    assert ray.get(refs) == [3, 4, 5]  # a list of refs, as Ray takes it
    assert c.get_id() == c.graph.gid


def test_multi_output_refs_and_ray_get_of_the_list(compiled):
    a, b = Counter.remote(), Counter.remote(10)
    with InputNode() as inp:
        dag = MultiOutputNode([a.inc.bind(inp), b.inc.bind(inp)])
    c = compiled(dag)
    refs = c.execute(1)
    assert ray.get(refs[1]) == 11 and ray.get(refs[0]) == 1
    assert ray.get(c.execute(2)) == [3, 13]


def test_app_exception_is_a_ray_task_error_of_the_app_class_with_its_traceback(
        counter, compiled):
    with InputNode() as inp:
        dag = counter.inc.bind(inp)
    c = compiled(dag)
    with pytest.raises(TypeError) as info:
        ray.get(c.execute("x"))
    assert isinstance(info.value, RayTaskError)
    assert "self.i += x" in str(info.value)  # the remote traceback, as Ray shows it
    assert ray.get(c.execute(1)) == 1  # the graph goes on


def test_own_exception_class_is_kept(counter, compiled):
    with InputNode() as inp:
        dag = counter.check.bind(inp)
    c = compiled(dag)
    with pytest.raises(AppError, match="negative input -3"):
        ray.get(c.execute(-3))


def test_fail_fast_a_failing_output_fails_its_slow_sibling_at_once(compiled):
    a, b = Counter.remote(), Counter.remote()
    with InputNode() as inp:
        dag = MultiOutputNode([a.sleep.bind(inp[1]), b.check.bind(inp[0])])
    c = compiled(dag)
    slow, bad = c.execute(-1, 30.0)
    # The slow output sleeps 30 s, beyond the 20 s timeout: waiting on it would raise a
    # timeout error instead. Ray raises the execution's error for every output.
    with pytest.raises(AppError):
        ray.get(slow, timeout=20)
    with pytest.raises(AppError):
        ray.get(bad)


def test_multi_return_method_raising_fails_both_outputs(counter, compiled):
    with InputNode() as inp:
        x, y = counter.two_but_raise.bind(inp)
        dag = MultiOutputNode([x, y])
    c = compiled(dag)
    for _ in range(2):
        x, y = c.execute(1)
        with pytest.raises(RuntimeError):
            ray.get(x)
        with pytest.raises(RuntimeError):
            ray.get(y)


def test_max_inflight_executions_raises_capacity_exceeded(counter, compiled):
    with InputNode() as inp:
        dag = counter.sleep.bind(inp)
    c = compiled(dag, _max_inflight_executions=2)
    refs = [c.execute(0.2), c.execute(0.2)]
    with pytest.raises(RayCgraphCapacityExceeded, match="capacity is 2"):
        c.execute(0.0)
    assert ray.get(refs[0]) == 0.2
    more = c.execute(0.0)  # room again
    assert ray.get(refs[1]) == 0.2 and ray.get(more) == 0.0


def test_max_buffered_results_holds_on_get(counter, compiled):
    with InputNode() as inp:
        dag = counter.inc.bind(inp)
    c = compiled(dag, _max_buffered_results=1)
    first, second = c.execute(1), c.execute(1)
    with pytest.raises(RayCgraphCapacityExceeded, match="max_buffered_results=1"):
        ray.get(second)
    assert ray.get(first) == 1 and ray.get(second) == 2


def test_get_timeout_is_a_channel_timeout(counter, compiled):
    with InputNode() as inp:
        dag = counter.sleep.bind(inp)
    c = compiled(dag)
    ref = c.execute(2.0)
    t0 = time.monotonic()
    with pytest.raises(RayChannelTimeoutError):
        ray.get(ref, timeout=0.5)
    assert time.monotonic() - t0 > 0.4  # it waited its timeout, not less
    assert issubclass(RayChannelTimeoutError, TimeoutError)
    assert ray.get(ref, timeout=10) == 2.0  # nothing was lost: fetch it again


def test_teardown_closes_the_channels_and_keeps_live_actors(counter):
    with InputNode() as inp:
        dag = counter.sleep.bind(inp)
    c = dag.experimental_compile()
    ref = c.execute(0.5)
    c.teardown()
    c.teardown()  # idempotent
    assert c.is_teardown
    with pytest.raises(RayChannelError, match="Channel closed"):
        ray.get(ref)
    with pytest.raises(RayChannelError, match="Channel closed"):
        c.execute(1)
    assert ray.get(counter.echo.remote("alive")) == "alive"
    with InputNode() as inp:  # the actor can join a new graph
        dag2 = counter.echo.bind(inp)
    c2 = dag2.experimental_compile()
    assert ray.get(c2.execute(7)) == 7
    c2.teardown()


def test_an_actor_that_dies_gives_actor_died_error():
    h = Counter.remote()
    with InputNode() as inp:
        dag = h.die.bind(inp)
    c = dag.experimental_compile()
    try:
        assert ray.get(c.execute(1)) == 1
        with pytest.raises(ActorDiedError):
            ray.get(c.execute("die"), timeout=30)
    finally:
        c.teardown()


def test_execute_async_and_await(counter, compiled):
    with InputNode() as inp:
        dag = counter.inc.bind(inp)
    c = compiled(dag, enable_asyncio=True)
    with pytest.raises(ValueError, match="execute_async"):
        c.execute(1)

    async def main():
        fut = await c.execute_async(1)
        assert await fut == 1
        fut = await c.execute_async("x")
        with pytest.raises(TypeError) as info:
            await fut
        assert isinstance(info.value, RayTaskError)
        with pytest.raises(ValueError, match="already awaited"):
            await fut
        return await (await c.execute_async(2))

    assert asyncio.run(main()) == 3


def test_refs_refuse_what_ray_refuses(counter, compiled):
    with InputNode() as inp:
        dag = counter.echo.bind(inp)
    c = compiled(dag)
    ref = c.execute(1)
    with pytest.raises(ValueError, match="cannot be copied"):
        copy.copy(ref)
    with pytest.raises(ValueError, match="cannot be pickled"):
        pickle.dumps(ref)
    with pytest.raises(TypeError, match="cannot be used as Ray task/actor argument"):
        counter.echo.remote(ref)
    with pytest.raises(TypeError, match="cannot be serialized"):
        ray.put([ref])
    assert ray.get(ref) == 1
    with pytest.raises(ValueError, match="already called"):
        ray.get(ref)


def test_compile_errors_are_rays_types(counter):
    with InputNode() as inp:
        dag = counter.echo.bind(inp)
    c = dag.experimental_compile()
    c.teardown()
    with pytest.raises(ValueError, match="already called"):
        dag.experimental_compile()  # a DAG compiles once, as in Ray

    @ray.remote
    def f(x):
        return x

    with InputNode() as inp:
        fdag = f.bind(inp)
    with pytest.raises(NotImplementedError, match="FunctionNode"):
        fdag.experimental_compile()

    with InputNode() as inp:
        dag = counter.add.bind(inp[0], inp[1])
    c = dag.experimental_compile()
    try:
        with pytest.raises(ValueError, match="positional"):
            c.execute(1)  # Ray: a ValueError for a wrong input count
        assert ray.get(c.execute(1, 2)) == 3
    finally:
        c.teardown()


def test_compile_errors_point_at_the_bind_line(counter):
    with InputNode() as inp:
        x = counter.echo.bind(inp)
        counter.inc.bind(x)  # reaches no output
        dag = counter.add.bind(x, 1)
    line = dag_line = test_compile_errors_point_at_the_bind_line.__code__.co_firstlineno + 3
    with pytest.raises(ValueError, match=rf"test_ray_compat\.py:{line}\b.*reaches no output"):
        dag.experimental_compile()
    assert dag_line


def test_visualize(counter, compiled, tmp_path):
    with InputNode() as inp:
        dag = counter.inc.bind(inp)
    c = compiled(dag)
    text = c.visualize(format="ascii")
    assert "inc" in text and "existing actor" in text
    dot = c.visualize(filename=str(tmp_path / "g"), format="dot")
    assert dot.startswith("digraph") and (tmp_path / "g.dot").is_file()


def test_uninstall_gives_ray_its_method_back():
    from ray.dag.dag_node import DAGNode

    patched = DAGNode.experimental_compile
    cgc.ray_compat.uninstall()
    try:
        assert not cgc.ray_compat.installed()
        assert DAGNode.experimental_compile is not patched
        assert DAGNode.experimental_compile.__module__ == "ray.dag.dag_node"
    finally:
        cgc.ray_compat.install()
    assert DAGNode.experimental_compile is patched


def test_a_communicator_object_is_refused_before_anything_starts(counter):
    with InputNode() as inp:
        dag = counter.echo.bind(inp)
    with pytest.raises(NotImplementedError, match="cgc binds its own communicators"):
        dag.experimental_compile(_default_communicator=object())
