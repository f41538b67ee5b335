"""``ray.shutdown()`` ends cgc's graphs as it ends Ray's: a graph still alive at shutdown
(kept by a notebook, or by pytest after a failed test) is torn down first, its segments go,
and no cgc thread calls Ray afterwards - so the next ``ray.init()`` meets no second Ray
that a background thread started, and nothing segfaults on a dead session's refs.

Each loop runs in its own interpreter, as a user's script does (issue 21's repro)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

LOOPS = 4

DROP_IN = textwrap.dedent(f"""
    import ray, cgc.ray_compat
    from ray.dag import InputNode
    cgc.ray_compat.install()

    @ray.remote
    class A:
        def f(self, x): return x

    kept = []            # as a notebook, or pytest after a failed test, keeps a graph alive
    for i in range({LOOPS}):
        ray.init("local", num_cpus=4, include_dashboard=False)
        with InputNode() as inp:
            dag = A.remote().f.bind(inp)
        kept.append(dag.experimental_compile())
        print(i, ray.get(kept[-1].execute(i)), flush=True)
        print("PREFIX", kept[-1].graph.prefix, flush=True)
        ray.shutdown()
        assert kept[-1].is_teardown
""")

OWN_API = textwrap.dedent(f"""
    import ray, cgc
    from cgc import InputNode

    @cgc.actor(num_cpus=1)
    class A:
        def f(self, x): return x

    kept = []
    for i in range({LOOPS}):
        ray.init("local", num_cpus=4, include_dashboard=False)
        with InputNode() as inp:
            dag = A.bind().f.bind(inp)
        g = cgc.compile(dag, name="loop").start()
        kept.append(g)
        print(i, g.execute(i).get(timeout=30), flush=True)
        print("PREFIX", g.prefix, flush=True)
        pending = g.execute(i + 100)   # an execution in flight at shutdown
        ray.shutdown()
        assert g.closing
""")


def _segments(prefixes: list[str]) -> list[str]:
    from cgc.runtime.channels.shm import segment_dir

    try:
        names = os.listdir(segment_dir())
    except FileNotFoundError:
        return []
    return sorted(n for n in names if any(n.startswith(p) for p in prefixes))


@pytest.mark.parametrize("script", [DROP_IN, OWN_API], ids=["drop-in", "cgc-api"])
def test_graph_alive_at_shutdown_ends_with_its_session(script, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    lines = out.stdout.splitlines()
    assert [ln for ln in lines if not ln.startswith("PREFIX")] == [
        f"{i} {i}" for i in range(LOOPS)]
    # One local Ray per ray.init(): none started by a cgc thread after a shutdown.
    assert out.stderr.count("Started a local Ray instance") == LOOPS, out.stderr[-4000:]
    assert "SIGTERM handler is not set" not in out.stderr
    assert "Failed to connect to GCS" not in out.stderr
    prefixes = [ln.split()[1] for ln in lines if ln.startswith("PREFIX")]
    assert len(prefixes) == LOOPS
    assert _segments(prefixes) == []
