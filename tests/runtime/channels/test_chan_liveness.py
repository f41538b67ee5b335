"""Dead peers are noticed by the channel itself: blocked reads/writes end with PeerDiedError."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading

import chan_children as kids
import pytest

from cgc.runtime.channels import (
    ChannelClosedError,
    ChannelTimeoutError,
    PeerDiedError,
    ShmRingReader,
    ShmRingWriter,
    list_segments,
    sweep_dead_segments,
)
from cgc.runtime.comm import CpuCommunicator

CTX = mp.get_context("spawn")


def _start(fn, *args):
    q = CTX.Queue()
    p = CTX.Process(target=fn, args=(q, *args))
    p.start()
    msg = q.get(timeout=60)
    assert msg[0] == "ready", msg
    return p


def _blocked(call):
    """Run ``call`` in a thread; returns (thread, list that receives its exception)."""
    errs: list[BaseException] = []

    def run():
        try:
            call()
        except BaseException as e:  # noqa: BLE001 - the test asserts on it
            errs.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, errs


def _kill(p):
    os.kill(p.pid, signal.SIGKILL)
    p.join(60)


def test_writer_blocked_forever_fails_typed_when_its_reader_is_killed(prefix):
    w = ShmRingWriter.create(prefix + "c", slots=2, slot_bytes=256)
    p = _start(kids.attach_and_sleep, prefix + "c", 0)
    w.write(1)
    w.write(2)  # the ring is full: the next write waits for reader 0
    t, errs = _blocked(lambda: w.write(3, timeout=None))
    _kill(p)
    t.join(60)
    assert not t.is_alive(), "write() stayed blocked after its reader died"
    (err,) = errs
    assert isinstance(err, PeerDiedError) and isinstance(err, ChannelClosedError)
    assert err.pid == p.pid and err.role == "reader 0" and err.channel == prefix + "c"
    assert w.closed  # poisoned, so every other party of the channel learns it too
    w.close()


def test_reader_blocked_forever_fails_typed_when_its_writer_is_killed(prefix):
    p = _start(kids.create_and_sleep, prefix + "c")
    r = ShmRingReader.attach(prefix + "c", 0)
    t, errs = _blocked(lambda: r.read(timeout=None))
    _kill(p)
    t.join(60)
    assert not t.is_alive(), "read() stayed blocked after its writer died"
    (err,) = errs
    assert isinstance(err, PeerDiedError) and err.pid == p.pid and err.role == "writer"
    r.detach()
    assert prefix + "c" in sweep_dead_segments()  # what the dead writer left
    assert list_segments(prefix) == []


def test_cpu_communicator_recv_fails_typed_when_the_peer_rank_is_killed(prefix):
    p = _start(kids.comm_rank_then_sleep, prefix, 1, 2)
    c = CpuCommunicator(prefix, 0, 2, attach_timeout=30)
    t, errs = _blocked(lambda: c.recv(1, timeout=None))
    _kill(p)
    t.join(60)
    assert not t.is_alive(), "recv() stayed blocked after the peer rank died"
    (err,) = errs
    assert isinstance(err, PeerDiedError) and err.pid == p.pid
    c.destroy(linger=0)
    sweep_dead_segments()
    assert list_segments(prefix) == []


def test_live_peers_are_never_declared_dead(prefix):
    w = ShmRingWriter.create(prefix + "c", slots=1, slot_bytes=256)
    r = ShmRingReader.attach(prefix + "c", 0)
    w.write(0)
    # Both sides wait longer than several liveness slices; the peer is alive all along.
    with pytest.raises(ChannelTimeoutError):
        w.write(1, timeout=1.2)
    assert r.read(timeout=1) == 0
    with pytest.raises(ChannelTimeoutError):
        r.read(timeout=1.2)
    r.detach()
    w.close()
