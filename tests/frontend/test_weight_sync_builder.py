"""Declaring a weight sync: the spec from a module built on ``meta`` (no memory), the
bucket layout and digest the plan stores, and clear refusals of declarations that cannot
hold."""

from __future__ import annotations

import pytest
import torch

import cgc
from cgc import InputNode, MultiOutputNode
from cgc.errors import CompileError
from cgc.plan_schema.weight_sync import WeightSpecError, bucket_layout, param_digest


@cgc.actor
class Learner:
    def train(self, x: int) -> int:
        return x


@cgc.actor
class Rollout:
    def ready(self, n: int) -> int:
        return n


def test_a_spec_from_a_40_gb_module_costs_no_memory():
    spec = cgc.WeightSpec.from_module(lambda: torch.nn.Linear(100_000, 100_000))
    assert spec.params == (("weight", (100_000, 100_000), "float32"),
                           ("bias", (100_000,), "float32"))
    assert spec.nbytes == 40_000_400_000


def test_buckets_pack_whole_parameters_in_order():
    params = [("a", (10,), "float32"), ("b", (100,), "float32"), ("c", (5,), "bfloat16"),
              ("d", (0,), "float32"), ("e", (2,), "int64")]
    got = [[(m.param, m.offset, m.nbytes) for m in b] for b in bucket_layout(params, 64)]
    # b (400 bytes) is larger than a bucket: a bucket of its own; d has no bytes
    assert got == [[(0, 0, 40)], [(1, 0, 400)], [(2, 0, 10), (4, 10, 16)]]


@pytest.mark.parametrize("change", [
    lambda p: [("x", *p[0][1:])] + p[1:],             # renamed
    lambda p: [(p[0][0], (11,), p[0][2])] + p[1:],    # reshaped
    lambda p: [(p[0][0], p[0][1], "int32")] + p[1:],  # re-typed, same bytes
    lambda p: p[1:],                                  # missing
    lambda p: p[::-1],                                # reordered
])
def test_the_digest_tells_every_change_of_the_list(change):
    params = [("a", (10,), "float32"), ("b", (3, 4), "bfloat16")]
    assert param_digest(change(params)) != param_digest(params)
    assert param_digest(list(params)) == param_digest(params)


@pytest.mark.parametrize(("params", "says"), [
    ([("w", (2,), "float17")], "dtype 'float17' cannot be synced"),
    ([("w", (2,), "float32"), ("w", (3,), "float32")], "appear twice: w"),
    ([("", (2,), "float32")], "non-empty str"),
    ([("w", (2.5,), "float32")], "is not ints"),
])
def test_a_bad_spec_is_refused_naming_the_parameter(params, says):
    with pytest.raises(WeightSpecError, match=says):
        cgc.WeightSpec(params)


def _declare(**kw):
    learner, rollouts = Learner.bind(), [Rollout.bind() for _ in range(2)]
    spec = kw.pop("spec", cgc.WeightSpec([("w", (4,), "float32")]))
    targets = kw.pop("targets", rollouts)
    with InputNode() as inp:
        loss = learner.train.bind(inp)
        synced = cgc.weight_sync(learner, targets(learner, rollouts) if callable(targets)
                                 else targets, spec, after=kw.pop("after", loss), **kw)
        return MultiOutputNode([r.ready.bind(s) for r, s in zip(rollouts, synced, strict=False)])


@pytest.mark.parametrize(("kw", "says"), [
    ({"targets": []}, "no target actors"),
    ({"targets": lambda lrn, rs: [rs[0], rs[0]]}, "a target appears twice"),
    ({"targets": lambda lrn, rs: [lrn, *rs]}, "the source is among the targets"),
    ({"attr": "a.b"}, "attribute 'a.b' is not an identifier"),
    ({"after": 3}, "after= must be a node"),
    ({"spec": cgc.WeightSpec([("w", (0,), "float32")])}, "no parameter bytes"),
])
def test_a_declaration_that_cannot_hold_is_refused_at_its_line(kw, says):
    with pytest.raises(CompileError, match=says) as err:
        _declare(**kw)
    assert "test_weight_sync_builder.py:" in str(err.value)


def test_the_plan_holds_list_buckets_and_digest():
    plan = cgc.compile(_declare(bucket_bytes=8,
                                spec=cgc.WeightSpec([("w", (2,), "float32"),
                                                     ("b", (1,), "float32")])))
    p = plan.proto
    (s,), (t,) = p.graph.weight_syncs, p.lowered.transfers
    assert (s.source, list(s.targets), s.source_attr, s.target_attr) == \
        ("learner", ["rollout0", "rollout1"], "model", "model")
    assert [(b.nbytes, [(m.param, m.offset) for m in b.members]) for b in t.buckets] == \
        [(8, [(0, 0)]), (4, [(1, 0)])]
    assert t.digest == param_digest([("w", (2,), "float32"), ("b", (1,), "float32")])
    assert p.graph.nodes[s.send_node].num_returns == 2
