"""GPU tests: skipped without CUDA. The lead runs them on the GPU machine:

    python -m pytest -q -p no:cacheprovider tests/gpu

Each test starts its own ``Peer`` actors (half a GPU each) and kills them afterwards, so a
fresh process gets the NCCL fake-hosts environment before its first NCCL call.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))

_HERE = Path(__file__).resolve().parent


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _cuda():
        return
    skip = pytest.mark.skip(reason="needs CUDA (tests/gpu runs on the GPU machine)")
    for item in items:
        if _HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)


# How long a test waits for the GPUs an earlier test's actors held: killed actors free their
# share within a second or two; longer means something still holds it.
GPU_FREE_WAIT_S = 30.0


def _gpu_holders() -> str:
    """The session's live actors and the processes on the GPU, for a message."""
    import ray
    from ray._private import state

    rows = [f"{a['ActorClassName']} {a.get('Name') or ''} pid={a.get('Pid')} {a['State']}"
            for a in state.actors().values() if a["State"] != "DEAD"]
    try:
        smi = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        smi = f"nvidia-smi: {exc}"
    free = ray.available_resources().get("GPU", 0.0)
    return (f"GPU free {free:g} of {ray.cluster_resources().get('GPU', 0.0):g}; "
            f"live actors: {rows or 'none'}; GPU processes: {smi or 'none'}")


def _wait_gpus_free(timeout_s: float) -> str | None:
    """None once every GPU of the session's cluster is free, else who holds them."""
    import ray

    if not ray.is_initialized():
        return None
    total = ray.cluster_resources().get("GPU", 0.0)
    deadline = time.monotonic() + timeout_s
    while ray.available_resources().get("GPU", 0.0) < total - 1e-6:
        if time.monotonic() > deadline:
            return _gpu_holders()
        time.sleep(0.2)
    return None


@pytest.fixture(autouse=True)
def gpus_free_around_each_test(request):
    """Every GPU test starts with the session cluster's GPUs free and leaves them free.

    A test that passes alone and fails in the suite is a bug: an actor (or GPU share) left
    by one test makes a later one wait for resources it never gets. This names the test
    that left it, and what holds the GPU, instead of a later test timing out.
    """
    log = os.environ.get("CGC_GPU_TEST_LOG")
    held = _wait_gpus_free(GPU_FREE_WAIT_S)
    if log:
        import ray

        with open(log, "a") as f:
            state = _gpu_holders() if ray.is_initialized() else "no ray"
            f.write(f"{time.strftime('%H:%M:%S')} start {request.node.nodeid}: {state}\n")
    if held:
        pytest.fail(f"the GPUs were not free when this test started: {held}")
    yield
    held = _wait_gpus_free(GPU_FREE_WAIT_S)
    if held:
        pytest.fail(f"this test left the GPUs held: {held}")


@pytest.fixture(params=["cuda_ipc", "nccl"])
def transport(request, monkeypatch):
    """The binding a plan's communicators must get on one GPU: CUDA IPC, or real NCCL with
    two ranks on the one device in the test-only fake-hosts mode."""
    from cgc.runtime.comm.binding import FAKE_HOSTS_ENV

    if request.param == "nccl":
        monkeypatch.setenv(FAKE_HOSTS_ENV, "1")
    else:
        monkeypatch.delenv(FAKE_HOSTS_ENV, raising=False)
    return request.param


@pytest.fixture
def peers(ray_cluster, prefix):  # prefix first: its leak check runs after peers' destroy
    """``peers(n, fake_hosts=False, concurrency=1)`` -> n fresh ``Peer`` actors (killed after)."""
    import gpu_peers
    import ray
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(gpu_peers)
    made = []

    def make(n: int, fake_hosts: bool = False, concurrency: int = 1) -> list:
        hs = [gpu_peers.make_peer(f"r{i}-{uuid.uuid4().hex[:6]}" if fake_hosts else None,
                                  concurrency) for i in range(n)]
        made.extend(hs)
        return hs

    yield make
    try:  # all ranks at once: a communicator's teardown may wait for its peers
        ray.get([h.run.remote(gpu_peers.destroy) for h in made], timeout=60)
    except Exception:  # noqa: BLE001 - a hung or dead actor: kill it anyway
        pass
    for h in made:
        ray.kill(h)
    cloudpickle.unregister_pickle_by_value(gpu_peers)
