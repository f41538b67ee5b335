"""Fan-out to three workers and fan-in, with input attributes selected by index.

execute(values, bias) sends `values` (input attribute 0) to three workers, each scales it by
its own factor, and a combiner sums the three results and adds `bias` (input attribute 1).
"""

import cgc
from cgc import InputNode


@cgc.actor
class Scaler:
    def __init__(self, factor):
        self.factor = factor

    def scale(self, values):
        return [v * self.factor for v in values]


@cgc.actor
class Combiner:
    def combine(self, a, b, c, bias):
        return [x + y + z + bias for x, y, z in zip(a, b, c, strict=True)]


def build_dag():
    workers = [Scaler.bind(f) for f in (1, 10, 100)]
    combiner = Combiner.bind()
    with InputNode() as inp:
        parts = [w.scale.bind(inp[0]) for w in workers]
        return combiner.combine.bind(*parts, bias=inp[1])


def example_inputs():
    return ([1, 2, 3], 0.5)
