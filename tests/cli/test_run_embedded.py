"""`cgc run PLAN` with no address starts a local Ray sized for the plan: an 8-actor plan,
each actor asking for a whole CPU, runs on this 2-core machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap


def test_eight_actor_plan_on_an_embedded_ray(tmp_path):
    model = tmp_path / "eight.py"
    model.write_text(
        textwrap.dedent("""
        import cgc
        from cgc import InputNode

        @cgc.actor(num_cpus=1)
        class Step:
            def __init__(self, k):
                self.k = k

            def f(self, x):
                return x + self.k

        def build_dag():
            steps = [Step.bind(k) for k in range(8)]
            with InputNode() as inp:
                x = inp
                for s in steps:
                    x = s.f.bind(x)
                return x

        def example_inputs():
            return (0,)
    """)
    )
    plan = tmp_path / "eight.cgplan"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    cli = [sys.executable, "-m", "cgc.cli.main"]
    done = subprocess.run(
        [*cli, "compile", str(model), "-o", str(plan)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    ran = subprocess.run(
        [*cli, "run", str(plan), "--iters", "20", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert json.loads(ran.stdout)["outputs"] == sum(range(8))
