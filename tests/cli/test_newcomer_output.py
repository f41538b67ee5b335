"""What a newcomer reads from ``cgc compile``, ``cgc inspect`` and ``cgc run`` (issue 43,
item 10): one trust line where two said the same, the schedule figures explained, the
inputs a plan takes said as a user calls it, small tensor outputs with their values."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

MODEL = textwrap.dedent('''
    import torch

    import cgc
    from cgc import InputNode


    @cgc.actor(num_cpus=0)
    class Maker:
        def small(self, x):
            return torch.arange(4.0) * x

        def large(self, x):
            return torch.zeros(4, 8) + x


    def build_dag():
        m = Maker.bind()
        with InputNode() as inp:
            return cgc.MultiOutputNode([m.small.bind(inp), m.large.bind(inp)])


    def example_inputs():
        return (2.0,)
''')


def _cgc(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cgc.cli.main", *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"})


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> tuple[Path, str]:
    tmp = tmp_path_factory.mktemp("newcomer")
    model = tmp / "tensors.py"
    model.write_text(MODEL)
    plan = tmp / "tensors.cgplan"
    done = _cgc("compile", str(model), "-o", str(plan))
    assert done.returncode == 0, done.stderr
    return plan, done.stdout


def test_compile_says_once_whether_it_runs_here_and_explains_its_figures(compiled):
    _, out = compiled
    runs = [line for line in out.splitlines() if "runs here" in line]
    assert len(runs) == 1, out
    assert runs[0].strip() == "runs here: yes, signed by a key you trust", out
    assert "verified 2 executions (no deadlock with that many in flight)" in out
    assert "(one execution, by the compiler's cost estimates)" in out


def test_inspect_says_a_plan_of_one_value_takes_one_argument(compiled):
    plan, _ = compiled
    shown = _cgc("inspect", str(plan))
    assert shown.returncode == 0, shown.stderr
    assert "inputs: 1 positional argument (its tasks take it whole)" in shown.stdout
    assert "0 positional" not in shown.stdout


def test_run_shows_a_small_tensor_s_values_and_a_large_one_s_shape(compiled, ray_address):
    plan, _ = compiled
    ran = _cgc("run", str(plan), "--iters", "1", "--warmup", "0", "--address", ray_address)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ("outputs      [Tensor([0.0, 2.0, 4.0, 6.0], dtype=torch.float32, device=cpu), "
            "Tensor(shape=(4, 8), dtype=torch.float32, device=cpu)]") in ran.stdout, ran.stdout
