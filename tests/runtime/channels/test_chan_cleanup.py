"""Segment registry: atexit unlinks what a process created; cleanup_segments after a crash."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import struct
import subprocess
import sys
import textwrap

import chan_children as kids
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from cgc.runtime.channels import (
    ShmRingWriter,
    cleanup_segments,
    list_segments,
    segment_dir,
    sweep_dead_segments,
)
from cgc.runtime.channels.serial import Serializer, loads
from cgc.runtime.channels.shm import Segment

_CHILD = textwrap.dedent("""
    import os, sys, numpy as np
    from cgc.runtime.channels import ShmRingWriter, ShmRingReader
    w = ShmRingWriter.create(sys.argv[1] + "c", slots=2, slot_bytes=256)
    r = ShmRingReader.attach(sys.argv[1] + "c", 0)
    w.write(np.ones(1 << 17)); held = r.read()
    print("up", flush=True)
    if sys.argv[2] == "kill":
        os.kill(os.getpid(), 9)
""")


def _run(prefix, mode):
    p = subprocess.run([sys.executable, "-c", _CHILD, prefix, mode], capture_output=True,
                       text=True, timeout=60)
    assert "up" in p.stdout, p.stderr
    return p.returncode


def test_atexit_unlinks_without_close(prefix):
    assert _run(prefix, "exit") == 0
    assert list_segments(prefix) == []


def test_cleanup_after_sigkill(prefix):
    assert _run(prefix, "kill") == -signal.SIGKILL
    assert sorted(list_segments(prefix)) == [prefix + "c", prefix + "c.d1"]
    assert sorted(cleanup_segments(prefix)) == [prefix + "c", prefix + "c.d1"]
    assert list_segments(prefix) == []


def test_sweep_removes_what_a_killed_creator_left_and_keeps_live_segments(prefix):
    live = ShmRingWriter.create(prefix + "live", slots=2, slot_bytes=256)
    q = mp.get_context("spawn").Queue()
    p = mp.get_context("spawn").Process(target=kids.rings_then_sleep, args=(q, prefix + "x-"))
    p.start()
    assert q.get(timeout=60) == ("ready",)
    dead = [prefix + "x-a", prefix + "x-a.d1", prefix + "x-b"]
    assert list_segments(prefix + "x-") == dead
    os.kill(p.pid, signal.SIGKILL)
    p.join(60)
    removed = sweep_dead_segments()
    assert set(dead) <= set(removed)
    assert list_segments(prefix) == [prefix + "live"]  # a live creator's segment stays
    live.close()


def test_sweep_does_not_mistake_a_reused_pid_for_the_creator(prefix):
    s = Segment.create(prefix + "old", 64)
    pid, start, ns = s.creator
    # The same PID with another start time: the creator is gone, its PID now names another
    # (live) process - this one.
    struct.pack_into("<Q", s.mm, 16, start + 1000)
    assert prefix + "old" in sweep_dead_segments()
    assert list_segments(prefix) == []
    s.close()


def test_segments_live_in_a_private_directory(prefix):
    s = Segment.create(prefix + "p", 64)
    st = os.stat(segment_dir())
    assert segment_dir() == f"/dev/shm/cgc-{os.geteuid()}"
    assert st.st_uid == os.geteuid() and st.st_mode & 0o777 == 0o700
    assert os.stat(os.path.join(segment_dir(), prefix + "p")).st_mode & 0o777 == 0o600
    s.close()


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(dtype=hnp.scalar_dtypes(), shape=hnp.array_shapes(min_dims=0, max_side=5)),
       st.sampled_from(["C", "F", "slice"]))
def test_serializer_round_trips_any_numpy_array(a, layout):
    if layout == "F":
        a = np.asfortranarray(a)
    elif layout == "slice" and a.ndim:
        a = a[::2]
    data, raws = Serializer().dumps({"a": a})
    out = loads(data, [bytearray(r) for r in raws])["a"]
    assert out.dtype == a.dtype and out.shape == a.shape
    assert out.tobytes() == np.ascontiguousarray(a).tobytes()
