"""CUDA IPC between two Ray actors on one GPU (num_gpus=0.5 each), at the communicator level."""

from __future__ import annotations

import gpu_peers as P
import pytest
import ray

SIZES = [1024, 1 << 20, 64 << 20]


def _ipc_pair(peers, prefix, slots=2, slot_bytes=1 << 20):
    a, b = peers(2)
    ray.get([a.run.remote(P.open_ipc, prefix, 0, 2, slots, slot_bytes),
             b.run.remote(P.open_ipc, prefix, 1, 2, slots, slot_bytes)], timeout=120)
    ray.get([a.run.remote(P.warm, [1]), b.run.remote(P.warm, [0])], timeout=120)
    return a, b


def test_both_actors_share_one_gpu(peers):
    a, b = peers(2)
    ua, ub = ray.get([a.run.remote(P.gpu_uuid), b.run.remote(P.gpu_uuid)], timeout=60)
    assert ua and ua == ub and ua.startswith("GPU-")


def test_mixed_values_all_sizes_more_values_than_slots(peers, prefix):
    a, b = _ipc_pair(peers, prefix)
    reps = 3  # 3 per size > 2 slots; 64 MiB regrows a slot
    _, got = ray.get([a.run.remote(P.send_values, 1, SIZES, reps),
                      b.run.remote(P.recv_values, 0, SIZES, reps)], timeout=300)
    assert [g[0] for g in got] == list(range(len(SIZES) * reps))
    for i, name, dev, size_ok, values_ok, strided_ok, cpu_dev in got:
        assert (name, dev, size_ok, values_ok, strided_ok, cpu_dev) == \
            (f"v{i}", "cuda", True, True, True, "cpu")


def test_exceptions_on_tensor_edges(peers, prefix):
    a, b = _ipc_pair(peers, prefix)
    _, got = ray.get([a.run.remote(P.send_errors, 1), b.run.remote(P.recv_errors, 0)],
                     timeout=120)
    assert got[0] == got[1] == "upstream failed"
    assert "static edge declares one tensor (4,)/float32" in got[2]
    assert got[3] == [5.0, 5.0, 5.0, 5.0]  # the pair keeps working


@pytest.mark.parametrize("copy_delay", [0, 20_000_000])
def test_event_ordering_delayed_producer_and_slow_reader(peers, prefix, copy_delay):
    # The producer's values are written behind ~10 ms sleep kernels; with copy_delay the
    # reader's copies lag too, so slots are reused only after device-side waits.
    a, b = _ipc_pair(peers, prefix, slots=2)
    _, bad = ray.get([a.run.remote(P.produce_delayed, 1, 1 << 18, 12, 20_000_000),
                      b.run.remote(P.consume_checked, 0, 12, copy_delay)], timeout=300)
    assert bad == 0


def test_no_cpu_sync_on_the_hot_path(peers, prefix):
    a, b = _ipc_pair(peers, prefix)
    counts = ray.get([a.run.remote(P.hops_counting_syncs, 1, "send", 1 << 18, 20),
                      b.run.remote(P.hops_counting_syncs, 0, "recv", 1 << 18, 20)],
                     timeout=120)
    assert counts == [0, 0]
