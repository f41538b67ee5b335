"""Shared-memory ring: round trips, broadcast, ring full, timeouts, growth, borrowing."""

from __future__ import annotations

import gc
import pickle
import threading
import time

import numpy as np
import pytest
import torch

from cgc.plan_schema.errors import CgcError
from cgc.runtime.channels import (
    ChannelClosedError,
    ChannelTimeoutError,
    ErrorValue,
    ShmRingReader,
    ShmRingWriter,
    list_segments,
)
from cgc.runtime.channels.pool import DEFAULT_KEEP_FREE


def _pair(name, **kw):
    w = ShmRingWriter.create(name, **kw)
    rs = [ShmRingReader.attach(name, i) for i in range(kw.get("num_readers", 1))]
    return w, rs


def _close(w, rs):
    for r in rs:
        r.detach()
    w.close()


@pytest.mark.parametrize("value", [
    0, -5, 2**70, 3.5, None, True, "héllo", b"", b"x" * 1000, {"a": [1, (2, 3)], "b": {4}},
])
def test_round_trip_plain(prefix, value):
    w, (r,) = _pair(prefix + "c", slots=2, slot_bytes=4096)
    w.write(value)
    assert r.read(timeout=1) == value
    _close(w, [r])


def test_round_trip_numpy_and_torch(prefix):
    w, (r,) = _pair(prefix + "c", slots=2, slot_bytes=1 << 16, zero_copy_min=1024)
    vals = [np.arange(12, dtype=np.int16).reshape(3, 4), np.asfortranarray(np.ones((30, 40))),
            np.arange(100)[::3], np.zeros(0, dtype=np.float32),
            torch.arange(6.0).reshape(2, 3), torch.ones(1000, dtype=torch.bfloat16),
            torch.tensor(True), {"t": torch.zeros(3, 4), "a": np.ones(5000)}]
    for v in vals:
        w.write(v)
        out = r.read(timeout=1)
        if isinstance(v, dict):
            assert torch.equal(out["t"], v["t"]) and np.array_equal(out["a"], v["a"])
        elif isinstance(v, torch.Tensor):
            assert out.dtype == v.dtype and torch.equal(out, v)
        else:
            assert out.dtype == v.dtype and np.array_equal(out, v)
    _close(w, [r])


def test_broadcast_one_write_many_readers(prefix):
    w, rs = _pair(prefix + "c", slots=3, slot_bytes=1024, num_readers=3)
    for i in range(10):
        w.write(i)
        assert [r.read(timeout=1) for r in rs] == [i] * 3
    _close(w, rs)


def test_ring_full_blocks_then_proceeds(prefix):
    w, (r0, r1) = _pair(prefix + "c", slots=2, slot_bytes=1024, num_readers=2)
    w.write(1)
    w.write(2)
    assert r0.read() == 1 and r0.read() == 2
    with pytest.raises(ChannelTimeoutError):  # r1 (the slowest) is still 2 behind
        w.write(3, timeout=0.05)
    reading = threading.Event()

    def later():
        time.sleep(0.1)
        reading.set()  # before read(): the writer may wake before read() returns
        r1.read()

    t = threading.Thread(target=later)
    t.start()
    w.write(3, timeout=5)
    assert reading.is_set(), "the write went through before the slowest reader freed a slot"
    t.join()
    assert r1.read() == 2 and r1.read() == 3 and r0.read() == 3
    _close(w, [r0, r1])


def test_read_timeout_and_error_types(prefix):
    w, (r,) = _pair(prefix + "c", slot_bytes=256)
    t0 = time.monotonic()
    with pytest.raises(ChannelTimeoutError) as ei:
        r.read(timeout=0.2)
    assert time.monotonic() - t0 >= 0.15  # a timeout never fires early
    assert isinstance(ei.value, TimeoutError) and isinstance(ei.value, CgcError)
    assert ei.value.exit_code == 1
    with pytest.raises(ChannelTimeoutError):
        r.read(timeout=0)
    _close(w, [r])


def test_close_wakes_blocked_reader_and_drains_first(prefix):
    w, (r,) = _pair(prefix + "c", slot_bytes=256)
    w.write("last")
    closer = threading.Timer(0.1, w.close)
    closer.start()
    assert r.read(timeout=60) == "last"
    with pytest.raises(ChannelClosedError):  # the close ends the wait, not the timeout
        r.read(timeout=60)
    r.detach()
    closer.join()  # the close unlinks after it wakes the reader: let it finish
    with pytest.raises(ChannelClosedError):
        w.write(1)


def test_poison_by_name_wakes_writer(prefix):
    w, (r,) = _pair(prefix + "c", slots=1, slot_bytes=256)
    w.write(1)
    threading.Timer(0.1, ShmRingWriter.poison_by_name, (prefix + "c",)).start()
    with pytest.raises(ChannelClosedError, match="poisoned"):
        w.write(2, timeout=5)
    assert ShmRingWriter.poison_by_name(prefix + "nope") is False
    _close(w, [r])


def test_zero_copy_view_of_shared_memory(prefix):
    w, (r,) = _pair(prefix + "c", slot_bytes=4096)
    a = np.arange(1 << 18, dtype=np.float32)
    w.write(a)
    out = r.read(timeout=1)
    assert np.array_equal(out, a) and not out.flags.owndata and not out.flags.writeable
    import mmap
    assert any(isinstance(o, mmap.mmap) for o in _base_chain(out))  # views a shm mapping
    t = torch.arange(1 << 16, dtype=torch.float64)
    w.write(t)
    tout = r.read(timeout=1)
    assert torch.equal(tout, t)
    addr = tout.data_ptr()
    carrier_maps = [s.mm for s, _u in r._blocks._maps.values()]
    assert any(_inside(addr, m) for m in carrier_maps)
    del out, tout
    _close(w, [r])


def _base_chain(x):
    seen = []
    while x is not None and len(seen) < 10:
        seen.append(x)
        x = getattr(x, "base", None) if not isinstance(x, memoryview) else x.obj
    return seen


def _inside(addr, mm):
    import ctypes
    c = ctypes.c_char.from_buffer(mm)
    base = ctypes.addressof(c)
    del c
    return base <= addr < base + len(mm)


def test_held_result_never_blocks_nor_is_overwritten(prefix):
    w, (r,) = _pair(prefix + "c", slots=1, slot_bytes=1024)
    held = []
    for i in range(20):  # the user keeps every result: writer must never block on them
        w.write(np.full(100_000, i, dtype=np.int64), timeout=2)
        held.append(r.read(timeout=2))
    assert all((h == i).all() for i, h in enumerate(held))
    assert w.data_blocks() == 20
    held.clear()
    gc.collect()
    for i in range(20):
        w.write(np.full(100_000, i, dtype=np.int64), timeout=2)
        assert (r.read(timeout=2) == i).all()
    assert w.data_blocks() <= DEFAULT_KEEP_FREE + 1  # released blocks reused; extras unlinked
    assert len(list_segments(prefix)) == 1 + w.data_blocks()
    _close(w, [r])


def test_large_values_grow_without_leak(prefix):
    w, (r,) = _pair(prefix + "c", slots=2, slot_bytes=256)
    for n in (10, 1000, 100_000, 3_000_000, 50, 2_000_000):
        v = b"y" * n  # in-band pickle larger than a slot
        w.write(v)
        assert r.read(timeout=2) == v
        assert w.data_blocks() <= DEFAULT_KEEP_FREE
    r.detach()
    w.close()
    assert list_segments(prefix) == []


def test_error_value_travels(prefix):
    w, (r,) = _pair(prefix + "c", slot_bytes=4096)
    try:
        raise ValueError("boom")
    except ValueError as e:
        ev = ErrorValue.from_exception(e, actor="a1", method="fwd", exec_index=7)
    w.write(ev)
    out = r.read(timeout=1)
    assert isinstance(out, ErrorValue) and isinstance(out.exception, ValueError)
    assert (out.actor, out.method, out.exec_index, out.type_name) == ("a1", "fwd", 7, "ValueError")
    assert "boom" in out.traceback_text

    class Unpicklable(Exception):  # local class: cannot be pickled
        pass

    w.write(ErrorValue.from_exception(Unpicklable("x"), actor="a"))
    out = r.read(timeout=1)
    assert out.exception is None and out.type_name.endswith("Unpicklable") and out.message == "x"
    _close(w, [r])


def test_unpicklable_value_leaves_channel_usable(prefix):
    w, (r,) = _pair(prefix + "c", slot_bytes=4096)
    with pytest.raises((AttributeError, TypeError, pickle.PicklingError)):
        w.write(lambda: 1)
    w.write(5)
    assert r.read(timeout=1) == 5
    _close(w, [r])


def test_ring_refuses_architectures_it_is_not_proven_on(prefix, monkeypatch):
    import collections
    import os

    from cgc.runtime.channels import TcpReader, TcpWriter, UnsupportedPlatformError
    from cgc.runtime.channels import ring_layout as ring_mod

    assert ring_mod.ring_supported()  # this machine is x86-64: the suite runs the ring
    real = os.uname()
    fake = collections.namedtuple("uname", "sysname nodename release version machine")(
        *real[:4], "aarch64")
    monkeypatch.setattr(ring_mod.os, "uname", lambda: fake)
    with pytest.raises(UnsupportedPlatformError, match="host_transport='tcp'"):
        ShmRingWriter.create(prefix + "c", slots=2, slot_bytes=256)
    with pytest.raises(UnsupportedPlatformError):
        ShmRingReader.attach(prefix + "c", 0, timeout=1)
    assert list_segments(prefix) == []
    key = b"k" * 32  # TCP channels are the way on such machines
    w = TcpWriter.listen("127.0.0.1", 0, secret=key)
    r = TcpReader.connect("127.0.0.1", w.port, reader_index=0, secret=key)
    w.write([1, 2])
    assert r.read(timeout=10) == [1, 2]
    r.close()
    w.close()


@pytest.mark.parametrize(("own", "run_default", "expect"), [
    (4096, 8192, 4096),  # the channel's own size
    (0, 8192, 8192),  # 0: the run's default
    (0, 0, 1 << 20),  # no default given: the table's
    (64, 0, 256),  # never below the floor (MIN_SLOT_BYTES)
])
def test_a_plan_channel_ring_is_sized_by_the_schema_rule(prefix, own, run_default, expect):
    from cgc.plan_schema import plan_pb2 as pb
    from cgc.plan_schema.defaults import ring_slot_bytes
    from cgc.runtime.endpoints import open_writer

    ch = pb.Channel(id=1, kind=pb.CHAN_HOST, writer="a", readers=["b"], slots=2,
                    slot_bytes=own)
    w = open_writer(ch, prefix, default_slot_bytes=run_default)
    try:
        assert w.slot_bytes == expect == ring_slot_bytes(own, run_default)
    finally:
        w.close()
