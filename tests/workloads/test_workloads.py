"""The three workloads (issue 22) as users run them, exact against their single-process
references: the pipelined LLM decode with KV caches, the 1F1B training step and the RL loop
with weight sync — through cgc's API on host channels, as NCCL plans through the CPU
communicator, and as unchanged Ray Compiled Graph programs through the drop-in (live
``.remote()`` actors)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))

import llm_decode  # noqa: E402
import pipe_train  # noqa: E402
import ray  # noqa: E402
import ray_llm_decode  # noqa: E402
import ray_rl_loop  # noqa: E402
import ray_train_1f1b  # noqa: E402
import rl_loop  # noqa: E402
import rl_policy  # noqa: E402
import tinygpt  # noqa: E402
import train_1f1b  # noqa: E402

import cgc  # noqa: E402
import cgc.ray_compat  # noqa: E402
from cgc.plan_schema import plan_pb2 as pb  # noqa: E402

TINY_GPT = tinygpt.SIZES["tiny"]
TINY_TRAIN = pipe_train.SIZES["tiny"]
TINY_RL = rl_policy.SIZES["tiny"]
TOKENS, STEPS, ITERATIONS = 6, 3, 4


@pytest.fixture(scope="module")
def shipped(ray_cluster):
    """Ray's workers cannot import examples/: ship the workload modules by value (a Ray
    program's own folder is importable on its workers; this test's is not)."""
    mods = (tinygpt, pipe_train, rl_policy)
    for m in mods:
        ray.cloudpickle.register_pickle_by_value(m)
    yield
    for m in mods:
        ray.cloudpickle.unregister_pickle_by_value(m)


@pytest.fixture
def drop_in(shipped):
    cgc.ray_compat.install()
    yield
    cgc.ray_compat.uninstall()


def _nccl_channels(plan) -> int:
    return sum(c.kind == pb.CHAN_NCCL for c in plan.proto.lowered.channels)


# ---------------------------------------------------------------- decode

PROMPTS = tinygpt.prompts(TINY_GPT, 2, 2, 5)


@pytest.fixture(scope="module")
def decode_reference():
    return tinygpt.reference(TINY_GPT, PROMPTS, TOKENS)


def _same_tokens(got, want) -> bool:
    return len(got) == len(want) and all((g == w).all() for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize("nccl", [False, True], ids=["host", "nccl_on_cpu"])
def test_decode_is_exact(shipped, decode_reference, nccl):
    dag = llm_decode.build_nccl_dag() if nccl else llm_decode.build_dag()
    plan = cgc.compile(dag, name="decode")
    assert _nccl_channels(plan) == (1 if nccl else 0)
    with plan.start(communicator="cpu" if nccl else None, get_timeout=60) as g:
        got = tinygpt.generate(g.execute, lambda r: r.get(), PROMPTS, TOKENS)
    assert _same_tokens(got, decode_reference)
    assert len({tuple(t.tolist()) for t in got[0]}) > 1  # the sequences differ


def test_decode_ray_program_through_the_drop_in(drop_in, decode_reference):
    actors = ray_llm_decode.make_stages()
    compiled = ray_llm_decode.build_dag(actors).experimental_compile()
    try:
        got = tinygpt.generate(compiled.execute, ray.get, PROMPTS, TOKENS)
    finally:
        compiled.teardown()
        for a in actors:
            ray.kill(a)
    assert _same_tokens(got, decode_reference)


def test_decode_refuses_a_step_its_caches_cannot_hold(shipped):
    with cgc.compile(llm_decode.build_dag(), name="decode_bad").start(get_timeout=60) as g:
        with pytest.raises(ValueError, match="positions 70..70"):
            g.execute(0, PROMPTS[0][:, :1], 70).get()
        with pytest.raises(ValueError, match="microbatch 5"):
            g.execute(5, PROMPTS[0], 0).get()
        assert g.execute(0, PROMPTS[0], 0).get().shape == (2,)  # the graph goes on


# ---------------------------------------------------------------- 1F1B training


@pytest.fixture(scope="module")
def train_reference():
    return pipe_train.reference(TINY_TRAIN, 2, STEPS)


def test_one_f_one_b_order():
    assert pipe_train.one_f_one_b(2, 3) == [
        (0, "F", 0), (0, "F", 1), (1, "FB", 0), (0, "B", 0), (0, "F", 2), (1, "FB", 1),
        (0, "B", 1), (1, "FB", 2), (0, "B", 2)]
    order = pipe_train.one_f_one_b(4, 8)
    for s in range(4):  # each stage: warm-up forwards, then alternating, then backwards
        kinds = "".join(k[0] for st, k, _ in order if st == s)
        warm = 3 - s
        assert kinds == ("F" * warm + "FB" * (8 - warm) + "B" * warm if s < 3 else "F" * 8)


@pytest.mark.parametrize("nccl", [False, True], ids=["host", "nccl_on_cpu"])
def test_training_losses_equal_the_reference(shipped, train_reference, nccl):
    dag = train_1f1b.build_nccl_dag() if nccl else train_1f1b.build_dag()
    plan = cgc.compile(dag, name="train")
    if nccl:  # activations forward, gradients backward: 2 per microbatch
        assert _nccl_channels(plan) == 2 * TINY_TRAIN["microbatches"]
    with plan.start(communicator="cpu" if nccl else None, get_timeout=60) as g:
        rows = [[r.get() for r in g.execute(*pipe_train.batch(TINY_TRAIN, k))]
                for k in range(STEPS)]
    assert rows == train_reference  # fp32 on the CPU: bit for bit
    assert rows[-1][-1] < rows[0][-1]  # and it learns


def test_the_compiled_schedule_overlaps_the_stages(shipped):
    """1F1B bound as the order of calls: stage 0 runs its second forward while stage 1
    works on the first microbatch (makespan well under the serial sum)."""
    info = cgc.compile(train_1f1b.build_dag(), name="train").proto.lowered.schedule
    costs = {c.key: c.micros for c in info.costs}
    per_call = costs.get("train_stage0.forward", 100.0)
    calls = 3 * TINY_TRAIN["microbatches"] + 2  # F and B on stage 0, FB on stage 1, steps
    assert info.makespan_us < 0.8 * calls * per_call


def test_training_ray_program_through_the_drop_in(drop_in, train_reference):
    actors = ray_train_1f1b.make_stages()
    compiled = ray_train_1f1b.build_dag(actors, TINY_TRAIN["microbatches"]) \
        .experimental_compile()
    try:
        rows = [ray.get(compiled.execute(*pipe_train.batch(TINY_TRAIN, k)))
                for k in range(STEPS)]
    finally:
        compiled.teardown()
        for a in actors:
            ray.kill(a)
    assert rows == train_reference


# ---------------------------------------------------------------- RL


@pytest.fixture(scope="module")
def rl_reference():
    return rl_policy.reference(TINY_RL, ITERATIONS)


@pytest.mark.parametrize("nccl", [False, True], ids=["host", "nccl_on_cpu"])
def test_rl_rewards_equal_the_reference(shipped, rl_reference, nccl):
    dag = rl_loop.build_nccl_dag() if nccl else rl_loop.build_dag()
    plan = cgc.compile(dag, name="rl")
    if nccl:  # samples to the learner; the weights on one channel read by every rollout
        assert _nccl_channels(plan) == TINY_RL["rollouts"] + 1
    with plan.start(communicator="cpu" if nccl else None, get_timeout=60) as g:
        rows = [[r.get() for r in g.execute(it)] for it in range(ITERATIONS)]
    assert rows == rl_reference
    assert sum(rows[-1]) > sum(rows[0])  # the policy improves


def test_rl_ray_program_through_the_drop_in(drop_in, rl_reference):
    rollouts, learner = ray_rl_loop.make_actors()
    compiled = ray_rl_loop.build_dag(rollouts, learner).experimental_compile()
    try:
        rows = [ray.get(compiled.execute(it)) for it in range(ITERATIONS)]
    finally:
        compiled.teardown()
        for a in [*rollouts, learner]:
            ray.kill(a)
    assert rows == rl_reference


def test_a_plan_with_cuda_graph_regions_runs_eagerly_without_cuda(shipped, decode_reference):
    """The graphed decode (every stage's step a captured region) on the CPU communicator:
    the regions run eagerly, the tokens are the same, and no graph was made."""
    plan = cgc.compile(llm_decode.build_graphed_dag(), name="decode_graphed")
    assert all(list(p.captured_ops) for p in plan.proto.lowered.programs)
    with plan.start(communicator="cpu", get_timeout=60) as g:
        got = tinygpt.generate(g.execute, lambda r: r.get(), PROMPTS, TOKENS)
        assert g.cuda_graph_stats() == {}
    assert _same_tokens(got, decode_reference)
