"""A model file with a weight sync (compiled, inspected and drawn by the tests; never run):
a learner's two-layer module of float32 and bfloat16 parameters into two rollouts, in
buckets of at most 300 bytes."""

from __future__ import annotations

import torch

import cgc
from cgc import InputNode, MultiOutputNode


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)                   # 160 bytes
        self.proj = torch.nn.Linear(4, 8, dtype=torch.bfloat16)  # 64 + 16 bytes
        self.head = torch.nn.Linear(8, 10)                       # 320 + 40 bytes


@cgc.actor(num_cpus=0.5)
class Learner:
    def __init__(self) -> None:
        self.model = Net()

    def train(self, *samples: float) -> float:
        return sum(samples)


@cgc.actor(num_cpus=0.5)
class Rollout:
    def __init__(self) -> None:
        self.model = Net()

    def sample(self, x: float) -> float:
        return x

    def ready(self, synced_bytes: int) -> int:
        return synced_bytes


def build_dag():
    learner, rollouts = Learner.bind(), [Rollout.bind() for _ in range(2)]
    spec = cgc.WeightSpec.from_module(Net)
    with InputNode() as inp:
        loss = learner.train.bind(*[r.sample.bind(inp) for r in rollouts])
        synced = cgc.weight_sync(learner, rollouts, spec, after=loss, bucket_bytes=300)
        return MultiOutputNode([r.ready.bind(s) for r, s in zip(rollouts, synced, strict=True)])


def example_inputs():
    return (1.0,)
