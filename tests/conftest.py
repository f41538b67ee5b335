"""Shared fixtures. Tests share one local Ray cluster per session (2 cores: keep actors few)."""

from __future__ import annotations

import importlib.util
import os
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

# Logical CPUs for the shared test cluster: actors reserve CPUs, the machine has 2 cores.
TEST_CLUSTER_CPUS = 16
ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config):
    """Every Ray cluster of this run (its processes, pytest-xdist workers and subprocesses
    alike) keeps its session in one temporary folder; at exit, Ray CG's named semaphores
    of those clusters go with it (tools/bench/ray_leftovers.py)."""
    spec = importlib.util.spec_from_file_location(
        "ray_leftovers", ROOT / "tools" / "bench" / "ray_leftovers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.install()


@pytest.fixture(scope="session", autouse=True)
def cgc_config_dir(tmp_path_factory):
    """The tests' cgc config folder (signing key, trusted keys): never the real home's.

    Set in the environment, so CLI subprocesses use it too.
    """
    path = tmp_path_factory.mktemp("cgc-config")
    old = os.environ.get("CGC_CONFIG_DIR")
    os.environ["CGC_CONFIG_DIR"] = str(path)
    yield path
    if old is None:
        os.environ.pop("CGC_CONFIG_DIR", None)
    else:
        os.environ["CGC_CONFIG_DIR"] = old


@pytest.fixture
def prefix():
    """A unique shared-memory name prefix; the test fails if segments are left under it."""
    from cgc.runtime.channels import cleanup_segments, list_segments

    p = f"cgc-test-{os.getpid()}-{uuid.uuid4().hex[:8]}-"
    yield p
    left = list_segments(p)
    cleanup_segments(p)
    assert left == [], f"leaked segments: {left}"


@pytest.fixture(scope="session")
def ray_cluster():
    """Start (or join) the session's local Ray cluster and return its address info."""
    import ray

    if not ray.is_initialized():
        os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
        info = ray.init(
            # "local": a cluster of this session's own, never whatever another process on
            # the machine started last (plain ray.init() would join that one)
            address="local",
            num_cpus=TEST_CLUSTER_CPUS,
            include_dashboard=False,
            log_to_driver=True,
            configure_logging=False,
        )
    else:
        info = None
    yield info
    ray.shutdown()


@pytest.fixture
def require_tool() -> Callable[[str], None]:
    """``require_tool("mypy")``: a test tool from the ``test`` extra must be importable.

    In CI (``CI`` set, as .ci/run does) a missing tool fails the test; a local run without
    it skips, naming the install command.
    """

    def require(module: str) -> None:
        if importlib.util.find_spec(module) is not None:
            return
        message = f"{module} is not installed: pip install -e '.[test]'"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)

    return require

@pytest.fixture(scope="session")
def ray_address(ray_cluster) -> str:
    """The GCS address of the session's cluster, for subprocesses that join it.

    Why not "auto": "auto" joins the most recently started cluster on the machine, which
    need not be this session's when other Ray sessions run beside the tests.
    """
    import ray

    return ray.get_runtime_context().gcs_address

