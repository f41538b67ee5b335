"""Pass-through values are forwarded by reference, and the bytes live as long as a reader.

A middle party reads an array zero-copy from ring ``a`` and writes it on to ring ``b``
unchanged (alone, sliced, or inside a container): ``b`` carries a reference to ``a``'s
block, not a second copy, and the reader of ``b`` sees the same bytes for as long as it
holds them, whatever the first writer does meanwhile.
"""

from __future__ import annotations

import gc

import numpy as np

from cgc.runtime.channels import ShmRingReader, ShmRingWriter

MiB = 1 << 20


def _pair(name):
    w = ShmRingWriter.create(name, slots=2, slot_bytes=4096)
    return w, ShmRingReader.attach(name, 0)


def test_pass_through_travels_as_a_reference_with_the_same_bytes(prefix):
    w0, mid_in = _pair(prefix + "a")
    mid_out, end = _pair(prefix + "b")
    x = np.arange(4 * MiB, dtype=np.float32)  # 16 MiB
    w0.write(x)
    v = mid_in.read(timeout=10)
    assert mid_in.last_nbytes >= 16 * MiB
    mid_out.write(v)
    got = end.read(timeout=10)
    # A reference, not the 16 MiB again (and the value's size still counts them).
    assert end.last_forwarded_bytes == 16 * MiB
    assert end.last_nbytes - end.last_forwarded_bytes < 4096
    assert got.dtype == x.dtype and np.array_equal(got, x)
    # Inside a container, and a slice of the array: still references, still the bytes.
    mid_out.write({"k": [v[MiB:2 * MiB], 7]})
    got2 = end.read(timeout=10)
    assert end.last_forwarded_bytes == 4 * MiB
    assert end.last_nbytes - end.last_forwarded_bytes < 4096
    assert got2["k"][1] == 7 and np.array_equal(got2["k"][0], x[MiB:2 * MiB])
    del v, got, got2
    gc.collect()
    for ep in (end, mid_in):
        ep.detach()
    mid_out.close()
    w0.close()


def test_forwarded_bytes_live_as_long_as_the_last_reader_holds_them(prefix):
    w0, mid_in = _pair(prefix + "a")
    mid_out, end = _pair(prefix + "b")
    held = []
    for i in range(3):
        w0.write(np.full(MiB, i, dtype=np.float64))  # 8 MiB each
        v = mid_in.read(timeout=10)
        mid_out.write(v)
        del v  # the middle party drops its own view at once
        held.append(end.read(timeout=10))
    # The first writer goes on writing (it would reuse or free any block nobody holds).
    for i in range(6):
        w0.write(np.full(MiB, 100 + i, dtype=np.float64))
        v = mid_in.read(timeout=10)
        assert v[0] == 100 + i
        del v
    gc.collect()
    assert [float(h[0]) for h in held] == [0.0, 1.0, 2.0]
    assert all((h == i).all() for i, h in enumerate(held))
    blocks_while_held = w0.data_blocks()
    assert blocks_while_held >= 3  # the held blocks were not reused
    # Dropped at the end: the middle writer lets go at its next write, the first writer
    # then reuses blocks instead of growing.
    held.clear()
    gc.collect()
    for i in range(8):
        w0.write(np.full(MiB, i, dtype=np.float64))
        v = mid_in.read(timeout=10)
        mid_out.write(v)
        del v
        assert (end.read(timeout=10) == i).all()
        gc.collect()
    assert w0.data_blocks() <= blocks_while_held
    # A value still held when every writer closes keeps its bytes.
    w0.write(np.full(MiB, 42, dtype=np.float64))
    v = mid_in.read(timeout=10)
    mid_out.write(v)
    del v
    last = end.read(timeout=10)
    mid_in.detach()
    mid_out.close()
    w0.close()
    gc.collect()
    assert (last == 42).all()
    end.detach()
    assert (last == 42).all()



def test_let_go_drops_exactly_the_holds_whose_readers_are_done(prefix):
    # A forwarding writer calls it right after publishing, so the release chain runs
    # while the value travels; it must never drop a hold a reader still needs.
    w0, mid_in = _pair(prefix + "a")
    mid_out, end = _pair(prefix + "b")
    x = np.arange(MiB, dtype=np.uint8)
    w0.write(x)
    v = mid_in.read(timeout=10)
    mid_out.write(v)
    del v
    pool = mid_out._pool
    assert len(pool._held) == 1  # end has not read it yet
    pool.let_go()
    assert len(pool._held) == 1
    got = end.read(timeout=10)
    pool.let_go()
    assert len(pool._held) == 1  # end still views the bytes
    w0.write(x + 1)  # the first block is still borrowed: the writer takes another
    assert np.array_equal(got, x)
    del got
    gc.collect()
    pool.let_go()
    assert pool._held == {}  # end is done: the upstream borrow goes
    assert np.array_equal(mid_in.read(timeout=10), x + 1)
    for e in (end, mid_out, mid_in, w0):
        e.close()
