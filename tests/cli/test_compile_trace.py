"""`cgc compile model.py:step` compiles a step of plain Ray actor calls offline: the actors
the file makes with ``Cls.remote()`` become the plan's own, and no Ray starts."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import cgc

_MODEL = '''
import ray
import torch


@ray.remote(num_cpus=0.5)
class Stage:
    def __init__(self, k):
        self.k = k

    @ray.method(tensor_transport="gloo")
    def fwd(self, x):
        return x * self.k

    @ray.method(num_returns=2)
    def split(self, x):
        return x[:1], x[1:]


stage0 = Stage.remote(2.0)
stage1 = Stage.options(num_cpus=0.25).remote(k=3.0)


def step(x, bias):
    head, tail = stage1.split.remote(stage0.fwd.remote(x))
    return {"head": head, "tail": stage1.fwd.remote(tail)}


def example_inputs():
    return (torch.arange(3.0), 1.0)
'''

# Runs the CLI's entry point in this process, then says whether Ray was started.
_PROBE = textwrap.dedent(
    """
    import json, sys
    from cgc.cli.main import main
    rc = main(["compile", sys.argv[1], "-o", sys.argv[2]])
    ray = sys.modules.get("ray")
    print(json.dumps({"rc": rc, "ray_started": bool(ray and ray.is_initialized())}))
    """
)


def _compile(model: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _PROBE, str(model), str(out)],
                          capture_output=True, text=True, timeout=120)


def test_a_step_compiles_offline_into_plan_actors(tmp_path, ray_cluster):
    model = tmp_path / "rdt_model.py"
    model.write_text(_MODEL)
    first, second = tmp_path / "a.cgplan", tmp_path / "b.cgplan"
    for out in (first, second):
        proc = _compile(Path(f"{model}:step"), out)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        assert report == {"rc": 0, "ray_started": False}, proc.stdout + proc.stderr
    assert first.read_bytes() == second.read_bytes()  # deterministic
    plan = cgc.load(first, trust=True)
    g = plan.proto.graph
    assert not any(a.HasField("external") for a in g.actors)  # the plan's own actors
    assert [a.options.num_cpus for a in g.actors] == [0.5, 0.25]
    assert [a.ctor_kwargs[0].name for a in g.actors if a.ctor_kwargs] == ["k"]
    assert g.num_positional == 1  # bias is not used by the graph
    import torch

    with plan.start() as graph:
        head, tail = (r.get(timeout=60) for r in graph.execute(torch.arange(3.0)))
    assert head.tolist() == [0.0] and tail.tolist() == [6.0, 12.0]


def test_an_offline_actor_runs_nothing_outside_a_step(tmp_path):
    model = tmp_path / "eager_call.py"
    source = _MODEL + "\nprint(stage0.fwd.remote(1))\n"
    model.write_text(source)
    line = source.splitlines().index("print(stage0.fwd.remote(1))") + 1
    proc = _compile(Path(f"{model}:step"), tmp_path / "p.cgplan")
    assert f"eager_call.py:{line}: fwd.remote() on an actor made offline" in proc.stderr, (
        proc.stdout + proc.stderr)
    assert json.loads(proc.stdout.strip().splitlines()[-1])["rc"] == 3


@pytest.mark.parametrize("attr", ["", ":build_dag"])
def test_a_dag_model_still_compiles_as_a_dag(tmp_path, attr):
    model = tmp_path / "dag_model.py"
    model.write_text(textwrap.dedent('''
        import ray
        from ray.dag import InputNode

        @ray.remote
        class W:
            def f(self, x):
                return x + 1

        def build_dag():
            w = W.bind()
            with InputNode() as inp:
                return w.f.bind(inp)
    '''))
    proc = _compile(Path(f"{model}{attr}"), tmp_path / "p.cgplan")
    assert json.loads(proc.stdout.strip().splitlines()[-1])["rc"] == 0, proc.stderr


def test_a_decorated_step_compiles_offline_too(tmp_path):
    model = tmp_path / "decorated.py"
    model.write_text(_MODEL.replace("def step(x, bias):", "@cgc.trace\ndef step(x, bias):")
                     .replace("import torch\n", "import torch\n\nimport cgc\n", 1))
    proc = _compile(Path(f"{model}:step"), tmp_path / "d.cgplan")
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"rc": 0, "ray_started": False}, (
        proc.stdout + proc.stderr)
