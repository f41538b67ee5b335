"""A two-stage pipeline over NCCL: four microbatches per execution flow stage 0 -> stage 1.

Each stage is a GPU actor holding one weight matrix; activations travel GPU to GPU over NCCL.
On a machine without GPUs, `cgc run` runs the same schedule through the CPU communicator.
"""

import torch

import cgc
from cgc import InputNode, MultiOutputNode

DIM = 64
MICROBATCHES = 4


def _device():
    return "cuda" if torch.cuda.is_available() else "cpu"


@cgc.actor(num_gpus=1)
class Stage:
    def __init__(self, seed, dim=DIM):
        gen = torch.Generator().manual_seed(seed)
        self.weight = (torch.randn(dim, dim, generator=gen) / dim**0.5).to(_device())

    def forward(self, x):
        return torch.relu(x.to(_device()) @ self.weight)

    def head(self, x):
        return (x.to(_device()) @ self.weight).sum().item()


def build_dag():
    stage0, stage1 = Stage.bind(0), Stage.bind(1)
    with InputNode() as inp:
        outs = []
        for i in range(MICROBATCHES):
            act = stage0.forward.bind(inp[i]).with_tensor_transport("nccl")
            outs.append(stage1.head.bind(act))
        return MultiOutputNode(outs)


def example_inputs():
    gen = torch.Generator().manual_seed(7)
    return tuple(torch.randn(8, DIM, generator=gen) for _ in range(MICROBATCHES))
