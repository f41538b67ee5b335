"""Pass ``weight_sync``: the transfer plan of each declared sync (buckets, offsets, total,
digest), the buckets as ordinary edges (one static uint8 channel each), and the pass's
pre/postconditions."""

from __future__ import annotations

from dataclasses import replace

import pytest
import shapes

import cgc
from cgc import InputNode, MultiOutputNode
from cgc.passes import PIPELINE, PassInvariantError, lower
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.weight_sync import param_digest

PARAMS = [("w", (2, 3), "float32"), ("b", (3,), "bfloat16"), ("h", (4,), "float32")]


@cgc.actor(num_gpus=1)
class Learner:
    def train(self, x: int) -> int:
        return x


@cgc.actor(num_gpus=1)
class Rollout:
    def ready(self, n: int) -> int:
        return n


def _graph(transport: str = "auto", bucket_bytes: int = 24) -> pb.Plan:
    learner, rollouts = Learner.bind(), [Rollout.bind() for _ in range(2)]
    with InputNode() as inp:
        synced = cgc.weight_sync(learner, rollouts, cgc.WeightSpec(PARAMS),
                                 after=learner.train.bind(inp), bucket_bytes=bucket_bytes,
                                 transport=transport)
        dag = MultiOutputNode([r.ready.bind(s) for r, s in zip(rollouts, synced, strict=True)])
    return cgc.compile(dag).proto


def test_buckets_offsets_and_digest():
    t = _graph().lowered.transfers[0]
    assert [(b.index, b.nbytes, [(m.param, m.offset, m.nbytes) for m in b.members])
            for b in t.buckets] == [(0, 24, [(0, 0, 24)]), (1, 22, [(1, 0, 6), (2, 6, 16)])]
    assert t.total_bytes == 46 and t.digest == param_digest(PARAMS)


@pytest.mark.parametrize(("transport", "kind"), [("nccl", pb.CHAN_NCCL), ("auto", pb.CHAN_NCCL),
                                                 ("host", pb.CHAN_HOST)])
def test_each_bucket_is_one_static_channel_to_every_rollout(transport, kind):
    plan = _graph(transport)
    send = plan.graph.weight_syncs[0].send_node
    chans = sorted((c for c in plan.lowered.channels if c.source.node == send),
                   key=lambda c: c.source.output_index)
    assert [(c.kind, list(c.readers)) for c in chans] == [(kind, ["rollout0", "rollout1"])] * 2
    if kind == pb.CHAN_NCCL:  # declared: the receive is posted before the header
        assert [(c.spec.dtype, list(c.spec.shape), c.static_shape) for c in chans] == \
            [("uint8", [24], True), ("uint8", [22], True)]


def test_a_plan_without_syncs_has_no_transfer_plans():
    assert not lower(shapes.chain()).lowered.transfers


def test_a_send_node_unlike_the_layout_is_refused_before_the_pass():
    plan = _graph()
    plan.graph.weight_syncs[0].bucket_bytes = 1 << 20  # one bucket, but two outputs
    with pytest.raises(PassInvariantError, match="weight_sync.*2 outputs for 1 buckets"):
        lower(plan)


def test_a_pass_that_forgets_its_job_is_named():
    i = next(k for k, p in enumerate(PIPELINE) if p.name == "weight_sync")
    real = PIPELINE[i]
    PIPELINE[i] = replace(real, run=lambda state: None)
    try:
        with pytest.raises(PassInvariantError, match="weight_sync: one transfer plan per"):
            lower(_graph())
    finally:
        PIPELINE[i] = real
