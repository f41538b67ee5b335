"""The CPU communicator's rendezvous (send returns only once the peer's recv took the value),
acknowledged by the receiver's ring cursor, and ``ShmRingWriter.wait_taken`` under it.

Ranks run in threads of this process (futex waits release the GIL); the process tests in
``test_chan_procs`` and ``test_chan_liveness`` cover separate processes and dead peers.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from cgc.runtime.channels import (
    ChannelClosedError,
    ChannelTimeoutError,
    ShmRingReader,
    ShmRingWriter,
)
from cgc.runtime.comm import CpuCommunicator


def _in_thread(fn):
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e
        out["at"] = time.monotonic()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


@pytest.fixture(params=[0.0, 50.0], ids=["sleep", "spin"])
def pair(prefix, request):
    cs = [CpuCommunicator(prefix, r, 2, attach_timeout=10, spin_us=request.param)
          for r in (0, 1)]
    yield cs
    for c in cs:
        c.destroy(linger=0)


def test_send_returns_only_after_the_recv_took_the_value(pair):
    c0, c1 = pair
    t, out = _in_thread(lambda: c0.send(torch.arange(512, dtype=torch.float32), 1, timeout=20))
    time.sleep(0.4)
    assert t.is_alive() and not out, "send returned before any recv"
    took = time.monotonic()
    got = c1.recv(0, timeout=20)
    t.join(20)
    assert not t.is_alive() and "error" not in out and out["at"] >= took
    assert torch.equal(got, torch.arange(512, dtype=torch.float32))


@pytest.mark.parametrize("n", [3, 16 * 1024, 256 * 1024])  # inline, block, large block
def test_values_of_every_size_arrive_exact_in_order(pair, n):
    c0, c1 = pair
    vals = [np.arange(n, dtype=np.float32) + k for k in range(5)]
    t, out = _in_thread(lambda: [c0.send(v, 1, timeout=20) for v in vals]
                        + [c0.recv(1, timeout=20)])
    got = [c1.recv(0, timeout=20) for _ in vals]
    c1.send("done", 0, timeout=20)
    t.join(20)
    assert "error" not in out and out["value"][-1] == "done"
    for g, v in zip(got, vals, strict=True):
        np.testing.assert_array_equal(g, v)


def test_a_send_nobody_receives_times_out(pair):
    c0, _ = pair
    with pytest.raises(ChannelTimeoutError):
        c0.send("never taken", 1, timeout=0.5)


def test_both_ranks_sending_first_blocks_as_on_nccl(pair):
    """The schedule NCCL deadlocks on (each rank sends, then receives) blocks here too: a
    buffered send would let both return and hide it."""
    c0, c1 = pair
    t, out = _in_thread(lambda: c0.send("a", 1, timeout=1.0))
    with pytest.raises(ChannelTimeoutError):
        c1.send("b", 0, timeout=1.0)
    t.join(20)
    assert isinstance(out.get("error"), ChannelTimeoutError)


def test_destroying_the_receiver_wakes_a_blocked_sender(pair):
    c0, c1 = pair
    t, out = _in_thread(lambda: c0.send("hello", 1, timeout=20))
    assert c1.recv(0, timeout=20) == "hello"
    t.join(20)
    t, out = _in_thread(lambda: c0.send("stuck", 1, timeout=20))
    time.sleep(0.3)
    c1.destroy(linger=0)
    t.join(10)
    assert not t.is_alive(), "send stayed blocked after its receiver closed"
    assert isinstance(out.get("error"), ChannelClosedError)


def test_wait_taken_waits_for_the_read_and_sees_a_close(prefix):
    w = ShmRingWriter.create(prefix + "r", slots=2, slot_bytes=256)
    r = ShmRingReader.attach(prefix + "r", 0)
    try:
        w.wait_taken(timeout=0.1)  # nothing written: nothing to wait for
        w.write(1)
        w.write(2)
        with pytest.raises(ChannelTimeoutError):
            w.wait_taken(timeout=0.3)
        assert r.read(timeout=1) == 1
        with pytest.raises(ChannelTimeoutError):
            w.wait_taken(timeout=0.3)  # every value, not just the first
        assert r.read(timeout=1) == 2
        w.wait_taken(timeout=0.1)
        w.write(3)
        t, out = _in_thread(lambda: w.wait_taken(timeout=20))
        time.sleep(0.2)
        r.close()  # the reader leaves without taking 3
        t.join(10)
        assert isinstance(out.get("error"), ChannelClosedError)
    finally:
        r.detach()
        w.close()


def test_a_reduction_of_plain_numbers_is_a_type_error_on_every_rank(pair):
    # A Python int has no shape: every rank gets a TypeError that says what to pass (was an
    # AttributeError from inside the reduction).
    runs = [_in_thread(lambda c=c, r=r: c.allreduce(r + 1, "sum", timeout=10))
            for r, c in enumerate(pair)]
    for t, out in runs:
        t.join(15)
        err = out.get("error")
        assert isinstance(err, TypeError), out
        assert "sum reduction takes numpy arrays or torch tensors, not int" in str(err)
