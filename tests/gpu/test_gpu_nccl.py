"""NCCL on one GPU: world-size-1 collectives, and two real ranks on one device through the
test-only fake-hosts mode (each actor its own NCCL_HOSTID, P2P/SHM off: sockets)."""

from __future__ import annotations

import uuid

import gpu_peers as P
import pytest
import ray


def _bindings():
    out = []
    for b in ("ctypes", "cupy"):
        try:
            from cgc.runtime.comm.nccl_lib import nccl_lib

            nccl_lib(b)
            out.append(b)
        except Exception:  # noqa: BLE001 - binding not installed here
            out.append(pytest.param(b, marks=pytest.mark.skip(reason=f"no {b} NCCL")))
    return out


BINDINGS = _bindings()


def _nccl_pair(peers, prefix, binding):
    a, b = peers(2, fake_hosts=True, concurrency=2)
    uid = ray.get(a.run.remote(P.unique_id, binding), timeout=60)
    got = ray.get([a.run.remote(P.open_nccl, uid, prefix, 0, 2, binding),
                   b.run.remote(P.open_nccl, uid, prefix, 1, 2, binding)], timeout=180)
    assert got == [binding, binding]
    ray.get([a.run.remote(P.warm, [1], True), b.run.remote(P.warm, [0], True)], timeout=180)
    return a, b


@pytest.mark.parametrize("binding", BINDINGS)
def test_world_size_1_collectives(peers, prefix, binding):
    (a,) = peers(1)
    uid = ray.get(a.run.remote(P.unique_id, binding), timeout=60)
    ray.get(a.run.remote(P.open_nccl, uid, prefix, 0, 1, binding), timeout=120)
    r = ray.get(a.run.remote(P.world1_collectives), timeout=120)
    x = [1.0, -2.0, 3.0]
    assert r["sum"] == r["product"] == r["max"] == r["min"] == r["avg"] == x
    assert r["gather"] == [x] and r["rs"] == x
    assert r["int_avg"] == [3, 4] and r["bool_max"] == [True, False]


@pytest.mark.parametrize("binding", BINDINGS)
def test_two_ranks_on_one_gpu_values_static_errors_collectives(peers, prefix, binding):
    a, b = _nccl_pair(peers, prefix, binding)
    r0, r1 = ray.get([a.run.remote(P.nccl_rank_script, 0), b.run.remote(P.nccl_rank_script, 1)],
                     timeout=300)
    assert r1["p2p"] == ["x", 45.0, 24.0, "'k0'", "'k1'"]
    assert r0["back"] == [0.0, 2.0, 4.0]
    for r in (r0, r1):
        assert r["sum"] == [3.0, 4.0] and r["avg"] == [1.5, 2.0] and r["max"] == [1, 5]
        assert r["gather"] == [[0], [1]] and r["coll_err"] == "r1"
        assert "differ" in r["mismatch"]
    assert r0["rs"] == [0.0, 3.0] and r1["rs"] == [6.0, 9.0]


@pytest.mark.parametrize("binding", BINDINGS)
def test_abort_ends_a_hung_receive(peers, prefix, binding):
    a, b = _nccl_pair(peers, prefix, binding)
    out = ray.get(a.run.remote(P.hang_then_abort, 1), timeout=120)
    assert out.get("timed_out") and out.get("closed_after") and out.get("device_ok"), out
    ray.get(b.run.remote(P.abort_peer), timeout=60)


def test_nonblocking_init_ends_at_its_deadline(peers):
    (a,) = peers(1, fake_hosts=True)
    msg, took = ray.get(a.run.remote(P.init_alone, "ctypes", 5.0), timeout=120)
    assert "deadline" in msg and took >= 5.0, (msg, took)


@pytest.mark.parametrize("binding", BINDINGS)
def test_missing_member_fails_the_barrier_before_any_nccl_call(peers, prefix, binding):
    (a,) = peers(1, fake_hosts=True)
    uid = ray.get(a.run.remote(P.unique_id, binding), timeout=60)
    with pytest.raises(ray.exceptions.RayTaskError, match="reached NCCL init"):
        ray.get(a.run.remote(P.open_nccl, uid, prefix + uuid.uuid4().hex[:4], 0, 2, binding,
                             3.0), timeout=120)
