"""Plain classes shared by the frontend tests; each is made an actor class both ways
(``cgc.actor(...)`` and ``ray.remote(...)``) so the two frontends can be compared."""

from __future__ import annotations


class Echo:
    def echo(self, x):
        return x


class Worker:
    def __init__(self, k=0, *, bias=0.0):
        self.k = k
        self.bias = bias

    def fwd(self, x, scale=1.0):
        return x * scale + self.bias

    def add(self, a, b):
        return a + b

    def grad(self, x):
        return x

    def split(self, x):
        return x, x

    def split3(self, x):
        return x, x, x

    def log(self, x):
        return None


class Splitter:
    def split(self, x):
        return x[:1], x[1:]
