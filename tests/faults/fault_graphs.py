"""Actors and graphs for the fault suite, built through the real pipeline (cgc.compile)."""

from __future__ import annotations

import os
import threading
import time

import numpy as np

import cgc
from cgc import InputNode, MultiOutputNode, ReduceOp, allreduce


class Boom(RuntimeError):
    """The app error the fault tests inject."""


@cgc.actor
class Stage:
    """``step(x)`` adds ``k``; raises ``Boom`` when ``x == fail_on``; sleeps ``x`` s when
    ``x`` is a float (so an execution can be kept pending)."""

    def __init__(self, k: int = 1, fail_on: int | None = None) -> None:
        self.k = k
        self.fail_on = fail_on

    def step(self, x):
        if isinstance(x, float):
            time.sleep(x)
            return x
        if x == self.fail_on:
            raise Boom(f"stage k={self.k} fails on {x}")
        return x + self.k

    def pid(self, x=None):
        return os.getpid()

    def forever(self, x):
        threading.Event().wait()  # never returns

    @cgc.method(num_returns=2)
    def pair(self, x):
        if x < 0:
            raise Boom(f"pair fails on {x}")
        return x, -x

    def grad(self, x):
        if x < 0 and self.k == 2:
            raise Boom("member 1 fails before the allreduce")
        return np.full(4, float(x * self.k))

    def total(self, g):
        return float(g.sum())


def chain(n: int = 3, fail_at: int | None = None, fail_on: int = -1, name: str = "f_chain"):
    """``n`` stages in a row; stage ``fail_at`` raises ``Boom`` on input ``fail_on``."""
    stages = [Stage.bind(i + 1, fail_on if i == fail_at else None) for i in range(n)]
    with InputNode() as inp:
        x = inp
        for s in stages:
            x = s.step.bind(x)
    return cgc.compile(x, name=name)


def hang():
    s = Stage.bind()
    with InputNode() as inp:
        dag = s.forever.bind(inp)
    return cgc.compile(dag, name="f_hang")


def multi_return():
    a, b = Stage.bind(), Stage.bind(10)
    with InputNode() as inp:
        x, y = a.pair.bind(inp)
        dag = MultiOutputNode([b.step.bind(x), y])
    return cgc.compile(dag, name="f_multi")


def collective():
    ws = [Stage.bind(1), Stage.bind(2)]
    with InputNode() as inp:
        grads = [w.grad.bind(inp) for w in ws]
        reduced = allreduce.bind(grads, op=ReduceOp.SUM)
        dag = MultiOutputNode([w.total.bind(g) for w, g in zip(ws, reduced, strict=True)])
    return cgc.compile(dag, name="f_coll")
