"""Memory held is bounded: dropped large results give their memory back when dropped."""

from __future__ import annotations

import gc
import os

import numpy as np

from cgc.runtime.channels import ShmRingReader, ShmRingWriter, list_segments, segment_dir

MiB = 1 << 20


def _resident(prefix):
    """Bytes of /dev/shm memory the channel's segments hold now (allocated pages)."""
    return sum(os.stat(os.path.join(segment_dir(), n)).st_blocks * 512
               for n in list_segments(prefix))


def test_dropped_large_results_are_freed_without_another_write(prefix):
    w = ShmRingWriter.create(prefix + "c", slots=2, slot_bytes=4096, keep_free_bytes=20 * MiB)
    r = ShmRingReader.attach(prefix + "c", 0)
    held = []
    for i in range(4):
        w.write(np.full(2 * MiB, i, dtype=np.float64), timeout=10)  # 16 MiB each
        held.append(r.read(timeout=10))
        assert r.last_nbytes >= 16 * MiB
    assert all((h == i).all() for i, h in enumerate(held))
    assert _resident(prefix) >= 64 * MiB
    held.clear()
    gc.collect()
    # No write since: the reader's release alone gave back all but the reusable pool.
    assert _resident(prefix) <= 20 * MiB
    for i in range(3):  # the pool is reused; memory stays bounded
        w.write(np.full(2 * MiB, i, dtype=np.float64), timeout=10)
        assert (r.read(timeout=10) == i).all()
    assert _resident(prefix) <= 20 * MiB
    r.detach()
    w.close()


def test_last_nbytes_counts_inline_and_block_values(prefix):
    w = ShmRingWriter.create(prefix + "c", slots=2, slot_bytes=4096)
    r = ShmRingReader.attach(prefix + "c", 0)
    w.write(b"x" * 100)
    r.read(timeout=5)
    small = r.last_nbytes
    w.write(np.zeros(MiB, dtype=np.uint8))
    r.read(timeout=5)
    assert 100 <= small < 4096 and r.last_nbytes >= MiB
    r.detach()
    w.close()
