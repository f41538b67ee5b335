"""No desync, ever: decode failures and interrupts never shift values to other positions."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import struct
import threading

import chan_children as kids
import numpy as np
import pytest

from cgc.runtime.channels import (
    ChannelClosedError,
    ChannelSequenceError,
    ErrorValue,
    ShmRingReader,
    ShmRingWriter,
    TcpReader,
    TcpWriter,
)

CTX = mp.get_context("spawn")


def _start(fn, *args):
    q = CTX.Queue()
    p = CTX.Process(target=fn, args=(q, *args))
    p.start()
    return p, q


def _result(p, q, timeout=120):
    msg = q.get(timeout=timeout)
    p.join(timeout)
    assert msg[0] == "ok", msg
    return msg[1]


def _values():
    bad = kids.ExplodesElsewhere(os.getpid())  # decodes here, raises in any other process
    vals = [0, bad, 2, np.full(50_000, 3), (bad, np.ones(100_000)), 5, bad, "seven",
            np.arange(10)]
    want = [("val", 0), ("decode", 1, "RuntimeError"), ("val", 2), ("arr", 150_000),
            ("decode", 4, "RuntimeError"), ("val", 5), ("decode", 6, "RuntimeError"),
            ("val", "seven"), ("arr", 45)]
    return vals, want


def test_ring_value_undecodable_in_reader_becomes_its_error_and_later_values_are_right(prefix):
    vals, want = _values()
    w = ShmRingWriter.create(prefix + "c", slots=2, slot_bytes=4096)
    p, q = _start(kids.collect_reader, prefix + "c", len(vals))
    for v in vals:
        w.write(v, timeout=60)
    got, pos = _result(p, q)
    assert got == want
    assert pos == len(vals)
    w.close()


def test_tcp_frame_undecodable_in_reader_becomes_its_error_and_later_values_are_right():
    vals, want = _values()
    w = TcpWriter.listen("127.0.0.1", 0, secret=kids.KEY)
    p, q = _start(kids.collect_tcp_reader, w.port, len(vals))
    w.accept(timeout=60)
    for v in vals:
        w.write(v)
    got, pos = _result(p, q)
    assert got == want
    assert pos == len(vals)
    w.close()


def test_undecodable_block_value_frees_its_block(prefix):
    w = ShmRingWriter.create(prefix + "c", slots=2, slot_bytes=256)
    r = ShmRingReader.attach(prefix + "c", 0)
    never = kids.ExplodesElsewhere(-1)  # no process has PID -1: fails here too
    for i in range(6):
        w.write((never, np.full(100_000, i)), timeout=5)
        out = r.read(timeout=5)
        assert type(out) is ErrorValue and out.cause == "decode" and out.position == 2 * i
        assert "cannot be decoded" in out.message and out.exception is None
        w.write(np.full(100_000, i), timeout=5)
        assert (r.read(timeout=5) == i).all()
    assert w.data_blocks() == 1  # the failed value's block was released and reused
    r.detach()
    w.close()


def test_read_at_gives_that_position_or_an_error_for_it(prefix):
    w = ShmRingWriter.create(prefix + "c", slots=4, slot_bytes=256)
    r = ShmRingReader.attach(prefix + "c", 0)
    for i in range(3):
        w.write(i * 10)
    assert r.read_at(0, timeout=5) == 0
    assert r.read(timeout=5) == 10  # consumed, but (say) lost by the caller
    lost = r.read_at(1, timeout=5)
    assert type(lost) is ErrorValue and lost.cause == "lost" and lost.position == 1
    assert r.position == 2
    with pytest.raises(ChannelSequenceError, match="value 5 asked for"):
        r.read_at(5, timeout=5)
    assert r.read_at(2, timeout=5) == 20
    assert r.last_nbytes > 0 and w.position == 3
    r.detach()
    w.close()


def test_torn_slot_is_detected_not_delivered(prefix):
    w = ShmRingWriter.create(prefix + "c", slots=2, slot_bytes=256)
    r = ShmRingReader.attach(prefix + "c", 0)
    w.write("a")
    w.write("b")
    # A slot whose header names another value is what a torn or overwritten slot looks like.
    struct.pack_into("<Q", w._mv, w._first + w._stride + 8, 7)
    assert r.read(timeout=5) == "a"
    with pytest.raises(ChannelSequenceError, match="torn or overwritten"):
        r.read(timeout=5)
    assert w.closed  # poisoned: every other party learns it too
    r.detach()
    w.close()


class _Pester:
    """Sends SIGUSR1 to this process at random short intervals; the handler raises
    KeyboardInterrupt in the main thread only while ``armed``."""

    def __init__(self):
        self.armed = False
        self.fired = 0
        self._stop = threading.Event()

    def _handler(self, signum, frame):
        if self.armed:
            self.fired += 1
            raise KeyboardInterrupt

    def _run(self):
        rnd = random.Random(7)
        while not self._stop.is_set():
            os.kill(os.getpid(), signal.SIGUSR1)
            self._stop.wait(rnd.uniform(0.0, 0.003))

    def __enter__(self):
        self._old = signal.signal(signal.SIGUSR1, self._handler)
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join(30)
        signal.signal(signal.SIGUSR1, self._old)


def _expected(i):
    return ("arr", 2048 * i) if i % 3 == 0 else ("val", i)


def _make(i):
    return np.full(2048, i) if i % 3 == 0 else i  # 16 KiB arrays: data blocks, zero-copy


def _read_all_under_interrupts(reader, n):
    """read_at(0..n-1) while interrupts fly; returns {position: summary}, the number of
    interrupted reads, and the terminal error (None when all n were read)."""
    got = {}
    interrupted = 0
    with _Pester() as pest:
        pos = 0
        while pos < n:
            try:
                pest.armed = True
                v = reader.read_at(pos, timeout=60)
                pest.armed = False
            except KeyboardInterrupt:
                pest.armed = False
                interrupted += 1
                continue
            except (ChannelSequenceError, ChannelClosedError) as e:
                pest.armed = False
                return got, interrupted, e
            got[pos] = kids.summarize(v)
            pos += 1
    return got, interrupted, None


def _check(got, n, end):
    lost = 0
    for pos, s in got.items():
        if s[0] == "lost":
            assert s[1:] == (pos, "LostValue"), (pos, s)
            lost += 1
        else:
            assert s == _expected(pos), (pos, s)  # never another position's value
    return lost


def test_ring_interrupts_during_reads_never_shift_values(prefix):
    n = 1500
    w = ShmRingWriter.create(prefix + "c", slots=4, slot_bytes=4096, zero_copy_min=1024)
    r = ShmRingReader.attach(prefix + "c", 0)
    t = threading.Thread(target=lambda: [w.write(_make(i), timeout=120) for i in range(n)])
    t.start()
    got, interrupted, end = _read_all_under_interrupts(r, n)
    t.join(120)
    assert end is None and len(got) == n
    _check(got, n, end)
    assert interrupted > 0  # the test did interrupt reads
    r.detach()
    w.close()


def test_tcp_interrupts_during_reads_never_shift_values():
    n = 1500
    w = TcpWriter.listen("127.0.0.1", 0, secret=kids.KEY)
    r = TcpReader.connect("127.0.0.1", w.port, reader_index=0, secret=kids.KEY)
    w.accept(timeout=30)

    def produce():
        try:
            for i in range(n):
                w.write(_make(i))
        except ChannelClosedError:
            pass  # the reader gave up (typed error): nothing left to send to

    t = threading.Thread(target=produce)
    t.start()
    got, interrupted, end = _read_all_under_interrupts(r, n)
    r.close()
    t.join(120)
    # Every value delivered is the right one for its position; an interrupt that lands
    # between a receive and its bookkeeping may end the stream, but only with a typed error.
    _check(got, n, end)
    assert end is None or isinstance(end, ChannelSequenceError | ChannelClosedError)
    assert end is not None or len(got) == n
    assert interrupted > 0
    w.close()
