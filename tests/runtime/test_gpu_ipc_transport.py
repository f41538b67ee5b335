"""CUDA IPC as a device transport, on CPU: ``CudaIpcCommunicator`` (``DeviceCommunicator`` over
``IpcTransport``) with ``ShmIpcDevice`` standing in for the GPU, ranks as threads.

What is IPC's own is tested here through the communicator's public API: slots growing over
generations with the old buffers freed once acknowledged, a writer held back when its reader
is ``slots`` values behind, error values between good values, abort waking a receive that
waits in the transport, and collectives (p2p plus a local reduction) decided by the
protocol's status agreement exactly as over NCCL.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
from gpu_ranks import ended_by, run_ranks

from cgc.runtime.channels import (
    ChannelClosedError,
    ChannelError,
    ChannelTimeoutError,
    ErrorValue,
    list_segments,
)
from cgc.runtime.channels.collective import CollectiveShapeError
from cgc.runtime.gpu.ipc import CudaIpcCommunicator, IpcTransport
from cgc.runtime.gpu.ipc_devices import ShmIpcDevice
from cgc.runtime.gpu.sidechannel import ShmSideChannels, SortedSideChannels
from cgc.runtime.gpu.streams import NullStreams
from cgc.runtime.gpu.tensors import cpu_stand_in


def _group(prefix, world=2, slots=2, slot_bytes=1024):
    return [CudaIpcCommunicator(r, world, prefix=prefix, streams=NullStreams(),
                                device=ShmIpcDevice(prefix, r), slots=slots,
                                slot_bytes=slot_bytes, timeout=30, is_device=cpu_stand_in)
            for r in range(world)]


def _destroy(*comms):
    for c in comms:
        c.destroy(linger=0.1)


def test_the_communicator_is_the_device_protocol_over_the_ipc_transport(prefix):
    c0, c1 = _group(prefix)
    assert isinstance(c0.transport, IpcTransport) and c0.transport.side is c0.side
    _destroy(c0, c1)


def test_slots_grow_over_generations_and_old_buffers_are_freed(prefix):
    # One slot, values growing 4x each time: every send regrows the slot. The writer keeps
    # an old buffer only until the reader acknowledged the new generation.
    c0, c1 = _group(prefix, slots=1, slot_bytes=256)
    sizes = [16, 256, 4096, 65536, 300_000, 1_200_000, 8]
    held = []

    def writer():
        for i, n in enumerate(sizes):
            c0.send(torch.full((n,), float(i)), 1)
            held.append(len(list_segments(f"{prefix}m0-")))
            c0.recv(1)  # the reader's "done": its acknowledgement is in too

    def reader():
        got = []
        for _ in sizes:
            v = c1.recv(0)
            got.append((v.numel(), float(v[0]), float(v[-1])))
            c1.send(1, 0)
        return got

    _, got = run_ranks(writer, reader)
    assert got == [(n, float(i), float(i)) for i, n in enumerate(sizes)]
    # The slot and at most the one generation before it, never a growing pile.
    assert max(held) <= 2, held
    _destroy(c0, c1)


def test_a_writer_blocks_only_when_its_reader_is_slots_values_behind(prefix):
    c0, c1 = _group(prefix, slots=2)
    done = []

    def writer():
        for i in range(3):
            c0.send(torch.full((4,), float(i)), 1)
            done.append(i)

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while len(done) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)
    assert done == [0, 1]  # the third value waits for a free slot
    assert c1.recv(0).tolist() == [0.0] * 4
    t.join(10)
    assert not t.is_alive() and done == [0, 1, 2]
    assert [c1.recv(0)[0].item() for _ in range(2)] == [1.0, 2.0]
    # A reader that stays behind: the writer's wait ends at its timeout.
    c0.send(torch.ones(2), 1)
    c0.send(torch.ones(2), 1)
    with pytest.raises(ChannelTimeoutError):
        c0.send(torch.ones(2), 1, timeout=0.3)
    _destroy(c0, c1)


def test_error_values_between_good_values_on_dynamic_and_static_edges(prefix):
    c0, c1 = _group(prefix, slots=2)
    err = ErrorValue.from_exception(KeyError("bad"), actor="a", method="m")

    def writer():
        for i in range(6):
            c0.send(err if i % 2 else {"t": torch.full((3,), float(i)), "i": i}, 1)
        for i in range(6):
            c0.send(err if i % 3 == 1 else torch.full((5,), float(i)), 1, shape=(5,),
                    dtype="float32")

    def reader():
        dyn = [c1.recv(0) for _ in range(6)]
        static = [c1.recv(0, shape=(5,), dtype="float32") for _ in range(6)]
        return dyn, static

    _, (dyn, static) = run_ranks(writer, reader)
    for i, v in enumerate(dyn):
        if i % 2:
            assert type(v) is ErrorValue and "bad" in v.message
        else:
            assert v["i"] == i and v["t"].tolist() == [float(i)] * 3
    for i, v in enumerate(static):
        if i % 3 == 1:
            assert type(v) is ErrorValue and "bad" in v.message
        else:
            assert v.tolist() == [float(i)] * 5
    _destroy(c0, c1)


def test_abort_wakes_a_static_receive_waiting_in_the_transport(prefix):
    # A static edge's receive is posted before its header: it waits for the writer's
    # notice inside the transport. The reader's own abort (what teardown does from
    # another thread) ends it.
    c0, c1 = _group(prefix)
    got = ended_by(lambda: c1.recv(0, shape=(4,), dtype="float32", timeout=None), c1.abort)
    assert type(got) is ChannelClosedError
    with pytest.raises(ChannelClosedError):
        c1.recv(0)
    _destroy(c0, c1)


def test_abort_wakes_a_writer_waiting_for_a_slot(prefix):
    c0, c1 = _group(prefix, slots=1)
    c0.send(torch.ones(2), 1)
    c1.recv(0)
    c0.send(torch.ones(2), 1)  # slot 0 is in use until the reader takes this one
    got = ended_by(lambda: c0.send(torch.ones(2), 1, timeout=None), c0.abort)
    assert type(got) is ChannelClosedError
    _destroy(c0, c1)


def test_collectives_of_three_ranks_over_p2p_and_a_local_reduction(prefix):
    comms = _group(prefix, world=3)

    def rank(r):
        c = comms[r]
        x = torch.tensor([r + 1.0, -r, 2.0 * r])
        return (c.allreduce(x, "sum").tolist(), c.allreduce(x, "max").tolist(),
                c.allreduce(torch.tensor([r + 1, 7]), "avg").tolist(),
                [t.tolist() for t in c.allgather(torch.tensor([[r, r]]))],
                c.reducescatter(torch.arange(6.0) * (r + 1), "sum").tolist(),
                c.allreduce(torch.tensor([True, r == 1]), "sum").tolist(),
                c.allreduce(torch.zeros(0), "sum").shape[0])

    out = run_ranks(*(lambda r=r: rank(r) for r in range(3)))
    for r, (s, mx, avg, gathered, rs, anyof, empty) in enumerate(out):
        assert s == [6.0, -3.0, 6.0] and mx == [3.0, 0.0, 4.0]
        assert avg == [2, 7]  # integers: floor of the mean, as everywhere
        assert gathered == [[[0, 0]], [[1, 1]], [[2, 2]]]
        assert rs == [6.0 * (2 * r), 6.0 * (2 * r + 1)]
        assert anyof == [True, True] and empty == 0
    _destroy(*comms)


def test_collective_errors_host_values_and_mismatches_are_the_protocols(prefix):
    # Decided by the status agreement before any transfer, on every member, as over NCCL
    # (a dict in an allgather is a TypeError there too, not a host exchange).
    c0, c1 = _group(prefix)
    err = ErrorValue.from_exception(RuntimeError("r1"))

    def rank(c, r):
        out = {"err": c.allreduce(err if r else torch.ones(2), "sum").message,
               "host": c.allgather(np.array([r, 5])),
               "host_sum": c.allreduce(np.array([r + 1.0]), "sum").tolist()}
        for key, call in [("shape", lambda: c.allreduce(torch.ones(2 + r))),
                          ("dict", lambda: c.allgather({"r": r})),
                          ("uneven", lambda: c.reducescatter(torch.ones(3))),
                          ("complex", lambda: c.allreduce(torch.ones(2, dtype=torch.complex64),
                                                          "max"))]:
            try:
                call()
            except (TypeError, ValueError) as e:
                out[key] = type(e)
        out["after"] = c.allreduce(torch.tensor([1.0 + r]), "sum").tolist()
        return out

    a, b = run_ranks(lambda: rank(c0, 0), lambda: rank(c1, 1))
    for o in (a, b):
        assert o["err"] == "r1" and [h.tolist() for h in o["host"]] == [[0, 5], [1, 5]]
        assert o["host_sum"] == [3.0]
        assert o["shape"] is ValueError and o["dict"] is TypeError
        assert o["uneven"] is CollectiveShapeError and o["complex"] is TypeError
        assert o["after"] == [3.0]  # the group keeps working
    _destroy(c0, c1)


def test_warm_up_connects_every_pair_of_a_collective_group(prefix):
    comms = _group(prefix, world=3)
    run_ranks(*(lambda c=c: c.warm_up([], 10, collective=True) for c in comms))
    for c in comms:
        tr = c.transport
        assert sorted(tr._out) == sorted(tr._in) == [p for p in range(3) if p != c.rank]
        assert all(o.peer_events is not None for o in tr._out.values())
    _destroy(*comms)


def test_sorted_side_channels_keep_each_kind_in_order(prefix):
    a, b = (SortedSideChannels(ShmSideChannels(prefix, r, 2), {"t:x", "t:y"})
            for r in (0, 1))
    for msg in [("t:x", 1), "p1", ("t:y", 1), ("t:x", 2), ("other", 0), "p2"]:
        a.send(1, msg, 5)
    assert b.recv_kind(0, "t:y", 5) == ("t:y", 1)
    assert [b.recv(0, 5) for _ in range(3)] == ["p1", ("other", 0), "p2"]
    assert [b.recv_kind(0, "t:x", 5) for _ in range(2)] == [("t:x", 1), ("t:x", 2)]
    with pytest.raises(ChannelTimeoutError):
        b.recv(0, 0.2)
    # Held messages go with the next message to their peer, in order...
    a.hold(1, ("t:x", 3))
    a.hold(1, ("t:y", 2))
    a.send(1, "p3", 5)
    assert b.recv(0, 5) == "p3" and b.recv_kind(0, "t:y", 5) == ("t:y", 2)
    assert b.recv_kind(0, "t:x", 5) == ("t:x", 3)
    # ...or before their holder waits for anything (its peer may need them first).
    a.hold(1, ("t:x", 4))
    with pytest.raises(ChannelTimeoutError):
        a.recv(1, 0.2)
    assert b.recv_kind(0, "t:x", 5) == ("t:x", 4)
    for s in (a, b):
        s.close(linger=0)


def test_a_receive_that_posted_other_sizes_fails_clearly(prefix):
    c0, c1 = _group(prefix)
    c0.send(torch.ones(3), 1)  # dynamic edge, but the reader declares a static one
    with pytest.raises(ChannelError, match="sent buffers of \\[12\\] bytes.*posted \\[16\\]"):
        c1.recv(0, shape=(4,), dtype="float32")
    _destroy(c0, c1)
