"""Fault suite, driver side: a result the driver cannot decode, and a driver killed with
SIGKILL. Each case has a generous time bound and checks that nothing is left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import fault_graphs as F
import numpy as np
import pytest
from leaks import alive, wait_until

from cgc.runtime import RemoteError
from cgc.runtime.channels import list_segments


def test_decode_failure_in_the_driver_then_every_later_value_is_right(ray_cluster,
                                                                       leaves_nothing):
    inputs = [0, 1, -1, 2, 3, -2, -3, 4, 5, 6]
    with F.gifts().start(get_timeout=30) as g:
        # Several in flight, fetched out of order too: no value may move to another execution.
        refs = [g.execute(x) for x in inputs[:4]]
        refs += [g.execute(x) for x in inputs[4:]]
        order = [3, 0, 2, 1, *range(4, len(inputs))]
        for i in order:
            x = inputs[i]
            if x < 0:
                t0 = time.monotonic()
                with pytest.raises(RemoteError) as info:
                    refs[i].get()
                assert time.monotonic() - t0 < 10
                err = info.value
                assert err.exec_index == i and err.actor == "stage" and err.method == "gift"
                text = str(err)
                assert f"execution {i}" in text and "stage.gift#0" in text and "stage" in text
                assert "could not be decoded" in text and f"value {x} cannot" in text
            else:
                got = refs[i].get()
                want = np.full(3, x) if x % 2 else x
                assert np.array_equal(got, want), (i, x, got)
        # And later executions, one at a time, after the failures.
        for x in [7, -4, 8, 10, 11]:
            if x < 0:
                with pytest.raises(RemoteError, match="could not be decoded"):
                    g.execute(x).get()
            else:
                assert np.array_equal(g.execute(x).get(), np.full(3, x) if x % 2 else x)
    leaves_nothing(g)


def test_sigkill_of_the_driver_leaves_no_segment(ray_address, tmp_path):
    plan = tmp_path / "chain.cgplan"
    F.chain(3, name="f_driver_kill").save(plan)
    script = os.path.join(os.path.dirname(__file__), "driver_killed.py")
    proc = subprocess.run([sys.executable, script, str(plan), ray_address],
                          capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    killed = time.monotonic()
    [line] = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")]
    out = json.loads(line[len("RESULT"):])
    assert out["segments"] >= 5  # 4 rings and at least one data block existed
    # No later start() and no sweep here: the dead driver's janitor removes them.
    assert wait_until(lambda: list_segments(out["prefix"]) == [], 20), \
        list_segments(out["prefix"])
    assert wait_until(lambda: not any(alive(p) for p in out["pids"]), 30), "actors left"
    assert wait_until(lambda: not alive(out["janitor"]), 10), "the janitor stayed"
    assert list_segments(out["prefix"]) == []
    assert time.monotonic() - killed < 40
