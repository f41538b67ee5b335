"""Streams: back-pressure of the held-buffer window, the sync counter, and a user's own
torch.distributed NCCL group wrapped as a cgc communicator."""

from __future__ import annotations

import gpu_peers as P
import ray


def test_window_applies_back_pressure(peers):
    (a,) = peers(1)
    most, waits = ray.get(a.run.remote(P.window_back_pressure), timeout=120)
    assert most <= 2 and waits >= 1


def test_sync_counter_sees_torch_synchronize(peers):
    (a,) = peers(1)
    assert ray.get(a.run.remote(P.counted_synchronize), timeout=60) == 2


def test_torch_distributed_nccl_group_world_size_1(peers):
    (a,) = peers(1)
    assert ray.get(a.run.remote(P.torch_dist_world1), timeout=180) == [2.0, 4.0]
