"""The three workloads written as plain Ray actor calls with Ray Direct Transport hints
(``examples/rdt_*.py``): eager on Ray (RDT over gloo on the CPU) and traced by cgc with one
added line, both exact against the single-process references."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))

import pipe_train  # noqa: E402
import ray  # noqa: E402
import rdt_common  # noqa: E402
import rdt_llm_decode  # noqa: E402
import rdt_rl_loop  # noqa: E402
import rdt_train_1f1b  # noqa: E402
import rl_policy  # noqa: E402
import tinygpt  # noqa: E402

import cgc  # noqa: E402
from cgc.plan_schema import plan_pb2 as pb  # noqa: E402

TOKENS, STEPS, ITERATIONS = 5, 3, 4


@pytest.fixture(scope="module")
def shipped(ray_cluster):
    """Ray's workers cannot import examples/: ship the workload modules by value."""
    mods = (tinygpt, pipe_train, rl_policy)
    for m in mods:
        ray.cloudpickle.register_pickle_by_value(m)
    yield
    for m in mods:
        ray.cloudpickle.unregister_pickle_by_value(m)


def _host_hints(plan) -> int:
    """Edges whose transport came from an RDT hint (gloo: cgc's host channel)."""
    return sum(e.transport == pb.HOST and e.reason.startswith("ray rdt gloo")
               for e in plan.proto.lowered.edges)


def _run(step, traced: bool, run):
    """``run(step)`` eagerly on Ray, or with ``cgc.trace(step)``: the one added line."""
    if not traced:
        return run(step), None
    step = cgc.trace(step)
    try:
        return run(step), step.plan
    finally:
        step.teardown()


@pytest.mark.parametrize("traced", [False, True], ids=["eager_rdt_gloo", "cgc"])
def test_decode(shipped, traced):
    cfg = tinygpt.SIZES["tiny"]
    prompts = tinygpt.prompts(cfg, 2, 2, 5)
    actors = rdt_llm_decode.make_stages()
    rdt_common.setup_transport(actors, "gloo")
    try:
        got, plan = _run(rdt_llm_decode.decode_step(actors, "gloo"), traced,
                         lambda s: tinygpt.generate(s, ray.get, prompts, TOKENS))
    finally:
        for a in actors:
            ray.kill(a)
    want = tinygpt.reference(cfg, prompts, TOKENS)
    assert all((g == w).all() for g, w in zip(got, want, strict=True))
    if plan is not None:
        assert _host_hints(plan) == 1


@pytest.mark.parametrize("traced", [False, True], ids=["eager_rdt_gloo", "cgc"])
def test_train_1f1b(shipped, traced):
    cfg = pipe_train.SIZES["tiny"]
    actors = rdt_train_1f1b.make_stages()
    rdt_common.setup_transport(actors, "gloo")
    try:
        rows, plan = _run(
            rdt_train_1f1b.train_step(actors, cfg["microbatches"], "gloo"), traced,
            lambda s: [ray.get(s(*pipe_train.batch(cfg, k))) for k in range(STEPS)])
    finally:
        for a in actors:
            ray.kill(a)
    assert rows == pipe_train.reference(cfg, 2, STEPS)
    if plan is not None:
        assert _host_hints(plan) == 2 * cfg["microbatches"]


@pytest.mark.parametrize("traced", [False, True], ids=["eager_rdt_gloo", "cgc"])
def test_rl_loop(shipped, traced):
    cfg = rl_policy.SIZES["tiny"]
    rollouts, learner = rdt_rl_loop.make_actors()
    rdt_common.setup_transport([*rollouts, learner], "gloo")
    try:
        rows, plan = _run(rdt_rl_loop.rl_step(rollouts, learner, "gloo"), traced,
                          lambda s: [ray.get(s(it)) for it in range(ITERATIONS)])
    finally:
        for a in (*rollouts, learner):
            ray.kill(a)
    assert rows == rl_policy.reference(cfg, ITERATIONS)
    if plan is not None:
        assert _host_hints(plan) == 2 * len(rollouts)  # samples in, weights out
