"""Ray actor classes for the cgc.ray_compat tests (plain ``@ray.remote``, as a Ray user
writes them)."""

from __future__ import annotations

import os
import time

import ray


class AppError(ValueError):
    """A user exception the tests catch by its own class."""


@ray.remote
class Counter:
    def __init__(self, start=0):
        self.i = start

    def inc(self, x):
        self.i += x  # a str argument fails here: tests look for this line
        return self.i

    def echo(self, x):
        return x

    def events(self):
        return getattr(self, "__ray_cgraph_events", [])  # Ray's profiling records

    def sleep(self, x):
        time.sleep(x)
        return x

    def check(self, x):
        if x < 0:
            raise AppError(f"negative input {x}")
        return x

    def add(self, x, y):
        return x + y

    def die(self, x):
        if x == "die":
            os._exit(1)
        return x

    @ray.method(num_returns=2)
    def two_but_raise(self, x):
        raise RuntimeError("both outputs fail")
