"""Fault suite, driver side: a result the driver cannot decode, and a driver killed with
SIGKILL. Each case has a generous time bound and checks that nothing is left."""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys

import fault_graphs as F
import numpy as np
import pytest
from leaks import alive, wait_until

from cgc.runtime import RemoteError
from cgc.runtime.channels import ShmRingReader, list_segments


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
                with pytest.raises(RemoteError) as info:  # the error, not a get timeout
                    refs[i].get()
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
    [line] = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")]
    out = json.loads(line[len("RESULT"):])
    assert out["segments"] >= 5  # 4 rings and at least one data block existed
    # No later start() and no sweep here: the dead driver's janitor removes them.
    assert wait_until(lambda: list_segments(out["prefix"]) == [], 20), \
        list_segments(out["prefix"])
    assert wait_until(lambda: not any(alive(p) for p in out["pids"]), 30), "actors left"
    assert wait_until(lambda: not alive(out["janitor"]), 10), "the janitor stayed"
    assert list_segments(out["prefix"]) == []


def test_interrupt_while_the_driver_decodes_leaves_the_value_unread(ray_cluster,
                                                                     leaves_nothing):
    os.environ.pop("CGC_FAULTS_INTERRUPTED", None)
    with F.gifts("f_interrupt").start(get_timeout=30) as g:
        refs = [g.execute(x) for x in (1, -99)]  # within the capacity: no read at submit
        assert np.array_equal(refs[0].get(), np.full(3, 1))
        with pytest.raises(KeyboardInterrupt):
            refs[1].get()
        refs += [g.execute(x) for x in (2, 4)]
        # The read stopped before it took the value: asking again decodes it.
        got = refs[1].get()
        assert isinstance(got, F.DriverCannotDecode) and got.x == -99
        assert refs[3].get() == 4 and refs[2].get() == 2
        assert g.execute(3).get().tolist() == [3, 3, 3]
    leaves_nothing(g)


def _interrupt_once_after_a_value_is_taken():
    """A trace function that raises KeyboardInterrupt once, in the ring reader's ``read``,
    on the line right after the cursor store of an inline value (the value is consumed but
    not returned yet): where a Ctrl-C does the most harm."""
    lines, first = inspect.getsourcelines(ShmRingReader.read)
    [after] = [first + i for i in range(1, len(lines)) if lines[i].strip() == "return value"
               and lines[i - 1].strip() == "self._advance(seq)"]
    code, fired = ShmRingReader.read.__code__, []

    def local(frame, event, arg):
        if event == "line" and frame.f_lineno == after and not fired:
            fired.append(True)
            raise KeyboardInterrupt("Ctrl-C right after the value was taken")
        return local

    return (lambda frame, event, arg: local if frame.f_code is code else None), fired


def test_interrupt_after_the_driver_took_a_value_gives_that_execution_an_error(
        ray_cluster, leaves_nothing):
    with F.gifts("f_lost").start(get_timeout=30) as g:
        assert set(g.channel_bindings.values()) == {"shm"}
        refs = [g.execute(x) for x in (2, 4)]  # within the capacity: no read at submit
        assert refs[0].get() == 2
        tracer, fired = _interrupt_once_after_a_value_is_taken()
        sys.settrace(tracer)
        try:
            with pytest.raises(KeyboardInterrupt):
                refs[1].get()
        finally:
            sys.settrace(None)
        assert fired
        refs += [g.execute(x) for x in (6, 8)]
        with pytest.raises(RemoteError) as info:
            refs[1].get()
        err = info.value
        assert (err.exec_index, err.actor, err.method) == (1, "stage", "gift")
        assert "execution 1 was lost by an interrupted read" in str(err)
        assert refs[3].get() == 8 and refs[2].get() == 6  # never execution 1's neighbours
        assert g.execute(10).get() == 10
    leaves_nothing(g)
