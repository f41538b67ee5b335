"""A chain of three actors, with constant positional and keyword arguments.

execute(x) returns ((x + 1) * 3 - 2) rounded to `digits` digits.
"""

import cgc
from cgc import InputNode


@cgc.actor(num_cpus=0.5)
class Adder:
    def __init__(self, amount):
        self.amount = amount

    def add(self, x, scale=1):
        return (x + self.amount) * scale


@cgc.actor(num_cpus=0.5)
class Rounder:
    def round(self, x, *, digits=0, offset=0):
        return round(x + offset, digits)


def build_dag():
    first = Adder.bind(1)
    second = Adder.bind(0)
    last = Rounder.bind()
    with InputNode() as inp:
        a = first.add.bind(inp)
        b = second.add.bind(a, scale=3)
        return last.round.bind(b, digits=2, offset=-2)


def example_inputs():
    return (1.5,)
