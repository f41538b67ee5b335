"""Ray Compiled Graph programs as scripts, ``python -c`` and stdin, through
``cgc.ray_compat``: classes of ``__main__`` (live handles and lazy ``Actor.bind()``
actors) run, and the script's top level runs once."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import os
    import ray
    import cgc.ray_compat
    from ray.dag import InputNode, MultiOutputNode

    with open(os.environ["MARK"], "a") as f:
        f.write("top level ran\\n")
    ray.init(address=os.environ["ADDR"])
    cgc.ray_compat.install()


    @ray.remote
    class Adder:
        def __init__(self, k):
            self.k = k

        def add(self, x):
            return x + self.k


    live = Adder.remote(1)          # a live handle, as Ray programs make them
    lazy = Adder.bind(10)           # an actor cgc creates (carried by value)
    with InputNode() as inp:
        dag = MultiOutputNode([live.add.bind(inp), lazy.add.bind(inp)])
    compiled = dag.experimental_compile()
    print("RESULT", ray.get(compiled.execute(5)))
    compiled.teardown()
""")


@pytest.mark.parametrize("how", ["script", "-c", "stdin"])
def test_ray_program_runs_unchanged(how, tmp_path, ray_address):
    mark = tmp_path / "mark.txt"
    env = {**os.environ, "MARK": str(mark), "ADDR": ray_address}
    env.pop("RAY_ADDRESS", None)
    if how == "script":
        (tmp_path / "prog.py").write_text(SCRIPT)
        args, stdin = [str(tmp_path / "prog.py")], None
    elif how == "-c":
        args, stdin = ["-c", SCRIPT], None
    else:
        args, stdin = ["-"], SCRIPT
    out = subprocess.run([sys.executable, *args], input=stdin, capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "RESULT [6, 15]" in out.stdout
    assert mark.read_text().splitlines() == ["top level ran"]
