"""Live actors through ``cgc.ray_compat`` keep what they hold, and Ray's hints keep Ray's
meaning where a plan cannot hold them: on the test session's cluster (no GPUs), so every
live actor here holds none.

The programs with live GPU actors (logical GPUs) are in ``test_compat_gpu_actors.py``.
"""

from __future__ import annotations

import inspect
import time

import pytest
import ray
from compat_actors import Counter
from compat_fixture import compat  # noqa: F401 - the module's autouse fixture
from ray.dag import InputNode


@pytest.fixture
def pair():
    hs = [Counter.remote(), Counter.remote()]
    yield hs
    for h in hs:
        ray.kill(h)


def _line() -> int:
    frame = inspect.currentframe()
    assert frame is not None and frame.f_back is not None
    return frame.f_back.f_lineno


def test_what_a_live_actor_holds_is_in_the_plan(pair):
    a, b = pair
    with InputNode() as inp:
        dag = b.echo.bind(a.echo.bind(inp))
    c = dag.experimental_compile()
    try:
        assert ray.get(c.execute(3)) == 3
        node = ray.get(a.__ray_call__.remote(
            lambda self: ray.get_runtime_context().get_node_id()))
        for actor in c.plan.proto.graph.actors:
            held = actor.external.placement
            assert held.observed and held.node_id == node and list(held.gpu_ids) == []
    finally:
        c.teardown()


def test_nccl_edge_from_a_live_actor_without_gpu_names_the_actor_and_line(pair):
    """The drop-in raises Ray 2.60's own ValueError (issue 48 item 7); cgc's own API names
    the actor, the line and the remedy."""
    import cgc
    from cgc.errors import CompileError

    a, b = pair
    with InputNode() as inp:
        x = a.echo.bind(inp).with_tensor_transport("nccl"); line = _line()  # noqa: E702
        dag = b.echo.bind(x)
    with pytest.raises(ValueError, match="does not have an accelerator assigned by Ray"):
        dag.experimental_compile()
    with pytest.raises(CompileError) as info:
        cgc.compile(dag)
    msg = str(info.value)
    assert "nccl transport hint, but actor 'counter0' has no GPU" in msg
    assert "a live actor holding" in msg and "no GPU" in msg
    assert f"test_compat_live_placement.py:{line}" in msg
    assert "Cls.options(num_gpus=1).remote()" in msg


def test_device_gpu_hint_to_a_live_actor_without_gpu_is_refused_by_cgcs_own_api(pair):
    """cgc's own API refuses it at compile time; the drop-in compiles it as Ray 2.60 does
    (test_ray_compat.py: ..._fails_when_run_as_in_ray)."""
    import cgc
    from cgc.errors import CompileError

    a, b = pair
    with InputNode() as inp:
        dag = b.echo.bind(a.echo.bind(inp).with_tensor_transport(device="gpu"))
    with pytest.raises(CompileError, match="device=gpu hint, but reader 'counter1' has no GPU"):
        cgc.compile(dag)


def test_a_dead_live_actor_is_named_at_compile_time():
    h = Counter.remote()
    assert ray.get(h.echo.remote(1)) == 1
    ray.kill(h)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # killing is asynchronous
        try:
            ray.get(h.echo.remote(1), timeout=5)
        except Exception:  # noqa: BLE001 - dead now
            break
    with InputNode() as inp:
        dag = h.echo.bind(inp)
    with pytest.raises(ValueError, match=r"live actor Counter \(id [0-9a-f]+\) cannot be used"):
        dag.experimental_compile()


@pytest.mark.parametrize("transport", ["shm", "auto"])
def test_direct_return_on_host_memory_has_no_effect_as_in_ray(pair, transport):
    """Ray gives ``_direct_return`` and ``_static_shape`` effect only on a device
    transport: a dict on a host-memory edge hinted so arrives as it was returned."""
    a, b = pair
    with InputNode() as inp:
        x = a.echo.bind(inp).with_tensor_transport(transport, _direct_return=True,
                                                   _static_shape=True)
        dag = b.echo.bind(x)
    c = dag.experimental_compile()
    try:
        assert ray.get(c.execute({"k": [1, 2]})) == {"k": [1, 2]}
        assert not any(ch.direct_return or ch.static_shape
                       for ch in c.plan.proto.lowered.channels)
    finally:
        c.teardown()
