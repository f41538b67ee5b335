"""Data-parallel step: two GPU workers compute gradients, allreduce them, and apply the mean.

Each worker scales the input by its rank + 1; after an allreduce (AVG) both hold the same
gradient and return its sum. On a machine without GPUs, `cgc run` uses the CPU communicator.
"""

import torch

import cgc
from cgc import InputNode, MultiOutputNode, ReduceOp, allreduce


def _device():
    return "cuda" if torch.cuda.is_available() else "cpu"


@cgc.actor(num_gpus=1)
class Worker:
    def __init__(self, rank):
        self.rank = rank

    def grad(self, x):
        return torch.as_tensor(x, dtype=torch.float32, device=_device()) * (self.rank + 1)

    def apply(self, g):
        return float(g.sum().item())


def build_dag():
    workers = [Worker.bind(r) for r in range(2)]
    with InputNode() as inp:
        grads = [w.grad.bind(inp) for w in workers]
        reduced = allreduce.bind(grads, op=ReduceOp.AVG)
        return MultiOutputNode([w.apply.bind(g) for w, g in zip(workers, reduced, strict=True)])


def example_inputs():
    return ([1.0, 2.0, 3.0],)
