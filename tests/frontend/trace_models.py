"""Actor classes for the traced-step tests (plain Ray actors, RDT hints on some methods)."""

from __future__ import annotations

import ray


@ray.remote(num_cpus=0)
class Stage:
    """``fwd`` scales; ``push``/``log`` record the order of calls; ``split`` returns two."""

    def __init__(self, k: float = 1.0) -> None:
        self.k = k
        self.seen: list = []

    def fwd(self, x, scale=1.0, bias=0.0):
        return x * self.k * scale + bias

    def push(self, v):
        self.seen.append(v)
        return len(self.seen)

    def log(self, _after=None):
        return list(self.seen)

    @ray.method(num_returns=2)
    def split(self, x):
        return x[:1], x[1:]

    def pair(self, x):
        return x, x

    @ray.method(tensor_transport="gloo")
    def fwd_gloo(self, x):
        return x * self.k

    def add(self, a, b):
        return a + b


@ray.remote
def task(x):
    """A Ray remote function: tasks cannot be traced."""
    return x


@ray.remote(num_cpus=0)
class Plain:
    """No Ray Direct Transport on its class (``enable_tensor_transport`` unset)."""

    def fwd(self, x):
        return x * 2
