"""``cgc.ray_compat``: Ray Compiled Graph programs run unchanged on cgc — Ray's
``experimental_compile`` arguments, refs that ``ray.get`` and ``await`` take, Ray's
exception types and semantics (fail-fast, raise at capacity, the buffered-results limit)."""

from __future__ import annotations

import asyncio
import copy
import os
import pickle
import shutil
import time

import pytest
import ray
from compat_actors import AppError, Counter
from compat_fixture import compat  # noqa: F401 - the module's autouse fixture
from ray.dag import InputNode, MultiOutputNode
from ray.exceptions import (
    ActorDiedError,
    RayCgraphCapacityExceeded,
    RayChannelError,
    RayChannelTimeoutError,
    RayTaskError,
)

import cgc.ray_compat
from cgc.ray_compat import CompiledDAG


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
    with pytest.raises(RayCgraphCapacityExceeded, match=(
            "The compiled graph can't have more than 2 in-flight executions, and you "
            "currently have 2 in-flight executions")):
        c.execute(0.0)
    assert ray.get(refs[0]) == 0.2
    more = c.execute(0.0)  # room again
    assert ray.get(refs[1]) == 0.2 and ray.get(more) == 0.0


def test_dropped_refs_do_not_count_as_in_flight(counter, compiled):
    # Issue 21: with capacity 2 Ray prints 3 here; a dropped ref's result is read and freed.
    with InputNode() as inp:
        dag = counter.echo.bind(inp)
    c = compiled(dag, _max_inflight_executions=2)
    assert ray.get(c.execute(0)) == 0
    c.execute(1)
    c.execute(2)
    assert ray.get(c.execute(3)) == 3
    assert c.graph.in_flight() == 0 and c.graph.buffered == 0


def test_result_buffer_accounting_as_rays(compiled):
    # What Ray's own tests read off a compiled graph: results held, refs dropped and
    # fetched per execution, all empty once nothing is held.
    a, b = Counter.remote(), Counter.remote()
    with InputNode() as inp:
        dag = MultiOutputNode([a.inc.bind(inp), b.inc.bind(inp)])
    c = compiled(dag)
    first = c.execute(1)
    assert (c._result_buffer, c._destructed_ref_idxs, c._got_ref_idxs) == ({}, {}, {})
    r0, r1 = c.execute(2)
    del r0
    assert c._destructed_ref_idxs == {1: {0}} and c._result_buffer == {}
    assert ray.get(r1) == 3
    assert c._result_buffer == {0: {0: 1, 1: 1}}  # execution 0 was read on the way
    assert ray.get(first) == [1, 1]
    assert (c._result_buffer, c._destructed_ref_idxs, c._got_ref_idxs) == ({}, {}, {})
    assert (c._execution_index, c._max_finished_execution_index) == (1, 1)


def test_a_get_frees_later_dropped_executions(counter, compiled):
    with InputNode() as inp:
        dag = counter.inc.bind(inp)
    c = compiled(dag, _max_inflight_executions=3)
    ref = c.execute(1)
    c.execute(1)  # dropped at once
    assert ray.get(ref) == 1
    # As Ray: the get read and freed the dropped execution behind it.
    assert (c._result_buffer, c._destructed_ref_idxs, c._got_ref_idxs) == ({}, {}, {})
    assert c.graph.in_flight() == 0


def test_ray_profiling_switch_keeps_rays_records_on_the_actors(monkeypatch, compiled):
    monkeypatch.setattr(ray.dag.constants, "RAY_CGRAPH_ENABLE_PROFILING", True)
    a, b = Counter.options(name="prof_a").remote(), Counter.options(name="prof_b").remote()
    try:
        with InputNode() as inp:
            y = b.inc.bind(inp)
            dag = MultiOutputNode([a.inc.bind(inp), b.inc.bind(y)])
        c = compiled(dag)
        assert ray.get(c.execute(1)) == [1, 2]
        # A task's record is appended after its last write, on the actor's loop thread,
        # so it can land after the driver has the value: read them once the loops
        # stopped, as Ray's own profiling test does.
        c.teardown()
        got = {"prof_a": ray.get(a.events.remote()), "prof_b": ray.get(b.events.remote())}
        # One READ, COMPUTE and WRITE per task and execution, as Ray records them.
        assert [e.operation for e in got["prof_a"]] == ["READ", "COMPUTE", "WRITE"]
        assert [e.operation for e in got["prof_b"]] == ["READ", "COMPUTE", "WRITE"] * 2
        for name, events in got.items():
            for e in events:
                assert (e.actor_classname, e.actor_name, e.method_name) == (
                    "Counter", name, "inc")
                assert e.start_t <= e.end_t
        assert [e.bind_index for e in got["prof_b"]] == [0, 0, 0, 1, 1, 1]
    finally:
        ray.kill(a)
        ray.kill(b)


def test_rays_torch_and_nvtx_switches_are_cgcs_run_options(monkeypatch, counter, compiled):
    from ray.dag import constants

    from cgc.ray_compat.compiled import _profiling

    assert _profiling() == {}
    monkeypatch.setattr(constants, "RAY_CGRAPH_ENABLE_TORCH_PROFILING", True)
    assert _profiling() == {"torch_profile": "compiled_graph_torch_profiles"}  # Ray's folder
    with InputNode() as inp:
        dag = counter.echo.bind(inp)
    c = compiled(dag)
    assert c.graph.config.torch_profile == "compiled_graph_torch_profiles"
    assert ray.get(c.execute(1)) == 1
    c.teardown()  # the actor's loop writes its torch trace as it stops
    cwd = ray.get(counter.__ray_call__.remote(lambda self: os.getcwd()))
    folder = os.path.join(cwd, "compiled_graph_torch_profiles")  # where Ray writes its own
    try:
        assert [f for f in os.listdir(folder) if f.startswith("ray_dag-")]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    monkeypatch.setattr(constants, "RAY_CGRAPH_ENABLE_NVTX_PROFILING", True)
    with InputNode() as inp:
        dag = counter.echo.bind(inp)
    with pytest.raises(ValueError, match="cannot be combined"):  # as Ray refuses both
        dag.experimental_compile()
    monkeypatch.setattr(constants, "RAY_CGRAPH_ENABLE_TORCH_PROFILING", False)
    assert _profiling() == {"nvtx": True}


def test_max_buffered_results_holds_on_get(counter, compiled):
    with InputNode() as inp:
        dag = counter.inc.bind(inp)
    c = compiled(dag, _max_buffered_results=1)
    first, second = c.execute(1), c.execute(1)
    with pytest.raises(RayCgraphCapacityExceeded, match=(
            "The compiled graph can't have more than 1 buffered results, and you currently "
            "have 1 buffered results")):
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
    with pytest.raises(ValueError, match="^Use execute_async if enable_asyncio=True$"):
        c.execute(1)

    async def main():
        fut = await c.execute_async(1)
        assert await fut == 1
        fut = await c.execute_async("x")
        with pytest.raises(TypeError) as info:
            await fut
        assert isinstance(info.value, RayTaskError)
        with pytest.raises(ValueError, match="can only be awaited upon once"):
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
    with pytest.raises(ValueError, match=r"^ray.get\(\) can only be called once on a "
                       "CompiledDAGRef, and it was already called.$"):
        ray.get(ref)
    # Ray's own words for a ref in ray.wait, which name Ray's class.
    with pytest.raises(TypeError, match="got <class 'ray.experimental.compiled_dag_ref"
                       ".CompiledDAGRef'>"):
        ray.wait(c.execute(2))
    ref = c.execute(3)  # execution 2
    assert str(ref) == f"CompiledDAGRef({c.get_id()}, execution_index=2, channel_index=None)"
    assert ray.get(ref) == 3


def test_compile_errors_are_rays_types(counter):
    with InputNode() as inp:
        dag = counter.echo.bind(inp)
    c = dag.experimental_compile()
    c.teardown()
    with pytest.raises(ValueError, match="It is not allowed to call `experimental_compile` "
                       "on the same DAG object multiple times"):
        dag.experimental_compile()  # a DAG compiles once, as in Ray

    @ray.remote
    def f(x):
        return x

    with InputNode() as inp:
        fdag = f.bind(inp)
    with pytest.raises(NotImplementedError,
                       match="^Compiled DAGs currently only support actor method nodes$"):
        fdag.experimental_compile()

    with InputNode() as inp:
        dag = counter.add.bind(inp[0], inp[1])
    c = dag.experimental_compile()
    try:
        with pytest.raises(ValueError, match="^dag.execute\\(\\) or dag.execute_async\\(\\) "
                           "must be called with 2 positional args, got 1$"):
            c.execute(1)  # Ray's ValueError for a wrong input count
        assert ray.get(c.execute(1, 2)) == 3
    finally:
        c.teardown()


@pytest.mark.parametrize("build,error,words", [
    # (how the DAG is built, Ray's exception, the start of Ray 2.60's message)
    (lambda c, inp: c.add.bind(inp, y=inp), ValueError,
     "Compiled DAG currently does not support binding to other DAG nodes as kwargs"),
    (lambda c, inp: MultiOutputNode([c.echo.bind(inp), c.inc.bind(1)]), ValueError,
     "Compiled DAGs require each task to take a ray.dag.InputNode or at least one other "
     "DAGNode as an input"),
    (lambda c, inp: (c.inc.bind(inp), c.echo.bind(inp))[1], ValueError,
     "Compiled DAG doesn't support leaf nodes, i.e., nodes that don't have downstream nodes "
     "and are not output nodes. There are 1 leaf nodes in the DAG. Please add the outputs "
     "of ['inc'] to the the MultiOutputNode."),
    (lambda c, inp: c.add.bind(inp, inp[1]), ValueError,
     "All tasks must either use InputNode() directly, or they must index to specific args "
     "or kwargs."),
    (lambda c, inp: (inp[1], c.echo.bind(inp[0]))[1], ValueError,
     "Compiled Graph expects input to be accessed using all of attributes 0, 1, but 1 is "
     "unused."),
    (lambda c, inp: c.echo.bind([inp]), ValueError, "Found 1 DAGNodes from the arg"),
])
def test_rays_checks_in_rays_words(counter, build, error, words):
    import re

    with InputNode() as inp:
        dag = build(counter, inp)
    with pytest.raises(error, match="^" + re.escape(words)):
        dag.experimental_compile()


def test_rays_checks_for_a_dag_without_input(counter):
    with pytest.raises(ValueError, match="^No InputNode found in the DAG: when traversing "
                       "upwards, no upstream node was found for"):
        counter.inc.bind(1).experimental_compile()


def test_what_only_cgc_checks_keeps_cgcs_words_and_the_bind_line():
    # An actor cgc creates (Actor.bind(), which Ray refuses) with constructor arguments that
    # do not fit: only cgc checks that, in its own words, naming the .bind() line.
    first = test_what_only_cgc_checks_keeps_cgcs_words_and_the_bind_line.__code__.co_firstlineno
    actor = Counter.bind(1, 2, 3)
    with InputNode() as inp:
        dag = actor.echo.bind(inp)
    with pytest.raises(ValueError, match=rf"test_ray_compat\.py:{first + 4}\b.*Counter.__init__"):
        dag.experimental_compile()


def test_visualize(counter, compiled, tmp_path):
    with InputNode() as inp:
        dag = counter.inc.bind(inp)
    c = compiled(dag)
    text = c.visualize(format="ascii")
    # Ray's listing: its task numbers (0 the input, 2 the MultiOutputNode Ray adds)...
    assert '0 [label="Task 0  InputNode"]' in text and "Method: inc" in text
    assert "0 ---> 1\n1 ---> 2\n" in text
    assert "existing actor" in text  # ... then cgc's view of the plan
    dot = c.visualize(filename=str(tmp_path / "g"), format="dot")
    assert dot.startswith("digraph compiled_graph") and (tmp_path / "g.dot").is_file()
    assert "\t0 -> 1\n" in dot and "\t1 -> 2\n" in dot
    with pytest.raises(ValueError, match="not compatible with 'ascii' format"):
        c.visualize(format="ascii", channel_details=True)


def test_accelerator_edge_read_only_on_its_own_actor_is_rays_assertion(counter):
    from ray.experimental.channel.cpu_communicator import CPUCommunicator

    with InputNode() as inp:
        x = counter.echo.bind(inp).with_tensor_transport(
            transport=CPUCommunicator(1, [counter]))
        dag = MultiOutputNode([counter.echo.bind(x)])
    with pytest.raises(AssertionError, match="^All readers are from the same actor. The "
                       "TorchTensorType type hint is not needed. No accelerator channel "
                       "will be created.$"):
        dag.experimental_compile()


def test_local_readers_of_an_accelerator_edge_run_as_in_ray(compiled):
    """Ray 2.60 hands the value to readers on the writer's own actor in-process and sends it
    to the others: such a graph is no deadlock and runs."""
    from ray.experimental.channel.cpu_communicator import CPUCommunicator

    a, b = Counter.remote(), Counter.remote()
    with InputNode() as inp:
        x = a.echo.bind(inp).with_tensor_transport(transport=CPUCommunicator(2, [a, b]))
        dag = MultiOutputNode([a.echo.bind(x), a.add.bind(x, 1), b.add.bind(x, 2)])
    c = compiled(dag)
    for i in range(3):
        assert ray.get(c.execute(i)) == [i, i + 1, i + 2]


def test_accelerator_edge_to_the_driver_in_rays_words(counter):
    with InputNode() as inp:
        dag = counter.echo.bind(inp).with_tensor_transport(transport="nccl")
    with pytest.raises(ValueError, match=r"^Driver cannot participate in the communicator "
                       r"group\.$"):
        dag.experimental_compile()
    with InputNode() as inp:
        x = counter.echo.bind(inp).with_tensor_transport(transport="nccl")
        dag = MultiOutputNode([counter.echo.bind(inp), x])
    with pytest.raises(ValueError, match="^Driver cannot participate"):
        dag.experimental_compile()


def test_nccl_edge_of_an_actor_without_accelerator_in_rays_words():
    a, b = Counter.remote(), Counter.remote()
    with InputNode() as inp:
        x = a.echo.bind(inp).with_tensor_transport(transport="nccl", _direct_return=True,
                                                    _static_shape=True)
        dag = b.echo.bind(x)
    with pytest.raises(ValueError, match=(
            r"^Actor Actor\(Counter, [0-9a-f]+\) returns a tensor with type hint "
            r'TorchTensor\(transport="accelerator"\) or '
            r"TorchTensor\(transport=accelerator_group_handle\) "
            r"but actor does not have an accelerator assigned by Ray\.$")):
        dag.experimental_compile()


def test_a_communicator_must_hold_the_edges_actors(compiled):
    from ray.experimental.channel.cpu_communicator import CPUCommunicator

    a, b = Counter.remote(), Counter.remote()
    with InputNode() as inp:
        x = a.echo.bind(inp).with_tensor_transport(transport=CPUCommunicator(1, [a]))
        dag = b.echo.bind(x)
    with pytest.raises(ValueError, match="^The passed-in communicator must include all of "
                       "the actors used in the P2P operation"):
        dag.experimental_compile()
    with InputNode() as inp:
        x = a.echo.bind(inp).with_tensor_transport(transport=CPUCommunicator(2, [a, b]))
        dag = b.echo.bind(x)
    c = compiled(dag)  # host memory between the two, as the CPU communicator would
    assert ray.get(c.execute(7)) == 7


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


def test_default_communicator_values_as_rays(counter, compiled):
    with InputNode() as inp:
        dag = counter.echo.bind(inp)
    with pytest.raises(ValueError, match="^The default_communicator must be None, a string, "
                       "or a Communicator, got <class 'object'>$"):
        dag.experimental_compile(_default_communicator=object())  # Ray's check, Ray's words
    with InputNode() as inp:
        dag = counter.echo.bind(inp)
    with pytest.raises(ValueError, match="^The only allowed string for default_communicator "
                       "is 'create', got nccl$"):
        dag.experimental_compile(_default_communicator="nccl")
    from ray.experimental.channel.cpu_communicator import CPUCommunicator

    # A Communicator object is taken (cgc binds its own communicator among its actors).
    with InputNode() as inp:
        dag = counter.echo.bind(inp)
    c = compiled(dag, _default_communicator=CPUCommunicator(1, [counter]))
    assert ray.get(c.execute(4)) == 4


def test_auto_transport_hint_is_resolved_on_rays_node_after_compile(compiled):
    from ray.experimental.channel.torch_tensor_type import TorchTensorType

    a, b = Counter.remote(), Counter.remote()
    with InputNode() as inp:
        x = a.echo.bind(inp).with_tensor_transport(transport="auto", device="cpu")
        dag = b.echo.bind(x)
    c = compiled(dag)
    # Ray's resolver: actors without GPUs share tensors through host memory.
    assert isinstance(x.type_hint, TorchTensorType)
    assert x.type_hint.transport == "auto" and not x.type_hint.requires_accelerator()
    assert ray.get(c.execute(5)) == 5


def test_rays_allgather_returns_the_members_tensors_concatenated(compiled):
    """Ray's allgather gives each member one tensor, the members' concatenated along dim 0
    (cgc.allgather gives the list); the CPU communicator stands for NCCL."""
    import torch
    from ray.experimental.channel.cpu_communicator import CPUCommunicator
    from ray.experimental.collective import allgather

    a, b = Counter.remote(), Counter.remote()
    with InputNode() as inp:
        xa, xb = a.add.bind(inp, 0), b.add.bind(inp, 10)
        ga, gb = allgather.bind([xa, xb], transport=CPUCommunicator(2, [a, b]))
        dag = MultiOutputNode([a.echo.bind(ga), b.echo.bind(gb)])
    c = compiled(dag)
    t = torch.arange(3.0).reshape(3, 1)
    got = ray.get(c.execute(t), timeout=120)  # the actors' first torch import is slow
    want = torch.cat([t, t + 10], dim=0)
    assert [g.shape for g in got] == [(6, 1), (6, 1)]
    assert all(torch.equal(g, want) for g in got)


@pytest.mark.parametrize("flags", [{"_direct_return": True}, {"_static_shape": True}, {}])
def test_app_error_on_a_cpu_communicator_edge_leaves_the_graph_usable_as_in_ray(
        compiled, flags):
    """Ray 2.60's CPU communicator carries a task's error even on a static-shape or
    direct-return edge (checked on Ray itself): the graph goes on. (An NCCL edge breaks:
    test_compat_gpu_actors.py, with logical GPUs.)"""
    import torch
    from ray.experimental.channel.cpu_communicator import CPUCommunicator

    a, b = Counter.remote(), Counter.remote()
    with InputNode() as inp:
        x = a.check.bind(inp).with_tensor_transport(transport=CPUCommunicator(2, [a, b]),
                                                    **flags)
        dag = b.echo.bind(x)
    c = compiled(dag)
    assert ray.get(c.execute(torch.tensor([1.0])), timeout=120) == torch.tensor([1.0])
    with pytest.raises(RayTaskError) as info:
        ray.get(c.execute(torch.tensor([-1.0])), timeout=60)
    assert isinstance(info.value, AppError)
    assert ray.get(c.execute(torch.tensor([2.0])), timeout=60) == torch.tensor([2.0])


def _plus_one_communicator() -> type:
    """A user's Communicator, as Ray's custom-communicator tests write one: Ray's CPU
    communicator whose allreduce adds 1 (cgc's own communicator would not)."""
    from ray.experimental.channel.cpu_communicator import CPUCommunicator

    class PlusOneCommunicator(CPUCommunicator):
        def allreduce(self, send_buf, recv_buf, op=None):  # type: ignore[no-untyped-def]
            super().allreduce(send_buf, recv_buf, op)
            recv_buf += 1

    return PlusOneCommunicator


def test_a_users_communicator_on_a_collective_is_refused_naming_it():
    """cgc cannot run a user's Communicator class: refused, never replaced by cgc's own
    (which would silently drop the user's +1)."""
    from ray.experimental.collective import allreduce

    comm_cls = _plus_one_communicator()
    a, b = Counter.remote(), Counter.remote()
    with InputNode() as inp:
        xs = [a.add.bind(inp, 0), b.add.bind(inp, 1)]
        ra, rb = allreduce.bind(xs, transport=comm_cls(2, [a, b]))
        dag = MultiOutputNode([a.echo.bind(ra), b.echo.bind(rb)])
    with pytest.raises(cgc.ray_compat.CustomCommunicatorError,
                       match=r"^DAG node the collective allreduce\.ReduceOp\.SUM \(bound at "
                       r"test_ray_compat\.py:[0-9]+\) uses a communicator of class "
                       r".*PlusOneCommunicator \(passed as its transport\)"):
        dag.experimental_compile()
    assert issubclass(cgc.ray_compat.CustomCommunicatorError, ValueError)


def test_a_users_communicator_on_an_edge_is_refused_after_rays_checks():
    comm_cls = _plus_one_communicator()
    a, b = Counter.remote(), Counter.remote()
    with InputNode() as inp:  # Ray's own check of the object comes first, in Ray's words
        x = a.echo.bind(inp).with_tensor_transport(transport=comm_cls(1, [a]))
        dag = b.echo.bind(x)
    with pytest.raises(ValueError, match="^The passed-in communicator must include all of "
                       "the actors used in the P2P operation"):
        dag.experimental_compile()
    with InputNode() as inp:
        x = a.echo.bind(inp).with_tensor_transport(transport=comm_cls(2, [a, b]))
        dag = b.echo.bind(x)
    with pytest.raises(cgc.ray_compat.CustomCommunicatorError,
                       match=r"^DAG node Counter\.echo \(bound at test_ray_compat\.py:[0-9]+\) "
                       r"uses a communicator of class .*PlusOneCommunicator"):
        dag.experimental_compile()


def test_a_users_default_communicator_is_refused_where_an_edge_uses_it(compiled):
    comm_cls = _plus_one_communicator()
    a, b = Counter.remote(), Counter.remote()
    with InputNode() as inp:
        x = a.echo.bind(inp).with_tensor_transport(transport="nccl")
        dag = b.echo.bind(x)
    with pytest.raises(cgc.ray_compat.CustomCommunicatorError,
                       match=r"PlusOneCommunicator \(passed as _default_communicator\)"):
        dag.experimental_compile(_default_communicator=comm_cls(2, [a, b]))
    with InputNode() as inp:  # no edge uses the default: nothing to refuse (Ray uses none)
        dag = a.echo.bind(inp)
    c = compiled(dag, _default_communicator=comm_cls(2, [a, b]))
    assert ray.get(c.execute(3)) == 3


def test_a_gpu_device_hint_towards_an_actor_without_gpu_fails_when_run_as_in_ray(compiled):
    """Ray 2.60 compiles ``device="gpu"`` towards a reader without a GPU; the reader's move
    of the tensor to the GPU fails when the graph runs (a task error in torch's words: "No
    CUDA GPUs are available" on a GPU host, "Torch not compiled with CUDA enabled" on a
    CPU-only torch). cgc's own API refuses it at compile time (tests/passes)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("the reader must lack CUDA")
    a, b = Counter.remote(), Counter.remote()
    with InputNode() as inp:
        x = a.echo.bind(inp).with_tensor_transport(device="gpu")
        dag = b.echo.bind(x)
    c = compiled(dag)  # compiled, as Ray compiles it
    for _ in range(2):  # each execution fails in the reader, as each does on Ray
        with pytest.raises(RayTaskError, match="No CUDA GPUs are available|Torch not "
                           "compiled with CUDA enabled"):
            ray.get(c.execute(torch.ones(2)), timeout=120)
    assert ray.get(c.execute(3), timeout=60) == 3  # no tensor: nothing to move
