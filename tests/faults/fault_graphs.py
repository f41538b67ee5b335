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
        if isinstance(x, int) and x == self.fail_on:
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

    def gift(self, x):
        """``x`` for x >= 0; for x < 0 a value that cannot be decoded in the driver (whose
        PID the actor was built with): the actor pickles it fine, the driver cannot (for
        -99 the first decoding raises KeyboardInterrupt, as a Ctrl-C at that moment would,
        and a second one succeeds)."""
        if x < 0:
            return DriverCannotDecode(self.k, x)
        return np.full(3, x) if x % 2 else x

    def echo(self, x):
        return x


class DriverCannotDecode:
    """Pickles anywhere; unpickling raises only in process ``driver_pid`` (the driver)."""

    def __init__(self, driver_pid: int, x: int) -> None:
        self.driver_pid, self.x = driver_pid, x

    def __reduce__(self):
        return (_ByValue(), (self.driver_pid, self.x))


class _ByValue:
    """Unpickles to ``_rebuild_outside`` carried by value: actors cannot import this module
    (their classes travel by value), so the function must travel the same way."""

    def __call__(self, driver_pid: int, x: int) -> DriverCannotDecode:
        return _rebuild_outside(driver_pid, x)

    def __reduce__(self):
        from ray import cloudpickle

        return (cloudpickle.loads, (cloudpickle.dumps(_rebuild_outside),))


def _rebuild_outside(driver_pid: int, x: int) -> DriverCannotDecode:
    if os.getpid() == driver_pid:
        if x == -99:  # a Ctrl-C while the driver decodes: once, as a real one would come
            if os.environ.get("CGC_FAULTS_INTERRUPTED") != str(driver_pid):
                os.environ["CGC_FAULTS_INTERRUPTED"] = str(driver_pid)
                raise KeyboardInterrupt(f"interrupted while decoding value {x}")
            return DriverCannotDecode(driver_pid, x)
        raise RuntimeError(f"value {x} cannot be decoded in the driver")
    return DriverCannotDecode(driver_pid, x)


def gifts(name: str = "f_gift"):
    """One actor whose results for negative inputs cannot be decoded in this (driver)
    process; the ``k`` of the Stage is this process's PID."""
    s = Stage.bind(os.getpid())
    with InputNode() as inp:
        dag = s.gift.bind(inp)
    return cgc.compile(dag, name=name)


def echo(name: str = "f_echo"):
    s = Stage.bind()
    with InputNode() as inp:
        dag = s.echo.bind(inp)
    return cgc.compile(dag, name=name, capacity=4)


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


@cgc.actor
class Jitter:
    """``work((i, arr))`` sleeps a pseudo-random 0-15 ms (a delay injected per execution and
    stage) and returns ``(i, arr * k)``; ``join`` checks both branches carry the same
    execution before combining them."""

    def __init__(self, seed: int, k: int = 1) -> None:
        self.seed, self.k = seed, k

    def _delay(self, i: int) -> None:
        import random

        time.sleep(random.Random(self.seed * 100_003 + i).uniform(0.0, 0.015))

    def work(self, x):
        i, arr = x
        self._delay(i)
        return i, arr * self.k

    def join(self, a, b):
        self._delay(a[0])
        if a[0] != b[0]:
            raise Boom(f"branches disagree: execution {a[0]} met execution {b[0]}")
        return a[0], a[1] + b[1]


def jittery_diamond():
    """src -> (left, right) -> join, each stage with its own injected delays, so the two
    branches finish each execution in a different order."""
    src, left, right, join = Jitter.bind(1), Jitter.bind(2, 2), Jitter.bind(3, 3), Jitter.bind(4)
    with InputNode() as inp:
        s = src.work.bind(inp)
        dag = join.join.bind(left.work.bind(s), right.work.bind(s))
    return cgc.compile(dag, name="f_jitter", capacity=4)
