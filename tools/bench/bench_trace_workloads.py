"""The three workloads of ``bench_trace.py`` (examples/rdt_*.py at CPU sizes), one system at
a time on fresh actors: eager Ray with RDT hints (``rdt``) or through the object store
(``store``), ``cgc.trace`` of the same step (``traced``), the Ray DAG twin of
examples/ray_*.py compiled by cgc (``dag``), and the same compute in this process
(``floor``). Warm-up is excluded from the rate and included in the exactness check.

Example: ``workload("rl", "traced", args)`` -> ``{"rate": 231.0, "exact": True}``.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

import pipe_train
import ray
import ray_llm_decode
import ray_rl_loop
import ray_train_1f1b
import rdt_common
import rdt_llm_decode
import rdt_rl_loop
import rdt_train_1f1b
import rl_policy
import tinygpt

import cgc

__all__ = ["workload", "Actors"]

DECODE = dict(microbatches=2, batch=2, prompt=8, tokens=32, warm_tokens=4)
TRAIN = dict(steps=20, warm=3)
RL = dict(iterations=40, warm=3)


class Actors:
    """Fresh actors for one system (in one collective group for a two-sided transport);
    killed after."""

    def __init__(self, make: Callable[[], list], transport: str,
                 setup_timeout_s: float = 120.0) -> None:
        self.actors = make()
        # Ray's create_collective_group waits without a limit (NCCL between two actors on
        # one GPU may never come up): wait in a thread, give up after the deadline.
        box: list[BaseException] = []

        def setup() -> None:
            try:
                rdt_common.setup_transport(self.actors, transport)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                box.append(exc)

        t = threading.Thread(target=setup, daemon=True)
        t.start()
        t.join(setup_timeout_s)
        if t.is_alive() or box:
            self.__exit__()
            if box:
                raise box[0]
            raise TimeoutError(f"{transport} collective group not up after {setup_timeout_s:g} s")

    def __enter__(self) -> list:
        return self.actors

    def __exit__(self, *exc: object) -> None:
        for a in self.actors:
            ray.kill(a)


def _runner(system: str, step: Callable[..., Any], dag: Callable[[], Any], name: str
            ) -> tuple[Callable[..., Any], Callable[[Any], Any], Callable[[], None]]:
    """(submit, fetch one result or a list of them, stop) for a system."""
    if system in ("rdt", "store"):
        return step, functools.partial(ray.get, timeout=120), lambda: None
    if system == "traced":
        traced = cgc.trace(step, name=name)
        return traced, _fetch, traced.teardown
    graph = cgc.compile(dag(), name=name).start()
    return graph.execute, _fetch, graph.teardown


def _fetch(ref: Any) -> Any:
    if isinstance(ref, list):
        return [r.get(timeout=120) for r in ref]
    return ref.get(timeout=120)


@functools.cache
def _decode_want() -> tuple[Any, list[Any]]:
    cfg = tinygpt.SIZES["tiny"]
    ps = tinygpt.prompts(cfg, DECODE["microbatches"], DECODE["batch"], DECODE["prompt"])
    return ps, tinygpt.reference(cfg, ps, DECODE["tokens"])


def _decode(system: str, transport: str) -> dict[str, Any]:
    ps, want = _decode_want()
    n = DECODE["microbatches"] * DECODE["batch"] * DECODE["tokens"]
    make = functools.partial(rdt_llm_decode.make_stages, "tiny", 2, DECODE["microbatches"],
                             DECODE["batch"])
    if system == "floor":
        cfg = tinygpt.SIZES["tiny"]
        stages = [tinygpt.GPTStage(cfg, a, b, DECODE["microbatches"], DECODE["batch"])
                  for a, b in tinygpt.split_layers(cfg["n_layers"], 2)]

        def run(mb: int, x: Any, pos: Any) -> Any:
            for s in stages:
                x = s.forward(x, mb, pos)
            return x

        submit, fetch, stop = run, (lambda t: t), (lambda: None)
    with Actors(make if system != "floor" else list, transport) as actors:
        if system != "floor":
            submit, fetch, stop = _runner(
                system, rdt_llm_decode.decode_step(actors, transport),
                lambda: ray_llm_decode.build_dag(actors, "shm"), "decode")
        try:
            tinygpt.generate(submit, fetch, ps, DECODE["warm_tokens"])
            t0 = time.perf_counter()
            got = tinygpt.generate(submit, fetch, ps, DECODE["tokens"])
            dt = time.perf_counter() - t0
        finally:
            stop()
    exact = all((g == w).all() for g, w in zip(got, want, strict=True))
    return {"rate": n / dt, "exact": bool(exact)}


def _rows(submit: Callable[..., Any], fetch: Callable[[Any], Any], inputs: Callable[[int], Any],
          total: int, warm: int) -> tuple[float, list[Any]]:
    rows = [fetch(submit(*inputs(k))) for k in range(warm)]
    t0 = time.perf_counter()
    rows += [fetch(submit(*inputs(k))) for k in range(warm, total)]
    return (total - warm) / (time.perf_counter() - t0), rows


def _train(system: str, transport: str) -> dict[str, Any]:
    cfg = pipe_train.SIZES["tiny"]
    total = TRAIN["warm"] + TRAIN["steps"]
    want = pipe_train.reference(cfg, 2, total)
    inputs = functools.partial(pipe_train.batch, cfg)
    if system == "floor":
        stages = [pipe_train.TrainStage(cfg, s, 2) for s in range(2)]
        rate, rows = _rows(lambda *b: pipe_train.local_step(stages, cfg, 0, b),
                           lambda r: r, inputs, total, TRAIN["warm"])
        return {"rate": rate, "exact": rows == want}
    with Actors(functools.partial(rdt_train_1f1b.make_stages, "tiny", 2), transport) as actors:
        submit, fetch, stop = _runner(
            system, rdt_train_1f1b.train_step(actors, cfg["microbatches"], transport),
            lambda: ray_train_1f1b.build_dag(actors, cfg["microbatches"], "shm"), "train")
        try:
            rate, rows = _rows(submit, fetch, inputs, total, TRAIN["warm"])
        finally:
            stop()
    return {"rate": rate, "exact": rows == want}


def _rl(system: str, transport: str) -> dict[str, Any]:
    cfg = rl_policy.SIZES["tiny"]
    total = RL["warm"] + RL["iterations"]
    want = rl_policy.reference(cfg, total)
    if system == "floor":
        rollouts = [rl_policy.Rollout(cfg, r) for r in range(cfg["rollouts"])]
        learner = rl_policy.Learner(cfg)

        def local(it: int) -> list[float]:
            weights = learner.update(*[r.sample(it) for r in rollouts])
            return [r.load(weights) for r in rollouts]

        rate, rows = _rows(local, lambda r: r, lambda k: (k,), total, RL["warm"])
        return {"rate": rate, "exact": rows == want}

    def make() -> list:
        rollouts, learner = rdt_rl_loop.make_actors("tiny")
        return [*rollouts, learner]

    with Actors(make, transport) as actors:
        rollouts, learner = actors[:-1], actors[-1]
        submit, fetch, stop = _runner(
            system, rdt_rl_loop.rl_step(rollouts, learner, transport),
            lambda: ray_rl_loop.build_dag(rollouts, learner, "shm"), "rl")
        try:
            rate, rows = _rows(submit, fetch, lambda k: (k,), total, RL["warm"])
        finally:
            stop()
    return {"rate": rate, "exact": rows == want}


def workload(part: str, system: str, args: Any) -> dict[str, Any]:
    """Run one workload on one system; ``{"rate": per second, "exact": bool}``.

    Raises:
        Whatever the system raises (the caller reports it in the system's row).
    """
    transport = args.cpu_transport if system in ("rdt", "traced") else "none"
    return {"decode": _decode, "train": _train, "rl": _rl}[part](system, transport)
