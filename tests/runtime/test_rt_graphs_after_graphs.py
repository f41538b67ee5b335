"""Graphs after graphs in one process: the local Ray cgc starts is sized for the first
plan, so a later, larger plan restarts it once no graph is running; a plan started right
after a teardown waits for the resources Ray is still releasing; with a graph running, a
plan that does not fit is refused, naming what is missing."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import os
    import cgc
    from cgc import InputNode
    from cgc.runtime import PlacementError


    @cgc.actor(num_cpus=1)
    class Step:
        def f(self, x):
            return x + 1


    def chain(n):
        steps = [Step.bind() for _ in range(n)]
        with InputNode() as inp:
            x = inp
            for s in steps:
                x = s.f.bind(x)
        return cgc.compile(x, name=f"chain{n}")


    n = max(2, os.cpu_count() or 1)
    small, big = chain(n), chain(n + 3)
    with small.start(get_timeout=60) as g:          # starts a local Ray with n CPUs
        print("first", g.execute(0).get())
        try:
            big.start()                             # a graph is running: no restart
        except PlacementError as exc:
            print("refused", "needs {CPU: 1}" in str(exc))
    with small.start(get_timeout=60) as g:          # every CPU again, right after teardown
        print("again", g.execute(0).get())
    with big.start(get_timeout=60) as g:            # larger: the idle local Ray restarts
        print("bigger", g.execute(0).get())
""")


def test_second_larger_graph_in_the_same_process(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    n = max(2, os.cpu_count() or 1)
    lines = proc.stdout.splitlines()
    assert f"first {n}" in lines
    assert "refused True" in lines
    assert f"again {n}" in lines
    assert f"bigger {n + 3}" in lines
