"""``nvtx=True`` / ``cgc run --nvtx`` on the GPU machine: a GPU plan runs with an NVTX range
around every op (for Nsight Systems) and gives the same values as without."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

import cgc
from cgc import InputNode

ROOT = Path(__file__).resolve().parents[2]


@cgc.actor(num_gpus=0.5, num_cpus=0)
class Make:
    def make(self, x):
        return torch.full((64,), float(x), device="cuda")


@cgc.actor(num_gpus=0.5, num_cpus=0)
class Sum:
    def total(self, t):
        # The runtime imported nvtx in this actor to wrap its ops.
        return float(t.sum().item()), "nvtx" in sys.modules


def test_gpu_plan_runs_with_nvtx_ranges(ray_cluster):
    with InputNode() as inp:
        dag = Sum.bind().total.bind(Make.bind().make.bind(inp).with_tensor_transport("nccl"))
    plan = cgc.compile(dag, name="gpu_nvtx")
    with plan.start(get_timeout=120, nvtx=True) as g:
        assert [g.execute(x).get() for x in (1, 2, 3)] == [(64.0 * x, True) for x in (1, 2, 3)]
    with plan.start(get_timeout=120) as g:
        assert g.execute(2).get() == (128.0, False)


def test_cgc_run_nvtx_on_a_gpu_example(ray_address, tmp_path):
    out = tmp_path / "pipe.cgplan"
    cli = [sys.executable, "-m", "cgc.cli.main"]
    done = subprocess.run([*cli, "compile", str(ROOT / "examples" / "pipeline_nccl.py"),
                           "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    ran = subprocess.run([*cli, "run", str(out), "--iters", "3", "--warmup", "0", "--address", ray_address, "--nvtx",
                          "--communicator", "cpu"],
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
