"""CUDA IPC as a describing device transport (``cgc.runtime.comm.cuda_ipc``), without a GPU.

``CudaIpcCommunicator`` is the one device protocol (``DeviceCommunicator``) over
``IpcTransport``; ``ShmIpcDevice`` stands in for the GPU (shared-memory buffers, synchronous
copies), so these run the same protocol and slot code as on a GPU: back-pressure, aborts,
forged descriptions, collectives through the slots (with regrowth and empty inputs).
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
from test_comm_device_protocol_cpu import run_ranks

from cgc.runtime.channels import ChannelClosedError, ChannelError, ChannelTimeoutError
from cgc.runtime.comm.cuda_ipc import CudaIpcCommunicator, IpcTransport
from cgc.runtime.comm.device_protocol import DeviceCommunicator, header_for
from cgc.runtime.comm.testing.shm_ipc_device import ShmIpcDevice
from cgc.runtime.comm.transport import DescribingTransport
from cgc.runtime.gpu.streams import NullStreams
from cgc.runtime.gpu.tensors import cpu_stand_in


def _pair(prefix, slots=2, slot_bytes=1024, timeout=30):
    return [CudaIpcCommunicator(r, 2, prefix=prefix, streams=NullStreams(),
                                device=ShmIpcDevice(prefix, r), slots=slots,
                                slot_bytes=slot_bytes, timeout=timeout, is_device=cpu_stand_in)
            for r in (0, 1)]


def _destroy(*comms):
    for c in comms:
        c.destroy(linger=0.5)


def test_ipc_is_the_device_protocol_over_a_describing_transport(prefix):
    c0, c1 = _pair(prefix)
    try:
        assert isinstance(c0, DeviceCommunicator) and isinstance(c0.transport, IpcTransport)
        assert isinstance(c0.transport, DescribingTransport)
        c0.send(torch.arange(3.0), 1)
        # One FIFO per pair, sorted by kind: the protocol reads past the transport's hello
        # to its header; the transport finds the hello queued.
        assert c1.transport.side is c1.side
        hdr = c1.side.recv(0, timeout=5)
        assert hdr.tag == "p2p" and hdr.ext[:2] == (0, 0)
        assert c1.side.recv_kind(0, "hello", timeout=5)[0] == "hello"
    finally:
        _destroy(c0, c1)


def test_host_values_one_way_need_no_pair_that_way(prefix):
    # No warm-up: rank 1 only ever answers with host values, so it never sets up a pair
    # towards rank 0, and rank 0's receives must not wait for one.
    c0, c1 = _pair(prefix, timeout=5)

    def r0():
        out = []
        for i in range(5):
            c0.send(torch.full((3,), float(i)), 1)
            out.append(c0.recv(1))
        return out

    def r1():
        for _ in range(5):
            c1.send(float(c1.recv(0).sum()), 0)

    got, _ = run_ranks(r0, r1)
    assert got == [0.0, 3.0, 6.0, 9.0, 12.0]
    assert 0 not in c1.transport._out  # noqa: SLF001 - no pair towards rank 0
    _destroy(c0, c1)


def test_a_writer_slots_ahead_waits_and_times_out(prefix):
    c0, c1 = _pair(prefix, slots=2)
    try:
        run_ranks(lambda: c0.warm_up([1], 10), lambda: c1.warm_up([0], 10))
        c0.send(torch.ones(4), 1)
        c0.send(torch.ones(4) * 2, 1)
        t0 = time.monotonic()
        with pytest.raises(ChannelTimeoutError):
            c0.send(torch.ones(4) * 3, 1, timeout=0.3)  # both slots unread
        assert time.monotonic() - t0 >= 0.25
        assert c1.recv(0).tolist() == [1.0] * 4
        c0.send(torch.ones(4) * 3, 1, timeout=5)  # a slot came back
        assert [c1.recv(0).tolist()[0] for _ in range(2)] == [2.0, 3.0]
    finally:
        _destroy(c0, c1)


def test_abort_wakes_a_writer_waiting_for_a_slot(prefix):
    c0, c1 = _pair(prefix, slots=1, timeout=None)
    box: dict = {}
    try:
        c0.send(torch.ones(2), 1)

        def blocked():
            try:
                c0.send(torch.ones(2), 1)
            except ChannelClosedError as e:
                box["e"] = e

        t = threading.Thread(target=blocked, daemon=True)
        t.start()
        time.sleep(0.2)
        assert t.is_alive()  # waiting for the reader's acknowledgement
        c0.abort()
        t.join(10)
        assert not t.is_alive() and isinstance(box.get("e"), ChannelClosedError)
    finally:
        _destroy(c0, c1)


@pytest.mark.parametrize("ext, match", [
    (("no", "ints", (), 0, None), "malformed description"),
    ((5, 0, (0,), 0, None), "sent use 5 slot 0, expected use 0"),
    ((0, 7, (0,), 0, None), "slot 7"),
    ((0, 0, (1 << 30,), 0, None), "outside slot 0"),
    ((0, 0, (0, 256), 0, None), "described 2 buffers, 1 expected"),
    (None, "described no bytes"),
])
def test_a_forged_description_is_a_clear_error(prefix, ext, match):
    c0, c1 = _pair(prefix)
    try:
        run_ranks(lambda: c0.warm_up([1], 10), lambda: c1.warm_up([0], 10))
        c1.transport._in[0].n = 0  # noqa: SLF001 - as if no value had come yet
        hdr, _ = header_for(torch.ones(4), "p2p", cpu_stand_in)
        c0.side.send(1, hdr._replace(ext=ext))
        with pytest.raises(ChannelError, match=match):
            c1.recv(0, timeout=5)
    finally:
        _destroy(c0, c1)


def test_collectives_through_the_slots_with_regrowth_and_empty_inputs(prefix):
    c0, c1 = _pair(prefix, slots=2, slot_bytes=256)

    def rank(c, r):
        big = torch.arange(5000.0) * (r + 1)  # 20 kB through 256-byte slots: regrowth
        return (c.allreduce(big, "sum"),
                [t.tolist() for t in c.allgather(torch.tensor([r, r]))],
                c.reducescatter(torch.arange(4.0) + r, "avg"),
                c.allreduce(torch.empty(0), "sum").shape,
                c.allreduce(torch.tensor([1, 2]) * (r + 1), "max"))

    a, b = run_ranks(lambda: rank(c0, 0), lambda: rank(c1, 1))
    want = torch.arange(5000.0) * 3
    assert torch.equal(a[0], want) and torch.equal(b[0], want)
    assert a[1] == b[1] == [[0, 0], [1, 1]]
    assert a[2].tolist() == [0.5, 1.5] and b[2].tolist() == [2.5, 3.5]
    assert a[3] == b[3] == (0,)
    assert a[4].tolist() == b[4].tolist() == [2, 4]
    _destroy(c0, c1)


def test_static_edge_errors_need_no_dummy_and_the_pair_goes_on(prefix):
    c0, c1 = _pair(prefix)

    def r0():
        c0.send(torch.ones(3), 1, shape=(2,), dtype="float32")  # breaks the declaration
        c0.send(torch.zeros(0), 1)  # an empty tensor: a slot, no copy
        c0.send(torch.full((2,), 7.0), 1, shape=(2,), dtype="float32")

    def r1():
        return [c1.recv(0, shape=(2,), dtype="float32"), c1.recv(0),
                c1.recv(0, shape=(2,), dtype="float32")]

    _, got = run_ranks(r0, r1)
    assert "static edge declares one tensor (2,)/float32" in got[0].message
    assert got[1].shape == (0,) and got[2].tolist() == [7.0, 7.0]
    assert c0.transport._out[1].n == 2  # noqa: SLF001 - the error used no slot
    _destroy(c0, c1)


def test_a_communicator_needs_side_channels():
    with pytest.raises(ValueError, match="pass prefix, side or side_factory"):
        CudaIpcCommunicator(0, 2, streams=NullStreams(), device=ShmIpcDevice("x-", 0))


def test_a_malformed_transport_message_is_a_clear_error(prefix):
    c0, c1 = _pair(prefix, slots=1)
    try:
        run_ranks(lambda: c0.warm_up([1], 10), lambda: c1.warm_up([0], 10))
        c0.send(torch.ones(2), 1)  # c1 does not take it: no acknowledgement comes
        c1.side.send(0, ("ack", 1))  # an acknowledgement missing its fields
        with pytest.raises(ChannelError, match="rank 1 sent a malformed ack message"):
            c0.send(torch.ones(2), 1, timeout=5)  # the one slot needs that acknowledgement
    finally:
        _destroy(c0, c1)


def test_an_uneven_reducescatter_is_a_clear_error_on_every_rank(prefix):
    from cgc.runtime.comm.collective import CollectiveShapeError

    c0, c1 = _pair(prefix)

    def rank(c, r):
        try:
            c.reducescatter(torch.arange(3.0) + 10 * r, "sum")
        except CollectiveShapeError as e:
            err = str(e)
        return err, c.allreduce(torch.ones(2)).tolist()  # the pair goes on

    a, b = run_ranks(lambda: rank(c0, 0), lambda: rank(c1, 1))
    assert a[0] == b[0] == "reducescatter: dim 0 (3) is not divisible by the world size 2"
    assert a[1] == b[1] == [2.0, 2.0]
    _destroy(c0, c1)
