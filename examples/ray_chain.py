"""A model file written for Ray Compiled Graph, compiled by cgc unchanged.

The only edit from the Ray version is `Actor.remote()` -> `Actor.bind()`; the rest is Ray's
own DAG API (ray.dag.InputNode, MultiOutputNode, @ray.remote with resource options).
"""

import ray
from ray.dag import InputNode, MultiOutputNode


@ray.remote(num_cpus=0.5)
class Tokenizer:
    def encode(self, text):
        return [ord(c) for c in text]


@ray.remote(num_cpus=0.5)
class Model:
    def __init__(self, offset):
        self.offset = offset

    def forward(self, ids):
        return [i + self.offset for i in ids]

    @ray.method(num_returns=2)
    def stats(self, ids):
        return min(ids), max(ids)


def build_dag():
    tok = Tokenizer.bind()
    model = Model.bind(1)
    with InputNode() as inp:
        ids = tok.encode.bind(inp)
        out = model.forward.bind(ids)
        lo, hi = model.stats.bind(ids)
        return MultiOutputNode([out, lo, hi])


def example_inputs():
    return ("abc",)
