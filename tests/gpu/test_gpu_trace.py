"""A traced step of plain Ray actor calls with RDT GPU hints (``cuda_ipc``, ``nccl``) on one
GPU: two actors (half a GPU each), bf16 tensors made and kept on the GPU, both hops hinted.
The hint becomes an NCCL edge; on one GPU the runtime binds CUDA IPC, or real NCCL with
fake hosts (the ``transport`` fixture). Exact against the same calls in one process.

``run_step(device, hint)`` is the whole check; on a machine without CUDA it runs with
``("cpu", "gloo")``, which is how its harness is checked off the GPU machine.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
import ray
import torch

import cgc
from cgc.plan_schema import plan_pb2 as pb

N = 1 << 20  # 2 MiB of bf16 per hop


class Stage:
    def __init__(self, device: str) -> None:
        self.device = device

    def make(self, n: int) -> torch.Tensor:
        return (torch.arange(n, device=self.device) % 251).to(torch.bfloat16)  # exact

    def fwd(self, x: torch.Tensor) -> torch.Tensor:
        assert x.device.type == self.device, x.device  # it arrived on the device
        return x * 2

    def finish(self, x: torch.Tensor) -> torch.Tensor:
        return x.float().cpu() + 1


def _want(n: int) -> torch.Tensor:
    return ((torch.arange(n) % 251) * 2 + 1).float()


def run_step(device: str, hint: str, executions: int = 3) -> Any:
    """Trace ``make -> fwd -> finish`` with ``hint`` on both hops, run it, check it; the
    plan (its edges say how the hint was taken)."""
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    opts = {"num_gpus": 0.5} if device == "cuda" else {"num_cpus": 0}
    cls = ray.remote(enable_tensor_transport=True, **opts)(Stage)
    s0, s1 = cls.remote(device), cls.remote(device)

    @cgc.trace(start_options={"get_timeout": 60})
    def step(n):
        h = s0.make.options(tensor_transport=hint).remote(n)
        y = s1.fwd.options(tensor_transport=hint).remote(h)
        return s0.finish.remote(y)

    try:
        for _ in range(executions):
            assert torch.equal(ray.get(step(N)), _want(N))
        return step.plan
    finally:
        step.teardown()
        for a in (s0, s1):
            ray.kill(a)


@pytest.mark.parametrize("hint", ["cuda_ipc", "nccl"])
def test_rdt_gpu_hints_run_on_cgc_gpu_transports(ray_cluster, transport, hint):
    plan = run_step("cuda", hint)
    hops = [e for e in plan.proto.lowered.edges if e.reason.startswith(f"ray rdt {hint}")]
    assert len(hops) == 2 and all(e.transport == pb.NCCL for e in hops), \
        [(e.transport, e.reason) for e in plan.proto.lowered.edges]
