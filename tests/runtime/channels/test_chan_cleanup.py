"""Segment registry: atexit unlinks what a process created; cleanup_segments after a crash."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from cgc.runtime.channels import cleanup_segments, list_segments
from cgc.runtime.channels.serial import Serializer, loads

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
