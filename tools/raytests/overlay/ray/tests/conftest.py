"""Minimal stand-in for ray/tests/conftest.py (not shipped in the wheel).
Only the fixtures the compiled-graph tests use; written for a 2-core box."""
import os
from contextlib import contextmanager

import pytest
import ray
from ray._common.test_utils import wait_for_condition  # noqa: F401 (re-exported)
from ray.cluster_utils import Cluster

NUM_CPUS = int(os.environ.get("RAYTESTS_NUM_CPUS", "4"))   # logical CPUs; actors need num_cpus=1 by default for creation only

def _default_kwargs():
    return dict(num_cpus=NUM_CPUS, object_store_memory=150 * 1024 * 1024,
                include_dashboard=False, namespace="default_test_namespace",
                _system_config={"object_timeout_milliseconds": 200})

@contextmanager
def _ray_start(**kw):
    init = _default_kwargs()
    init.update(kw)
    info = ray.init("local", **init)
    try:
        yield info
    finally:
        ray.shutdown()

@pytest.fixture
def shutdown_only():
    yield None
    ray.shutdown()

@pytest.fixture
def ray_start_regular(request):
    with _ray_start(**getattr(request, "param", {})) as res:
        yield res

@pytest.fixture(scope="module")
def ray_start_regular_shared(request):
    with _ray_start(**getattr(request, "param", {})) as res:
        yield res

@contextmanager
def _ray_start_cluster(**kw):
    num_nodes = kw.pop("num_nodes", 0)
    do_init = kw.pop("do_init", num_nodes > 0)
    node_kw = {"num_cpus": kw.pop("num_cpus", 1), **kw}
    cluster = Cluster()
    for i in range(num_nodes):
        cluster.add_node(**node_kw)
        if i == 0 and do_init:
            ray.init(address=cluster.address, namespace="default_test_namespace")
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()

@pytest.fixture
def ray_start_cluster(request):
    with _ray_start_cluster(**getattr(request, "param", {})) as c:
        yield c
