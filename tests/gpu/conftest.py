"""GPU tests: skipped without CUDA. The lead runs them on the GPU machine:

    python -m pytest -q -p no:cacheprovider tests/gpu

Each test starts its own ``Peer`` actors (half a GPU each) and kills them afterwards, so a
fresh process gets the NCCL fake-hosts environment before its first NCCL call.
"""

from __future__ import annotations

import os
import sys
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


@pytest.fixture(params=["cuda_ipc", "nccl"])
def transport(request, monkeypatch):
    """The binding a plan's communicators must get on one GPU: CUDA IPC, or real NCCL with
    two ranks on the one device in the test-only fake-hosts mode."""
    from cgc.runtime.gpu.binding import FAKE_HOSTS_ENV

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
