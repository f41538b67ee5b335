"""`cgc compile` of a model file in Ray's API imports only what its graph needs: torch and
Ray's collective modules (``ray.util.collective`` imports torch: 1.4 s of a 2 s compile)
only when the graph has a collective, and never the runtime's driver (channels, numpy,
transports: ~70 ms; saving a plan needs none of it). Measured in a fresh process, as a
user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "ray.util.collective", "ray.experimental.collective", "cgc.runtime.driver.graph")

# Runs the CLI's entry point in this process, then reports which heavy modules it loaded.
_PROBE = textwrap.dedent(
    """
    import json, sys
    from cgc.cli.main import main
    rc = main(["compile", sys.argv[1], "-o", sys.argv[2]])
    print(json.dumps({"rc": rc, "loaded": [m for m in sys.argv[3:] if m in sys.modules]}))
    """
)

_COLLECTIVE_MODEL = '''
import ray
from ray.dag import InputNode, MultiOutputNode
from ray.experimental.collective import allreduce


@ray.remote(num_cpus=0.5)
class Worker:
    def grad(self, x):
        return x

    def add(self, x, k):
        return x + k


def build_dag():
    w0, w1 = Worker.bind(), Worker.bind()
    with InputNode() as inp:
        r = allreduce.bind([w0.grad.bind(inp), w1.grad.bind(inp)])
        return MultiOutputNode([w0.add.bind(r[0], 1), w1.add.bind(r[1], 1)])
'''


def _compile_and_list_heavy(model: Path, out: Path) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, str(model), str(out), *HEAVY],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["rc"] == 0, proc.stdout + proc.stderr
    assert out.stat().st_size > 0
    return list(report["loaded"])


def test_compiling_a_ray_model_without_collectives_imports_neither_torch_nor_collectives(
    tmp_path,
):
    loaded = _compile_and_list_heavy(ROOT / "examples" / "ray_chain.py", tmp_path / "c.cgplan")
    assert loaded == [], f"compile of a graph without collectives imported {loaded}"


def test_a_ray_model_with_a_collective_still_compiles_and_loads_them(tmp_path):
    # The other side of the rule: the probe sees these modules when the graph uses them.
    model = tmp_path / "coll_model.py"
    model.write_text(_COLLECTIVE_MODEL)
    loaded = _compile_and_list_heavy(model, tmp_path / "c.cgplan")
    assert "ray.util.collective" in loaded and "ray.experimental.collective" in loaded
    assert "cgc.runtime.driver.graph" not in loaded
