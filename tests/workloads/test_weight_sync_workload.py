"""Weight sync as a compiled transfer plan, on real local Ray (issue 47, item 2): the RL
example's loop is exact against its single-process reference with the sync bucketed; the
rollouts' parameters keep their addresses across executions; a module unlike the plan's
parameter list is refused at start, naming the actor and the parameter, before any byte
moves."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(Path(__file__).parent))

import ray  # noqa: E402
import rl_loop  # noqa: E402
import rl_policy  # noqa: E402
import sync_actors  # noqa: E402

import cgc  # noqa: E402
from cgc import InputNode, MultiOutputNode  # noqa: E402
from cgc.plan_schema import plan_pb2 as pb  # noqa: E402
from cgc.plan_schema.weight_sync import param_digest  # noqa: E402
from cgc.runtime.errors import WeightSyncMismatchError  # noqa: E402

CFG = rl_policy.SIZES["tiny"]
ITERATIONS = 4


@pytest.fixture(scope="module")
def shipped(ray_cluster):
    """Ray's workers cannot import examples/ or this folder: ship the modules by value."""
    for m in (rl_policy, sync_actors):
        ray.cloudpickle.register_pickle_by_value(m)
    yield
    for m in (rl_policy, sync_actors):
        ray.cloudpickle.unregister_pickle_by_value(m)


def _dag(rollout_change: str = "", learner_change: str = "", method: str = "report"):
    rollouts = [sync_actors.Rollout.bind(CFG, r, rollout_change if r == 1 else "")
                for r in range(CFG["rollouts"])]
    learner = sync_actors.Learner.bind(CFG, learner_change)
    spec = cgc.WeightSpec.from_module(lambda: rl_policy.Policy(CFG))
    with InputNode() as it:
        loss = learner.train.bind(*[r.sample.bind(it) for r in rollouts])
        # 600 bytes: the tiny policy (1,680 bytes) travels in three buckets
        synced = cgc.weight_sync(learner, rollouts, spec, after=loss, attr="policy",
                                 bucket_bytes=600)
        return MultiOutputNode([getattr(r, method).bind(s)
                                for r, s in zip(rollouts, synced, strict=True)])


@pytest.mark.parametrize("nccl", [False, True], ids=["host", "nccl_on_cpu"])
def test_rl_example_is_exact_with_a_bucketed_sync(shipped, nccl):
    plan = cgc.compile(rl_loop.build_dag(transport="nccl" if nccl else "auto",
                                         num_gpus=1 if nccl else 0, bucket_bytes=600),
                       name="rl_sync")
    t = plan.proto.lowered.transfers[0]
    assert [b.nbytes for b in t.buckets] == [1024, 128, 528]
    kinds = {c.kind for c in plan.proto.lowered.channels
             if c.source.node == plan.proto.graph.weight_syncs[0].send_node}
    assert kinds == {pb.CHAN_NCCL if nccl else pb.CHAN_HOST}
    with plan.start(communicator="cpu" if nccl else None, get_timeout=60) as g:
        rows = [[r.get() for r in g.execute(it)] for it in range(ITERATIONS)]
    assert rows == rl_policy.reference(CFG, ITERATIONS)  # bit-equal on CPU fp32


def test_rollout_parameters_keep_their_addresses(shipped):
    with cgc.compile(_dag(method="addresses"), name="rl_addr").start(get_timeout=60) as g:
        seen = [[r.get() for r in g.execute(it)] for it in range(ITERATIONS)]
    assert all(len(set(map(tuple, per_iter))) == len(per_iter) for per_iter in seen)
    for r in range(CFG["rollouts"]):
        assert len({tuple(per_iter[r]) for per_iter in seen}) == 1


# One case per branch of the check and per end: a renamed parameter is reported missing
# (the branch a deleted one takes too), a reshaped one as unlike the plan (the branch a
# dtype change takes too, checked here at the learner's end).
@pytest.mark.parametrize(("end", "change", "named"), [
    ("rollout", "rename", "'w1' is missing"),
    ("rollout", "reshape", "'w1': the plan expects shape (8, 32) float32, found shape (8, 33)"),
    ("learner", "dtype", "'b1': the plan expects shape (32,) float32, found shape (32,) float64"),
])
def test_a_module_unlike_the_plan_is_refused_at_start(shipped, end, change, named):
    dag = _dag(rollout_change=change) if end == "rollout" else _dag(learner_change=change)
    plan = cgc.compile(dag, name=f"rl_bad_{change}")
    t0 = time.monotonic()
    with pytest.raises(WeightSyncMismatchError) as err:
        plan.start(get_timeout=60)
    took = time.monotonic() - t0
    msg = str(err.value)
    actor = "rollout1" if end == "rollout" else "learner"
    assert f"actor {actor}" in msg and named in msg and "weight sync 'policy'" in msg, msg
    assert "nothing was sent" in msg
    # refused in set-up round 1, not after a set-up timeout (the plan's is 120 s)
    assert took < plan.proto.config.setup_timeout_s / 4, took


def test_each_end_checks_the_plans_list(shipped):
    """A plan edited consistently (a parameter renamed, the digest recomputed) passes the
    verifier, and every end refuses it at start: the runtime checks the list stored in the
    plan, not one it works out again."""
    plan = cgc.compile(_dag(), name="rl_edited")
    s, t = plan.proto.graph.weight_syncs[0], plan.proto.lowered.transfers[0]
    s.params[0].name = "w1_new"
    t.digest = param_digest([(p.name, tuple(p.shape), p.dtype) for p in s.params])
    with pytest.raises(WeightSyncMismatchError) as err:
        plan.start(get_timeout=60)
    msg = str(err.value)
    for actor in ("learner", "rollout0", "rollout1"):
        assert f"actor {actor} " in msg and "parameter 'w1_new' is missing" in msg, msg
