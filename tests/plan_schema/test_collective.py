"""One vocabulary for collectives: cgc's ReduceOp is the plan's enum, every kind has a word."""

from __future__ import annotations

import pytest

import cgc
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.collective import KIND_WORDS, ReduceOp


def test_reduce_op_is_the_plans_enum():
    assert [(op.name, op.value) for op in ReduceOp] == list(pb.ReduceOp.items())
    assert cgc.ReduceOp is ReduceOp  # the builder's op is the same object
    assert ReduceOp.of("avg") is ReduceOp.of("AVG") is ReduceOp.of(pb.AVG) is ReduceOp.AVG
    with pytest.raises(ValueError, match="unknown reduce op 'mean'"):
        ReduceOp.of("mean")


def test_every_collective_kind_has_a_word():
    kinds = {v for name, v in pb.CollectiveKind.items() if not name.endswith("UNSPECIFIED")}
    assert set(KIND_WORDS) == kinds
    assert sorted(KIND_WORDS.values()) == ["allgather", "allreduce", "reducescatter"]
