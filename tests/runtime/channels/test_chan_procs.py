"""Cross-process behaviour: wake-ups, close/poison, idle CPU, TCP, CPU communicator."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time

import chan_children as kids
import numpy as np
import pytest

from cgc.runtime.channels import (
    ShmRingReader,
    ShmRingWriter,
    TcpWriter,
    list_segments,
)

CTX = mp.get_context("spawn")


def _start(fn, *args):
    q = CTX.Queue()
    p = CTX.Process(target=fn, args=(q, *args))
    p.start()
    return p, q


def _result(p, q, timeout=60):
    msg = q.get(timeout=timeout)
    p.join(timeout)
    assert msg[0] == "ok", msg
    return msg[1]


def test_idle_reader_uses_almost_no_cpu(prefix):
    w = ShmRingWriter.create(prefix + "c", slots=2, slot_bytes=256)
    # Three 1 s windows, judged by the quietest: a reader that spins fails every window,
    # a one-off burst on a loaded 2-core machine (ticks charged to a brief wake-up) only
    # the window it falls in (as tests/runtime/idle_cpu.py does for whole graphs).
    p, q = _start(kids.idle_reader, prefix + "c", 1.0, 3)
    windows = _result(p, q)
    w.close()
    for wall, _cpu, err in windows:
        assert err == "ChannelTimeoutError" and wall >= 0.9  # a timeout never fires early
    share = min(cpu / wall for wall, cpu, _ in windows)
    assert share < 0.02, f"idle reader used {100 * share:.2f}% of a core at best: {windows}"


def test_cross_process_echo_and_close_wakes_reader(prefix):
    w = ShmRingWriter.create(prefix + "a", slots=2, slot_bytes=4096)
    p, q = _start(kids.echo_reader, prefix + "a", prefix + "b", 50)
    r = ShmRingReader.attach(prefix + "b", 0, timeout=30)
    for i in range(50):
        v = np.full(20_000, i) if i % 10 == 0 else i
        w.write(v, timeout=20)
        out = r.read(timeout=20)
        assert (out == v).all() if isinstance(v, np.ndarray) else out == v
    assert _result(p, q) == 50
    r.detach()
    w.close()


def test_close_from_writer_wakes_reader_in_other_process(prefix):
    w = ShmRingWriter.create(prefix + "c", slots=4, slot_bytes=256, num_readers=2)
    procs = [_start(kids.blocked_reader, prefix + "c", i) for i in range(2)]
    for _, q in procs:
        assert q.get(timeout=60) == ("ready",)
    w.write("a")
    w.write("b")
    time.sleep(0.3)  # both readers now sleep in futex_wait (read timeout: 20 s)
    w.close()
    for p, q in procs:
        got, err = _result(p, q)
        assert got == ["a", "b"] and err == "ChannelClosedError"  # woken, not timed out


def test_poison_from_third_party_wakes_writer_in_other_process(prefix):
    p, q = _start(kids.blocked_writer, prefix + "c")
    assert q.get(timeout=60) == ("ready",)
    r = ShmRingReader.attach(prefix + "c", 0)  # attached, never reads: ring fills up
    time.sleep(0.5)
    assert ShmRingWriter.poison_by_name(prefix + "c")
    n, err = _result(p, q)
    assert n == 2 and err == "ChannelClosedError"
    r.detach()


def test_tcp_in_order_across_processes():
    w = TcpWriter.listen("127.0.0.1", 0, secret=kids.KEY)
    p, q = _start(kids.tcp_reader, w.port, 5)
    w.accept(timeout=60)
    for i in range(4):
        w.write(i)
    w.write(np.ones(1 << 20, dtype=np.int64))
    w.close()
    out, end = _result(p, q)
    assert out == [0, 1, 2, 3, 1 << 20] and end == "ChannelClosedError"


def test_tcp_gap_detected():
    from cgc.runtime.channels import TcpReader
    from cgc.runtime.channels.tcp import ChannelSequenceError

    w = TcpWriter.listen("127.0.0.1", 0, secret=kids.KEY)
    t = threading.Thread(target=w.accept)
    t.start()
    r = TcpReader.connect("127.0.0.1", w.port, reader_index=0, secret=kids.KEY)
    t.join()
    w.write(0)
    w._seq += 1  # simulate a lost message
    w.write(2)
    assert r.read(timeout=5) == 0
    with pytest.raises(ChannelSequenceError, match="gap"):
        r.read(timeout=5)
    w.close()
    r.close()


def test_tcp_timeout_and_reader_close_breaks_writer():
    from cgc.runtime.channels import ChannelClosedError, ChannelTimeoutError, TcpReader

    w = TcpWriter.listen("127.0.0.1", 0, secret=kids.KEY)
    t = threading.Thread(target=w.accept)
    t.start()
    r = TcpReader.connect("127.0.0.1", w.port, reader_index=0, secret=kids.KEY)
    t.join()
    with pytest.raises(ChannelTimeoutError):
        r.read(timeout=0.1)
    r.close()
    with pytest.raises(ChannelClosedError):
        for _ in range(100):  # the first sends may still land in the kernel buffer
            w.write(b"x" * 100_000)
    w.close()


def test_cpu_comm_rendezvous(prefix):
    procs = [_start(kids.comm_rank, prefix, r, 2, "rendezvous") for r in range(2)]
    r0 = _result(*procs[0])
    r1 = _result(*procs[1])
    assert r0[0] >= 0.3  # send returned only after the (delayed) recv took the value
    assert r0[1] == "back" and r1 == [[0, 1, 2, 3, 4], {"k": 2}]
    assert list_segments(prefix) == []


def test_cpu_comm_collectives_three_ranks(prefix):
    world = 3
    procs = [_start(kids.comm_rank, prefix, r, world, "coll") for r in range(world)]
    res = [_result(p, q) for p, q in procs]
    xs = [np.arange(6, dtype=np.float64) + r for r in range(world)]
    ts = [np.arange(6, dtype=np.float32) * (r + 1) for r in range(world)]
    ref = {"sum": np.sum, "product": np.prod, "max": np.max, "min": np.min, "avg": np.mean}
    for rank, out in enumerate(res):
        for op, got_x, got_t in out[:5]:
            assert np.allclose(got_x, ref[op](np.stack(xs), axis=0)), (op, rank)
            assert np.allclose(got_t, ref[op](np.stack(ts), axis=0)), (op, rank)
        assert out[5] == ("gather", [x.tolist() for x in xs])
        assert out[6] == ("bigsum", 0 + 1 + 2)
        _, rs_x, rs_t = out[7]
        assert rs_x == np.sum(np.stack(xs), axis=0)[2 * rank:2 * rank + 2].tolist()
        assert rs_t == np.max(np.stack(ts), axis=0)[2 * rank:2 * rank + 2].tolist()
    assert res[0][:7] == res[1][:7] == res[2][:7]  # bit-identical on every rank
    assert list_segments(prefix) == []
