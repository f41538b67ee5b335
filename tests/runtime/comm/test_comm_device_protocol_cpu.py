"""cgc.runtime.gpu on a machine without GPUs: headers, binding, and the device protocols with
CPU stand-ins (CPU tensors as device tensors, bytes through shared memory).

The communicators here run the same protocol code as on GPUs: ``DeviceCommunicator`` over
``ShmCpuTransport`` stands in for NCCL, ``CudaIpcCommunicator`` over ``ShmIpcDevice`` for
CUDA IPC, ``TorchDistCommunicator`` over a gloo group for the torch.distributed path.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import pickle
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cgc.plan_schema.errors import ConfigError
from cgc.runtime.channels import (
    ChannelClosedError,
    ChannelError,
    ChannelTimeoutError,
    ErrorValue,
)
from cgc.runtime.comm import CpuCommunicator
from cgc.runtime.comm import binding as B
from cgc.runtime.comm.binding import Transport
from cgc.runtime.comm.collective import CollectiveShapeError
from cgc.runtime.comm.cuda_ipc import CudaIpcCommunicator
from cgc.runtime.comm.device_protocol import collective_plan
from cgc.runtime.comm.factory import HostOptions, IpcOptions
from cgc.runtime.comm.host_staging import HostStagingCommunicator
from cgc.runtime.comm.sidechannel import ShmSideChannels, exchange
from cgc.runtime.comm.testing import fake_hosts as FH
from cgc.runtime.comm.testing.cpu_transport import ShmCpuTransport, cpu_device_communicator
from cgc.runtime.comm.testing.shm_ipc_device import ShmIpcDevice
from cgc.runtime.errors import SetupError
from cgc.runtime.gpu.streams import SYNC_COUNTER, NullStreams, actor_streams, wait_event
from cgc.runtime.gpu.tensors import (
    STATUS_ERROR,
    TensorMeta,
    cpu_stand_in,
    make_header,
    open_header,
    rebuild_value,
    split_value,
    static_meta,
    torch_dtype,
)

ROOT = Path(__file__).resolve().parents[3]


def run_ranks(*fns: Any, timeout: float = 60.0) -> list[Any]:
    """Run one function per rank in threads; return results (exceptions re-raised)."""
    out: list[Any] = [None] * len(fns)
    errs: list[BaseException | None] = [None] * len(fns)

    def wrap(i: int) -> None:
        try:
            out[i] = fns[i]()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errs[i] = exc

    ts = [threading.Thread(target=wrap, args=(i,), daemon=True) for i in range(len(fns))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout)
        assert not t.is_alive(), "a rank hung"
    for e in errs:
        if e is not None:
            raise e
    return out


# ----------------------------------------------------------------------------- headers


@dataclasses.dataclass
class Batch:
    x: Any
    label: str
    extra: dict


leaf = st.one_of(
    st.integers(-5, 5),
    st.text(max_size=3),
    st.none(),
    st.lists(st.integers(0, 3), min_size=1, max_size=4).map(
        lambda v: torch.tensor(v, dtype=torch.float32)),
    st.integers(1, 4).map(lambda n: np.arange(n)),
)
values = st.recursive(leaf, lambda kids: st.one_of(
    st.lists(kids, max_size=3), st.tuples(kids, kids),
    st.dictionaries(st.text(max_size=2), kids, max_size=3)), max_leaves=8)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and np.array_equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values)
def test_skeleton_round_trip_any_nesting(value):
    skeleton, tensors = split_value(value, is_device=cpu_stand_in)
    assert all(isinstance(t, torch.Tensor) for t in tensors)
    # the tensors went out: the skeleton holds placeholders only
    copies = [t.clone() for t in tensors]
    assert _same(rebuild_value(skeleton, copies), value)
    hdr, ts = make_header(value, is_device=cpu_stand_in)
    assert [m.shape for m in hdr.metas] == [tuple(t.shape) for t in ts]
    assert _same(open_header(pickle.loads(pickle.dumps(hdr)), copies), value)


def test_bare_tensor_skips_pickle_and_any_dtype_round_trips():
    for dt in (torch.float16, torch.bfloat16, torch.bool, torch.complex64, torch.int8):
        t = torch.ones(3, 2, dtype=dt)
        hdr, ts = make_header(t, is_device=cpu_stand_in)
        assert hdr.skeleton is None and ts == [t]
        m = hdr.metas[0]
        assert (m.shape, torch_dtype(m.dtype), m.nbytes) == ((3, 2), dt, 6 * t.element_size())


def test_same_tensor_twice_moves_once_and_comes_back_shared():
    t = torch.arange(3)
    sk, ts = split_value({"a": t, "b": [t, 1]}, is_device=cpu_stand_in)
    assert len(ts) == 1
    back = rebuild_value(sk, [t.clone()])
    assert back["a"] is back["b"][0]


def test_dataclass_and_cpu_tensors_stay_in_skeleton_without_device_tensors():
    v = Batch(torch.ones(2), "y", {"n": np.zeros(1)})
    sk, ts = split_value(v)  # default: only CUDA tensors move; none here
    assert ts == []
    back = rebuild_value(sk, [])
    assert back.label == "y" and torch.equal(back.x, v.x)
    sk, ts = split_value(v, is_device=cpu_stand_in)
    assert len(ts) == 1 and rebuild_value(sk, [torch.full((2,), 7.0)]).x.tolist() == [7, 7]


def test_error_value_travels_in_the_header():
    try:
        raise KeyError("bad")
    except KeyError as e:
        ev = ErrorValue.from_exception(e, actor="w0", method="f", exec_index=2)
    hdr, ts = make_header(ev)
    assert hdr.status == STATUS_ERROR and ts == [] and hdr.metas == ()
    got = open_header(pickle.loads(pickle.dumps(hdr)), [])
    assert isinstance(got, ErrorValue) and got.type_name == "KeyError" and got.exec_index == 2


def test_bad_placeholder_and_bad_dtype_are_clear_errors():
    sk, _ = split_value([torch.ones(1), torch.ones(1)], is_device=cpu_stand_in)
    with pytest.raises(pickle.UnpicklingError, match="placeholder"):
        rebuild_value(sk, [torch.ones(1)])
    with pytest.raises(ValueError, match="dtype"):
        torch_dtype("Tensor")
    with pytest.raises(ValueError, match="negative"):
        static_meta((-1, 2), "float32")
    assert static_meta([2, 3], "torch.float16") == TensorMeta((2, 3), "float16", 12)


# ----------------------------------------------------------------------------- binding


@pytest.mark.parametrize("members, auto, nccl", [
    ([("n", "GPU-a"), ("n", "GPU-b")], "nccl", "nccl"),
    ([("n1", "GPU-a"), ("n2", "GPU-b")], "nccl", "nccl"),
    ([("n", "GPU-a")], "nccl", "nccl"),
    ([("n", "GPU-a"), ("n", "GPU-a")], "cuda_ipc", None),
    ([("n", "GPU-a"), ("n", "GPU-a"), ("n", "GPU-b")], "host_staging", None),
    ([("n", "GPU-a"), ("n", None)], "host_staging", None),
    ([("n", None), ("n", None)], "cpu", None),
])
def test_binding_table(members, auto, nccl):
    assert B.bind_one(members, "auto").transport == auto
    assert B.bind_one(members, "cpu").transport == "cpu"
    if nccl is None:
        with pytest.raises(SetupError, match="communicator='nccl'"):
            B.bind_one(members, "nccl")
    else:
        assert B.bind_one(members, "nccl").transport == nccl


def test_binding_fake_hosts_and_choices():
    same = [("n", "GPU-a"), ("n", "GPU-a")]
    b = B.bind_communicators({3: same, 1: [("n", None)]}, "auto", fake_hosts=True)
    assert list(b) == [1, 3]  # sorted: deterministic output
    assert b[3].transport == "nccl" and B.FAKE_HOSTS_ENV in b[3].reason
    assert b[1].transport == "cpu"
    with pytest.raises(ConfigError, match="communicator='gpu'"):
        B.bind_communicators({0: same}, "gpu")


def test_fake_host_env_is_distinct_per_actor(monkeypatch):
    for k in FH.fake_host_env("x"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv(B.FAKE_HOSTS_ENV, "1")
    assert B.fake_hosts_enabled()
    env = FH.apply_fake_hosts("w1")
    assert os.environ["NCCL_HOSTID"] == "cgc-fake-w1" != FH.fake_host_env("w0")["NCCL_HOSTID"]
    assert env["NCCL_P2P_DISABLE"] == env["NCCL_SHM_DISABLE"] == "1"


def test_probe_without_cuda_reports_no_gpu():
    assert B.probe_gpu_uuid() is None
    assert isinstance(actor_streams(), NullStreams)


# ----------------------------------------------------------------------------- side-channels


def test_side_channels_order_timeout_poll_and_exchange(prefix):
    sides = [ShmSideChannels(prefix, r, 3) for r in range(3)]
    for i in range(5):
        sides[0].send(2, ("m", i))
    assert [sides[2].recv(0, 5)[1] for _ in range(5)] == list(range(5))
    polls = []
    with pytest.raises(ChannelTimeoutError):
        sides[1].recv(0, 0.3, poll=lambda: polls.append(1))
    assert polls  # health was polled while waiting
    res = run_ranks(*[lambda r=r: exchange(sides[r], ("s", r), 10) for r in range(3)])
    assert res == [[("s", 0), ("s", 1), ("s", 2)]] * 3
    for s in sides:
        s.close(linger=0)


def test_wait_event_polls_counts_and_times_out():
    SYNC_COUNTER.reset()
    n = iter(range(5))
    wait_event(lambda: next(n) >= 3, 5.0)
    assert SYNC_COUNTER.count == 1
    wait_event(lambda: True, 5.0)
    assert SYNC_COUNTER.count == 1  # already done: no wait, not counted
    with pytest.raises(ChannelTimeoutError):
        wait_event(lambda: False, 0.05)


# ----------------------------------------------------------------------------- NCCL protocol


def _pair(prefix, timeout=30.0):
    return [cpu_device_communicator(prefix, r, 2, timeout=timeout) for r in (0, 1)]


def _destroy(*comms):
    for c in comms:
        c.destroy(linger=0.5)


def test_p2p_mixed_values_static_and_dynamic(prefix):
    c0, c1 = _pair(prefix)
    strided = torch.arange(6.0).reshape(2, 3).t()
    v = {"t": strided, "b": Batch(torch.ones(2, dtype=torch.bfloat16), "l", {}), "n": np.ones(2),
         "s": "text", "same": strided}

    def r0():
        c0.send(v, 1)
        c0.send(torch.full((4,), 2.0, dtype=torch.float16), 1, shape=(4,), dtype="float16")
        return c0.recv(1)

    def r1():
        got = c1.recv(0)
        st_ = c1.recv(0, shape=[4], dtype="torch.float16")
        c1.send([got["t"] * 2, 5], 0)
        return got, st_

    back, (got, static) = run_ranks(r0, r1)
    assert torch.equal(got["t"], strided) and got["t"].is_contiguous()
    assert got["same"] is got["t"] and got["b"].x.dtype == torch.bfloat16
    assert got["s"] == "text" and np.array_equal(got["n"], np.ones(2))
    assert static.tolist() == [2, 2, 2, 2] and static.dtype == torch.float16
    assert torch.equal(back[0], strided * 2) and back[1] == 5
    _destroy(c0, c1)


def test_static_receive_is_posted_before_the_header_is_read(prefix):
    c0, c1 = _pair(prefix)
    log: list[str] = []
    real_p2p, real_recv = c1.transport.p2p, c1.side.recv

    def p2p(sends, recvs):
        log.append("posted" if recvs else "send")
        return real_p2p(sends, recvs)

    def side_recv(peer, timeout=None, poll=None):
        msg = real_recv(peer, timeout, poll)
        log.append("header")
        return msg

    c1.transport.p2p, c1.side.recv = p2p, side_recv
    run_ranks(lambda: c0.send(torch.ones(3), 1, shape=(3,), dtype="float32"),
              lambda: c1.recv(0, shape=(3,), dtype="float32"))
    run_ranks(lambda: c0.send(torch.ones(3), 1), lambda: c1.recv(0))
    assert log == ["posted", "header", "header", "posted"]
    _destroy(c0, c1)


def test_exceptions_on_tensor_edges_are_values(prefix):
    c0, c1 = _pair(prefix)
    err = ErrorValue.from_exception(ValueError("upstream"), actor="w0", method="f")

    def r0():
        c0.send(err, 1)  # dynamic: header only
        c0.send(err, 1, shape=(2,), dtype="float32")  # static: header + dummy
        c0.send(torch.ones(3), 1, shape=(2,), dtype="float32")  # breaks the declaration
        c0.send({"f": lambda: 1, "t": torch.ones(1)}, 1)  # cannot be pickled

    def r1():
        return [c1.recv(0), c1.recv(0, shape=(2,), dtype="float32"),
                c1.recv(0, shape=(2,), dtype="float32"), c1.recv(0)]

    _, got = run_ranks(r0, r1)
    assert all(isinstance(g, ErrorValue) for g in got)
    assert got[0].message == "upstream" and got[1].message == "upstream"
    assert "static edge declares one tensor (2,)/float32" in got[2].message
    assert got[3].type_name == "TypeError" and "cannot be sent" in got[3].message
    # dynamic error and unpicklable value: no device op; static ones: one transfer each
    assert c0.transport.ops == [("send", 1), ("send", 1)]
    assert c1.transport.ops == [("recv", 0), ("recv", 0)]
    _destroy(c0, c1)


@pytest.mark.parametrize("op, a, b, want", [
    ("sum", [1.0, 2.0], [10.0, 20.0], [11.0, 22.0]),
    ("product", [2.0, 3.0], [4.0, 5.0], [8.0, 15.0]),
    ("max", [1, 9], [5, 2], [5, 9]),
    ("min", [1, 9], [5, 2], [1, 2]),
    ("avg", [1.0, 3.0], [2.0, 4.0], [1.5, 3.5]),
    ("avg", [3, 4], [6, 6], [4, 5]),  # integers floor, as the CPU communicator does
])
def test_allreduce_ops(prefix, op, a, b, want):
    c0, c1 = _pair(prefix)
    r = run_ranks(lambda: c0.allreduce(torch.tensor(a), op),
                  lambda: c1.allreduce(torch.tensor(b), op))
    assert r[0].tolist() == r[1].tolist() == want
    _destroy(c0, c1)


def test_allgather_reducescatter_and_host_values(prefix):
    c0, c1 = _pair(prefix)

    def rank(c, r):
        return (c.allgather(torch.tensor([r, r])),
                c.reducescatter(torch.arange(4.0) * (r + 1), "sum"),
                c.allreduce(np.array([r + 1.0]), "sum"),
                c.reducescatter(np.arange(4.0) + 10 * r, "max"))

    g0, g1 = run_ranks(lambda: rank(c0, 0), lambda: rank(c1, 1))
    assert [t.tolist() for t in g0[0]] == [[0, 0], [1, 1]]
    assert g0[1].tolist() == [0.0, 3.0] and g1[1].tolist() == [6.0, 9.0]
    assert g0[2].tolist() == g1[2].tolist() == [3.0]
    assert g0[3].tolist() == [10.0, 11.0] and g1[3].tolist() == [12.0, 13.0]  # host rule
    assert [op for op, _ in c0.transport.ops] == ["allgather", "reducescatter"]
    _destroy(c0, c1)


@pytest.mark.parametrize("value", [torch.arange(3.0), np.arange(3.0), np.float64(1.0)])
def test_an_uneven_reducescatter_fails_on_every_member(prefix, value):
    """Dim 0 of 3 over 2 ranks: the same CollectiveShapeError on both ranks, on the device
    path and the host path alike (the host path used to drop the third row)."""
    c0, c1 = _pair(prefix)

    def rank(c):
        try:
            return c.reducescatter(value, "sum")
        except CollectiveShapeError as exc:
            return str(exc)

    r0, r1 = run_ranks(lambda: rank(c0), lambda: rank(c1))
    assert r0 == r1 and "reducescatter:" in r0 and "world size 2" in r0, (r0, r1)
    assert c0.transport.ops == []
    _destroy(c0, c1)


def test_collective_errors_reach_every_member_without_a_device_op(prefix):
    c0, c1 = _pair(prefix)
    err = ErrorValue.from_exception(RuntimeError("rank 1 failed"))

    def mism(c, n):
        try:
            c.allreduce(torch.ones(n), "sum")
        except ValueError as e:
            return str(e)
        return None

    r = run_ranks(lambda: (c0.allreduce(torch.ones(2), "sum"), mism(c0, 2)),
                  lambda: (c1.allreduce(err, "sum"), mism(c1, 3)))
    assert r[0][0].message == r[1][0].message == "rank 1 failed"
    assert r[0][1] == r[1][1] and "differ" in r[0][1]
    assert c0.transport.ops == [] and c1.transport.ops == []
    with pytest.raises(TypeError):  # device on one, host on the other: same error on both
        run_ranks(lambda: c0.allreduce(torch.ones(1)), lambda: c1.allreduce(np.ones(1)))
    _destroy(c0, c1)


def test_collective_plan_is_deterministic():
    m = TensorMeta((4,), "float32", 16)
    assert collective_plan([("dev", m), ("dev", m)], "allreduce.sum", 2) == ("dev", m)
    with pytest.raises(ValueError, match="divisible"):
        collective_plan([("dev", TensorMeta((3,), "float32", 12))] * 2, "reducescatter.sum", 2)


def test_call_order_mismatch_is_reported(prefix):
    c0, c1 = _pair(prefix)
    with pytest.raises(ChannelError, match="call order differs"):
        run_ranks(lambda: c0.allreduce(torch.ones(1)), lambda: c1.allgather(torch.ones(1)))
    c0.abort()
    c1.abort()
    _destroy(c0, c1)


def test_timeout_and_abort_from_another_thread(prefix):
    c0, c1 = _pair(prefix, timeout=None)
    with pytest.raises(ChannelTimeoutError):
        c1.recv(0, timeout=0.2)
    started = threading.Event()
    box: dict = {}

    def blocked():
        started.set()
        try:
            c1.recv(0)  # no timeout: only the abort ends it
        except ChannelClosedError as e:
            box["err"] = e

    t = threading.Thread(target=blocked, daemon=True)
    t.start()
    started.wait(10)
    c1.destroy()  # from another thread while recv runs: aborts
    t.join(30)
    assert not t.is_alive() and isinstance(box.get("err"), ChannelClosedError)
    with pytest.raises(ChannelClosedError):
        c1.send(torch.ones(1), 0)
    c1.destroy()  # the owner's release
    c0.destroy(linger=0)


def test_warm_up_moves_one_byte_each_way(prefix):
    c0, c1 = _pair(prefix)
    run_ranks(lambda: c0.warm_up([1], 10, collective=True),
              lambda: c1.warm_up([0], 10, collective=True))
    assert c0.transport.ops == [("send", 1), ("recv", 1), ("allreduce", "sum")]
    _destroy(c0, c1)


def test_cpu_transport_checks_sizes(prefix):
    t0, t1 = ShmCpuTransport(prefix, 0, 2), ShmCpuTransport(prefix, 1, 2)
    with pytest.raises(ValueError, match="sent 8 bytes"):
        run_ranks(lambda: t0.p2p([(torch.zeros(8, dtype=torch.uint8), 1)], []),
                  lambda: t1.p2p([], [(torch.zeros(4, dtype=torch.uint8), 0)]))
    t0.destroy()
    t1.destroy()


# ----------------------------------------------------------------------------- CUDA IPC protocol


def _ipc_pair(prefix, slots=2, slot_bytes=1024):
    return [CudaIpcCommunicator(r, 2, prefix=prefix, streams=NullStreams(),
                                device=ShmIpcDevice(prefix, r), slots=slots,
                                slot_bytes=slot_bytes, timeout=30, is_device=cpu_stand_in)
            for r in (0, 1)]


def test_ipc_slots_reuse_growth_and_both_directions(prefix):
    c0, c1 = _ipc_pair(prefix)
    sizes = [10, 300, 5, 2000, 7, 9000, 3]  # several regrowths, more values than slots

    def r0():
        got = []
        for i, n in enumerate(sizes):
            c0.send({"x": torch.full((n,), float(i)), "i": i}, 1)
            got.append(c0.recv(1))  # the reverse direction interleaves with acks
        return got

    def r1():
        out = []
        for _ in sizes:
            v = c1.recv(0)
            out.append(v)
            c1.send(v["x"][:2] + 1, 0)
        return out

    back, got = run_ranks(r0, r1)
    assert [(v["i"], v["x"].shape[0], float(v["x"].sum())) for v in got] == \
        [(i, n, float(i * n)) for i, n in enumerate(sizes)]
    assert [b.tolist() for b in back] == [[i + 1.0, i + 1.0] for i in range(len(sizes))]
    _destroy(c0, c1)


def test_ipc_errors_static_checks_collectives_and_warm_up(prefix):
    c0, c1 = _ipc_pair(prefix)
    err = ErrorValue.from_exception(ValueError("up"))

    def rank(c, r):
        c.warm_up([1 - r], 10)
        if r == 0:
            c.send(err, 1)
            c.send(torch.ones(3), 1, shape=(2,), dtype="float32")
        else:
            got = [c.recv(0), c.recv(0, shape=(2,), dtype="float32")]
        try:  # the device protocol's rule, as over NCCL: tensors or arrays only
            c.allgather({"r": r})
        except TypeError as e:
            bad = str(e)
        return (got if r else None,
                c.allreduce(torch.tensor([r + 1.0, 2.0]), "product"),
                [t.tolist() for t in c.allgather(torch.tensor([r, 10 + r]))],
                c.reducescatter(torch.arange(4) * (r + 1), "max"),
                c.allreduce(err if r else torch.ones(1)),
                c.allgather(np.array([r])),
                bad)

    a, b = run_ranks(lambda: rank(c0, 0), lambda: rank(c1, 1))
    assert b[0][0].message == "up" and "static edge" in b[0][1].message
    assert a[1].tolist() == b[1].tolist() == [2.0, 4.0]
    assert a[2] == b[2] == [[0, 10], [1, 11]]
    assert a[3].tolist() == [0, 2] and b[3].tolist() == [4, 6]
    assert a[4].message == b[4].message == "up"
    assert [x.tolist() for x in a[5]] == [x.tolist() for x in b[5]] == [[0], [1]]
    assert "allgather: rank 0 contributed a dict" in a[6] == b[6]
    _destroy(c0, c1)


def test_ipc_abort_wakes_a_blocked_reader(prefix):
    c0, c1 = _ipc_pair(prefix)
    box: dict = {}

    def blocked():
        try:
            c1.recv(0, timeout=None)
        except ChannelClosedError as e:
            box["e"] = e

    t = threading.Thread(target=blocked, daemon=True)
    t.start()
    c0.abort()  # the writer side poisons the pair: its reader wakes up
    t.join(30)
    assert not t.is_alive() and "e" in box
    _destroy(c0, c1)


# ----------------------------------------------------------------------------- host staging


def test_staging_over_the_cpu_communicator(prefix):
    inner = [CpuCommunicator(prefix, r, 2) for r in (0, 1)]
    c0, c1 = (HostStagingCommunicator(i, NullStreams(), timeout=30) for i in inner)
    err = ErrorValue.from_exception(KeyError("k"))

    def rank(c, r):
        if r == 0:
            c.send({"t": torch.ones(2)}, 1)
        got = c.recv(0) if r else None
        return got, c.allreduce(torch.tensor([r + 1.0]), "sum"), c.allgather(err if r else 1)

    a, b = run_ranks(lambda: rank(c0, 0), lambda: rank(c1, 1))
    assert b[0]["t"].tolist() == [1.0, 1.0]
    assert a[1].tolist() == b[1].tolist() == [3.0]
    assert a[2].type_name == b[2].type_name == "KeyError"
    for c in (c0, c1):
        c.destroy(linger=0.5)


# ----------------------------------------------------------------------------- torch.distributed


def _dist_rank(rank: int, init: str, prefix: str, q: Any) -> None:
    import torch.distributed as dist

    from cgc.runtime.comm.torchdist import TorchDistCommunicator

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    comm = TorchDistCommunicator(prefix=prefix, timeout=60)
    try:
        if rank == 0:
            comm.send({"x": torch.arange(4.0), "tag": "a"}, 1)
            comm.send(torch.ones(3), 1, shape=(3,), dtype="float32")
            comm.send(ErrorValue.from_exception(ValueError("e")), 1, shape=(3,),
                      dtype="float32")
            res = None
        else:
            res = [comm.recv(0), comm.recv(0, shape=(3,), dtype="float32"),
                   comm.recv(0, shape=(3,), dtype="float32")]
            res = [res[0]["tag"], res[0]["x"].tolist(), res[1].tolist(), res[2].message]
        red = comm.allreduce(torch.tensor([rank + 1.0]), "avg").tolist()
        q.put((rank, res, red))
    except BaseException as e:  # noqa: BLE001 - reported to the test
        q.put((rank, repr(e), None))
    finally:
        comm.destroy(linger=1.0)
        dist.destroy_process_group()


def test_torch_distributed_communicator_over_gloo(prefix, tmp_path):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    init = f"file://{tmp_path / 'store'}"
    ps = [ctx.Process(target=_dist_rank, args=(r, init, prefix, q)) for r in (0, 1)]
    for p in ps:
        p.start()
    got = dict((r, (res, red)) for r, res, red in (q.get(timeout=120) for _ in ps))
    for p in ps:
        p.join(60)
    assert got[1][0] == ["a", [0.0, 1.0, 2.0, 3.0], [1.0, 1.0, 1.0], "e"], got
    assert got[0][1] == got[1][1] == [1.5]


# ----------------------------------------------------------------------------- NCCL pieces


def test_nccl_dtype_table():
    from cgc.runtime.comm.collective import ReduceOp
    from cgc.runtime.comm.nccl import nccl_dtype

    assert nccl_dtype("bfloat16", ReduceOp.SUM)[:2] == (9, None)
    assert nccl_dtype("complex64", ReduceOp.SUM)[1] == "real"
    assert "complex" in nccl_dtype("complex64", ReduceOp.MAX)[2]
    assert "int16" in nccl_dtype("int16", ReduceOp.SUM)[2]


def test_nccl_transport_groups_every_value(prefix):
    from cgc.runtime.comm.nccl import NcclTransport
    from cgc.runtime.comm.nccl_lib import NcclHandle

    calls = []

    class FakeLib:
        def group_start(self):
            calls.append("start")

        def group_end(self, h):
            calls.append("end")

        def send(self, h, ptr, n, dt, peer, s):
            calls.append(("send", n, peer))

        def recv(self, h, ptr, n, dt, peer, s):
            raise RuntimeError("bad recv")

    class S:
        comm = type("C", (), {"cuda_stream": 0})()
        device = None

    tr = NcclTransport(FakeLib(), NcclHandle(None, False, 0, 2), 0, 2, S())
    tr.p2p([(torch.zeros(3, dtype=torch.uint8), 1), (torch.zeros(5, dtype=torch.uint8), 1)], [])
    with pytest.raises(RuntimeError):
        tr.p2p([], [(torch.zeros(1, dtype=torch.uint8), 1)])
    assert calls == ["start", ("send", 3, 1), ("send", 5, 1), "end", "start", "end"]


def test_ctypes_nccl_binding_loads_when_libnccl_is_installed():
    from cgc.runtime.comm.nccl_lib import CtypesNccl, NcclError, find_libnccl

    try:
        path = find_libnccl()
        lib = CtypesNccl(path)
    except OSError:
        pytest.skip("no libnccl.so.2 on this machine")
    import time

    assert lib.version() >= 21700
    uid = lib.unique_id()
    assert len(uid) == 128 and uid != lib.unique_id()
    with pytest.raises((NcclError, SetupError)):  # no CUDA here: a clean error, no crash
        lib.init(1, uid, 0, time.monotonic() + 10)


def test_p2p_peers_of_a_compiled_nccl_plan():
    import cgc
    from cgc.runtime.comm.warmup import has_collectives, p2p_peers

    plan = cgc.compile_file(ROOT / "examples" / "pipeline_nccl.py").proto
    low = plan.lowered
    assert low.communicators
    members = list(low.communicators[0].members)
    assert p2p_peers(plan, 0, members[0]) == [1] and p2p_peers(plan, 0, members[1]) == [0]
    assert not has_collectives(plan, 0)
    plan = cgc.compile_file(ROOT / "examples" / "allreduce.py").proto
    assert has_collectives(plan, 0)


def test_factory_opens_each_transport(prefix):
    from cgc.runtime.comm.factory import open_device_communicator

    comms = [open_device_communicator("host_staging", rank=r, world_size=2, prefix=prefix,
                                      streams=NullStreams(), timeout=30) for r in (0, 1)]
    res = run_ranks(lambda: comms[0].allreduce(torch.tensor([1.0])),
                    lambda: comms[1].allreduce(torch.tensor([2.0])))
    assert [r.tolist() for r in res] == [[3.0], [3.0]]
    for c in comms:
        c.destroy(0.5)
    cpu = open_device_communicator("cpu", rank=0, world_size=1, prefix=prefix + "c-")
    assert isinstance(cpu, CpuCommunicator)
    cpu.destroy()
    with pytest.raises(SetupError, match="unique id"):
        open_device_communicator("nccl", rank=0, world_size=1, prefix=prefix)
    with pytest.raises(SetupError, match="unknown communicator transport"):
        open_device_communicator("rdma", rank=0, world_size=1, prefix=prefix)
    with pytest.raises(SetupError, match="takes HostOptions, not IpcOptions"):
        open_device_communicator(Transport.CPU, rank=0, world_size=1, prefix=prefix,
                                 options=IpcOptions())
    with pytest.raises(SetupError, match="unique id"):
        open_device_communicator("nccl", rank=0, world_size=1, prefix=prefix,
                                 options=HostOptions())


def test_options_for_each_transport():
    from cgc.runtime.comm.factory import NcclOptions, options_for

    assert options_for("nccl", unique_id=b"u", init_timeout=5) == NcclOptions(b"u", None, 5)
    assert options_for("nccl") is None
    assert options_for(Transport.CUDA_IPC, slot_bytes=64) == IpcOptions(2, 64)
    assert options_for("host_staging", spin_us=3, init_timeout=7) == HostOptions(3, 7)
    assert options_for("cpu_protocol") is None
    with pytest.raises(SetupError, match="unknown communicator transport"):
        options_for("rdma")


class _FakeNccl:
    """Stands in for libnccl under CtypesNccl: the state machine of a non-blocking comm."""

    def __init__(self, states):
        self.states = list(states)  # what ncclCommGetAsyncError reports, in turn
        self.calls: list[str] = []

    def ncclCommInitRankConfig(self, comm_ref, world, uid, rank, cfg_ref):
        self.calls.append(f"init blocking={cfg_ref._obj.blocking} v={cfg_ref._obj.version}")
        comm_ref._obj.value = 0x1234
        return 7

    def ncclCommGetAsyncError(self, comm, st_ref):
        st_ref._obj.value = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        return 0

    def ncclCommAbort(self, comm):
        self.calls.append("abort")
        return 0

    def ncclGroupStart(self):
        self.calls.append("start")
        return 0

    def ncclGroupEnd(self):
        self.calls.append("end")
        return 7

    def ncclSend(self, *args):
        self.calls.append("send")
        return 0


def _ctypes_with(fake):
    from cgc.runtime.comm.nccl_lib import CtypesNccl

    lib = CtypesNccl.__new__(CtypesNccl)
    lib._lib, lib.blocking, lib._tls, lib._last = fake, False, threading.local(), None
    return lib


def test_ctypes_nonblocking_init_deadline_aborts():
    import time

    fake = _FakeNccl([7])  # in progress for ever: a member never joins
    lib = _ctypes_with(fake)
    with pytest.raises(SetupError, match="deadline"):
        lib.init(2, bytes(128), 0, time.monotonic() + 0.2)
    assert fake.calls == ["init blocking=0 v=21700", "abort"]


def test_ctypes_async_error_and_grouped_ops():
    import time

    from cgc.runtime.comm.nccl_lib import NcclError

    fake = _FakeNccl([7, 7, 0])
    lib = _ctypes_with(fake)
    h = lib.init(2, bytes(128), 1, time.monotonic() + 10)  # ready after two polls
    fake.states = [7, 0]
    lib.group_start()
    lib.send(h, 1, 8, 1, 0, 0)
    lib.group_end(h)  # in progress until NCCL queued it
    assert fake.calls[1:] == ["start", "send", "end"]
    fake.states = [6]  # ncclRemoteError
    with pytest.raises(NcclError, match="ncclRemoteError"):
        lib.check(h)


def test_ctypes_abort_from_another_thread_ends_a_poll():
    import time

    fake = _FakeNccl([0])
    lib = _ctypes_with(fake)
    h = lib.init(2, bytes(128), 0, time.monotonic() + 10)
    fake.states = [7]  # the group end never completes
    box = {}

    def stuck():
        lib.group_start()
        try:
            lib.group_end(h)
        except ChannelClosedError as e:
            box["e"] = e

    t = threading.Thread(target=stuck, daemon=True)
    t.start()
    time.sleep(0.1)
    lib.abort(h)
    t.join(30)
    assert not t.is_alive() and "e" in box and h.comm is None and "abort" in fake.calls


def test_blocking_init_gives_up_at_its_deadline_and_reports_errors():
    import time

    from cgc.runtime.comm.nccl_lib import _blocking_init

    never = threading.Event()
    with pytest.raises(SetupError, match="cannot be aborted safely"):
        _blocking_init(never.wait, time.monotonic() + 0.2, None, "init")
    never.set()

    def boom():
        raise RuntimeError("nccl said no")

    with pytest.raises(RuntimeError, match="said no"):
        _blocking_init(boom, time.monotonic() + 10, None, "init")
    assert _blocking_init(lambda: 5, time.monotonic() + 10, None, "init") == 5


def test_device_communicator_needs_a_transport_of_one_kind(prefix):
    from cgc.runtime.comm.device_protocol import DeviceCommunicator
    from cgc.runtime.comm.transport import GatheringTransport, PostingTransport

    side = ShmSideChannels(prefix, 0, 1)
    tr = ShmCpuTransport(prefix, 0, 1)
    try:
        assert isinstance(tr, PostingTransport)
        tr.__class__ = type("NeitherKind", (GatheringTransport,), {})  # no p2p, no put
        with pytest.raises(TypeError, match="PostingTransport or a DescribingTransport"):
            DeviceCommunicator(tr, side)
    finally:
        tr.destroy(0)
        side.close(linger=0)
