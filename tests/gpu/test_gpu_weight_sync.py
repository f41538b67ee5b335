"""Weight sync on one real GPU (issue 47, item 2): the buckets bind to CUDA IPC (and, in the
fake-hosts mode, to real NCCL with two ranks on the one device); the RL loop's rewards equal
the single-process reference on the same GPU; each rollout's parameters keep their addresses,
so a CUDA graph captured over them replays the new weights after every sync."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(Path(__file__).parent))

import rl_policy  # noqa: E402
import sync_gpu_actors  # noqa: E402

pytestmark = pytest.mark.gpu
CFG = rl_policy.SIZES["tiny"]
ITERATIONS = 6


@pytest.fixture(scope="module", autouse=True)
def shipped(ray_cluster):
    import ray

    for m in (rl_policy, sync_gpu_actors):
        ray.cloudpickle.register_pickle_by_value(m)
    yield
    for m in (rl_policy, sync_gpu_actors):
        ray.cloudpickle.unregister_pickle_by_value(m)


def test_sync_in_place_keeps_captured_graphs_valid(transport):
    import cgc
    from cgc import InputNode, MultiOutputNode

    rollouts = [sync_gpu_actors.GraphedRollout.bind(CFG, r) for r in range(2)]
    learner = sync_gpu_actors.Learner.bind(CFG)
    spec = cgc.WeightSpec.from_module(lambda: rl_policy.Policy(CFG))
    with InputNode() as it:
        loss = learner.train.bind(*[r.sample.bind(it).with_tensor_transport("nccl")
                                    for r in rollouts])
        synced = cgc.weight_sync(learner, rollouts, spec, after=loss, attr="policy",
                                 bucket_bytes=600, transport="nccl")
        dag = MultiOutputNode([r.check.bind(r.probe_logits.bind(s))
                               for r, s in zip(rollouts, synced, strict=True)])
    with cgc.compile(dag, name="sync_gpu").start(get_timeout=120) as g:
        assert {b.transport for b in g.comm_bindings.values()} == {transport}
        rows = [[r.get() for r in g.execute(it)] for it in range(ITERATIONS)]
        stats = g.cuda_graph_stats()
    assert [[c["reward"] for c in row] for row in rows] == \
        rl_policy.reference(CFG, ITERATIONS, "cuda")
    # the replay follows the new weights: it is within float noise of an eager call while
    # each sync moves the result by far more (stale weights would be off by that much)
    assert all(c["replay_off"] <= 1e-5 and c["moved"] > 1e-3 for row in rows for c in row), rows
    for r in range(2):
        assert len({tuple(row[r]["ptrs"]) for row in rows}) == 1
    assert len(stats) == 2  # one captured call per rollout, replayed after the warm-up
    assert all(s["captures"] == 1 and s["replays"] >= ITERATIONS - 3
               for s in stats.values()), stats
