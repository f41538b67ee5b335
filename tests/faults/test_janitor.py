"""The janitor on its own (no Ray): a process that registered graphs and then died by
SIGKILL has their segments removed; graphs it tore down, and other processes' segments,
are left alone; a driver that exits normally leaves no janitor behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from leaks import alive, wait_until

from cgc.runtime.channels import list_segments
from cgc.runtime.channels.shm import Segment

SCRIPT = textwrap.dedent("""
    import json, os, signal, sys
    from cgc.runtime.channels import janitor
    from cgc.runtime.channels.shm import Segment

    kill, doomed, done, actor = sys.argv[1] == "kill", sys.argv[2], sys.argv[3], int(sys.argv[4])
    segs = [Segment.create(f"{doomed}-c{i}", 4096) for i in range(3)]
    janitor.watch(doomed, [actor])
    janitor.watch(done, [])
    janitor.forget(done)
    print(json.dumps({"janitor": janitor.janitor_pid()}), flush=True)
    if kill:
        os.kill(os.getpid(), signal.SIGKILL)
    for s in segs:  # what teardown does: remove the segments, then tell the janitor
        s.close()
    janitor.forget(doomed)
""")


def _run(mode: str, tmp_path, actor_pid: int, *flags: str) -> tuple[int, str, str, str]:
    doomed, done = f"cgc-jt{os.getpid()}a{mode}", f"cgc-jt{os.getpid()}b{mode}"
    proc = subprocess.run([sys.executable, *flags, "-c", SCRIPT, mode, doomed, done,
                           str(actor_pid)],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.stdout, proc.stderr
    return json.loads(proc.stdout.splitlines()[0])["janitor"], doomed, done, proc.stderr


def test_a_killed_processes_segments_go_once_its_actors_are_gone(tmp_path):
    # An "actor" of the doomed graph that outlives the driver for a while.
    actor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])
    mine = Segment.create(f"cgc-jt{os.getpid()}mine-c1", 4096)  # another live creator's
    kept = Segment.create(f"cgc-jt{os.getpid()}bkill-c1", 4096)  # the torn-down graph's name
    try:
        jan, doomed, _, _ = _run("kill", tmp_path, actor.pid)
        assert wait_until(lambda: list_segments(doomed) == [], 10), list_segments(doomed)
        # The janitor waits for the actor, then leaves; the others' segments stay.
        assert alive(jan) or actor.poll() is not None
        actor.wait(timeout=10)
        assert wait_until(lambda: not alive(jan), 10), "the janitor stayed"
        assert list_segments(mine.name) == [mine.name]
        assert list_segments(kept.name) == [kept.name]
    finally:
        mine.close()
        kept.close()
        actor.kill()


def test_a_normal_exit_leaves_no_janitor(tmp_path):
    # -X dev shows every ResourceWarning: the janitor outliving the interpreter's teardown
    # is by design, and must not read as a leaked child or pipe.
    jan, doomed, _, err = _run("exit", tmp_path, os.getpid(), "-X", "dev")
    assert "ResourceWarning" not in err, err
    assert wait_until(lambda: not alive(jan), 10), "the janitor stayed"
    assert list_segments(doomed) == []


def test_the_janitor_holds_only_its_pipe_and_stdio(tmp_path):
    """A descriptor the driver left inheritable (a C library's socket or pipe) is not held
    by the janitor for the driver's whole life."""
    code = textwrap.dedent("""
        import os, time
        from cgc.runtime.channels import janitor
        r, w = os.pipe()
        os.set_inheritable(r, True)
        os.set_inheritable(w, True)
        janitor.watch("cgc-jtfds", [])
        pid = janitor.janitor_pid()
        for _ in range(100):  # the janitor closes them first thing
            fds = sorted(int(f) for f in os.listdir(f"/proc/{pid}/fd"))
            if fds == [0, 1, 2]:
                break
            time.sleep(0.05)
        print(fds)
        janitor.forget("cgc-jtfds")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert proc.stdout.strip() == "[0, 1, 2]", proc.stdout + proc.stderr


FORKING = textwrap.dedent("""
    import json, os, signal, sys, time
    from cgc.runtime.channels import janitor
    from cgc.runtime.channels.shm import Segment

    doomed = sys.argv[1]
    seg = Segment.create(f"{doomed}-c0", 4096)
    janitor.watch(doomed, [])
    child = os.fork()
    if child == 0:  # a forked worker that outlives the driver (multiprocessing's "fork")
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)  # not the test's pipes: it reads until they close
        os.dup2(null, 2)
        time.sleep(30)
        os._exit(0)
    print(json.dumps({"janitor": janitor.janitor_pid(), "child": child}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_a_forked_child_does_not_keep_the_janitor_waiting(tmp_path):
    """The driver dies by SIGKILL while a child it forked lives on: the janitor removes the
    graph's segments at once, not when the child ends (the child closed its copy of the
    janitor's pipe at the fork)."""
    doomed = f"cgc-jt{os.getpid()}fork"
    proc = subprocess.run([sys.executable, "-c", FORKING, doomed], capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)
    got = json.loads(proc.stdout.splitlines()[0])
    try:
        assert alive(got["child"])
        assert wait_until(lambda: list_segments(doomed) == [], 10), list_segments(doomed)
        assert alive(got["child"]), "the child ended first: the test shows nothing"
    finally:
        try:
            os.kill(got["child"], 9)
        except ProcessLookupError:
            pass
