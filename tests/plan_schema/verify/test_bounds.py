"""Layer 1 of the structure check: every repeated field bounded, every value decodable.

``REPEATED_BOUNDS`` must name every repeated field of plan.proto, and each is enforced: a
plan with one item more than the limit is refused with a ``PlanLimitError`` naming the
limit. The audit's plans that ``cgc check`` accepted but ``cgc run`` could not decode
(issue 20) are refused here, naming the field; a value this check accepts decodes.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
from google.protobuf.descriptor import FieldDescriptor as F

import cgc
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.defaults import LIMITS
from cgc.plan_schema.values import (
    TORCH_DTYPE_BYTES,
    ValueDecodeError,
    ValueEncodeError,
    decode_value,
    encode_value,
)
from cgc.plan_schema.verify import PlanLimitError, PlanStructureError, check_structure, verify_plan
from cgc.plan_schema.verify.bounds import REPEATED_BOUNDS, check_value

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _repeated_fields(desc, seen=None) -> set[str]:
    seen = set() if seen is None else seen
    if desc.full_name in seen:
        return set()
    seen.add(desc.full_name)
    out = set()
    for fd in desc.fields:
        if fd.is_repeated:
            out.add(fd.full_name)
        if fd.type == F.TYPE_MESSAGE:
            out |= _repeated_fields(fd.message_type, seen)
    return out


def test_every_repeated_field_of_a_plan_has_a_bound():
    fields = _repeated_fields(pb.Plan.DESCRIPTOR)
    assert fields == set(REPEATED_BOUNDS), (
        f"unbounded: {sorted(fields - set(REPEATED_BOUNDS))}; "
        f"stale: {sorted(set(REPEATED_BOUNDS) - fields)}")
    for name in set(REPEATED_BOUNDS.values()):
        assert isinstance(getattr(LIMITS, name), int)


def _rich_plan() -> pb.Plan:
    """A compiled example with at least one item in every repeated field."""
    plan = cgc.compile_file(EXAMPLES / "allreduce.py").proto
    g = plan.graph
    g.keyword_fields.append("k")
    g.nodes.add(id=len(g.nodes), kind=pb.INPUT_ATTR, key_kind=pb.FIELD, field="k",
                name="input.k")
    out = next(n for n in g.nodes if n.kind == pb.OUTPUT)  # keep OUTPUT last in id order
    last = g.nodes[-1]
    out_copy, attr_copy = pb.Node(), pb.Node()
    out_copy.CopyFrom(out)
    attr_copy.CopyFrom(last)
    out.CopyFrom(attr_copy)
    out.id = out_copy.id
    last.CopyFrom(out_copy)
    last.id = len(g.nodes) - 1
    for ch in plan.lowered.channels:
        if ch.source.node == out_copy.id:
            ch.source.node = last.id
    for e in plan.lowered.edges:
        if e.target == out_copy.id:
            e.target = last.id
    a = g.actors[0]
    a.ctor_args.add(int_value=1)
    a.ctor_kwargs.add(name="x", value=pb.Value(int_value=2))
    a.options.resources.add(name="foo", amount=1)
    placed = a.external.placement  # what a live actor held (the format of 1.3)
    placed.observed = True
    placed.resources.add(name="CPU", amount=1)
    placed.gpu_ids.append("0")
    call = next(n for n in g.nodes if n.kind == pb.CALL)
    call.hints.add(output_index=0, hint=pb.TransportHint(spec=pb.TensorSpec(
        shape=[2], dtype="float32")))
    call.kwargs.add(name="z", arg=pb.Arg(constant=encode_value([1, {"a": (2,)}])[0]))
    call.args.add(constant=encode_value(__import__("numpy").zeros(3, "float32"))[0])
    g.modules.add(name="m", source="x = 1\n")
    plan.example_kwargs.add(name="k", value=pb.Value(int_value=3))
    plan.lowered.schedule.costs.add(key="a.f", micros=1.0)
    ch = plan.lowered.channels[0]
    ch.spec.shape.append(4)
    ch.spec.dtype = "float32"
    # counted in layer 1 (ops; an extract list is bounded through Limits.nodes), so these
    # need not make sense as a program
    prog = plan.lowered.programs[0]
    prog.prologue.add().CopyFrom(prog.ops[0])
    prog.ops[0].extract.append(1)
    # format 1.4: a CUDA-graph region, the first COMPUTE of a call marked for capture
    at = next(i for i, op in enumerate(prog.ops) if op.kind == pb.COMPUTE)
    g.nodes[prog.ops[at].task].cuda_graph = True
    prog.captured_ops.append(at)
    # format 1.7: a weight sync and its transfer plan (counted in layer 1: no sense needed)
    sync = g.weight_syncs.add(targets=[g.actors[0].name], recv_nodes=[1])
    sync.params.add(name="w", shape=[2], dtype="float32", nbytes=8)
    plan.lowered.transfers.add().buckets.add(nbytes=8).members.add(nbytes=8)
    return plan


def _instances(msg, name: str):
    """Every (containing message, repeated container) of field ``name`` below ``msg``."""
    for fd, value in msg.ListFields():
        if fd.full_name == name:
            yield msg, value
        if fd.type != F.TYPE_MESSAGE:
            continue
        for item in (value if fd.is_repeated else [value]):
            yield from _instances(item, name)


@pytest.mark.parametrize("field", sorted(REPEATED_BOUNDS))
def test_each_repeated_field_past_its_limit_is_refused(field):
    plan = _rich_plan()
    found = list(_instances(plan, field))
    assert found, f"the rich plan has no {field}"
    _msg, items = max(found, key=lambda mi: len(mi[1]))
    name = REPEATED_BOUNDS[field]
    tight = replace(LIMITS, **{name: len(items)})
    if items and hasattr(items[0], "CopyFrom"):
        items.add().CopyFrom(items[0])
    else:
        items.append(items[0])
    with pytest.raises(PlanLimitError) as ei:
        verify_plan(plan, limits=tight)
    assert ei.value.name == name, str(ei.value)


# ---------------------------------------------------------------- values

NP = pytest.importorskip("numpy")


def _tensor(framework: str, dtype: str, shape: list[int], data: bytes) -> pb.Value:
    return pb.Value(tensor_value=pb.TensorValue(framework=framework, dtype=dtype, shape=shape,
                                                data=data))


# The audit's values that check accepted and `cgc run` failed on, plus their neighbours:
# value -> what the refusal names.
BAD_VALUES = {
    "bigint of 100,000 digits": (pb.Value(bigint_value="9" * 100_000), "Limits.bigint_digits"),
    "bigint not a number": (pb.Value(bigint_value="12a"), "not a decimal integer"),
    "empty value": (pb.Value(), "empty value"),
    "numpy dtype O": (_tensor("numpy", "|O", [1], b"\0" * 8), "numpy dtype '|O'"),
    "numpy dtype junk": (_tensor("numpy", "f4x", [1], b"\0" * 4), "numpy dtype"),
    "shape 2**40": (_tensor("numpy", "<f4", [2**40], b""), "Limits.tensor_bytes"),
    "shape without data": (_tensor("numpy", "<f4", [1000], b""), "holds 4,000 bytes"),
    "shape beyond numpy": (_tensor("numpy", "<f4", [2**62, 0], b""), "Limits.tensor_bytes"),
    "negative size": (_tensor("numpy", "<f4", [-1], b""), "negative size"),
    "data too short": (_tensor("numpy", "<f4", [3], b"\0" * 8), "its data has 8"),
    "numpy scalar with a shape": (_tensor("numpy-scalar", "<f4", [1], b"\0" * 4), "scalar"),
    "torch dtype Tensor": (_tensor("torch", "Tensor", [1], b"\0" * 4), "torch dtype 'Tensor'"),
    "unknown framework": (_tensor("jax", "float32", [1], b"\0" * 4), "framework 'jax'"),
    "too many dims": (_tensor("numpy", "<f4", [1] * 40, b"\0" * 4), "Limits.tensor_dims"),
    "list as a dict key": (
        pb.Value(map_value=pb.ValueMap(entries=[pb.MapEntry(
            key=pb.Value(list_value=pb.ValueList(items=[pb.Value(int_value=1)])),
            value=pb.Value(int_value=2))])), "a list used as a dict key"),
    "dict as a dict key": (
        pb.Value(map_value=pb.ValueMap(entries=[pb.MapEntry(
            key=pb.Value(map_value=pb.ValueMap()), value=pb.Value(int_value=2))])),
        "a dict used as a dict key"),
    "array as a dict key": (
        pb.Value(map_value=pb.ValueMap(entries=[pb.MapEntry(
            key=_tensor("numpy", "<f4", [1], b"\0" * 4), value=pb.Value(int_value=2))])),
        "array used as a dict key"),
    "too deep": (None, "Limits.value_depth"),
}


def _deep(n: int) -> pb.Value:
    v = pb.Value(int_value=1)
    for _ in range(n):
        w = pb.Value()
        w.list_value.items.add().CopyFrom(v)
        v = w
    return v


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_values_that_cannot_decode_are_refused_naming_where(case):
    value, match = BAD_VALUES[case]
    value = _deep(LIMITS.value_depth + 1) if value is None else value
    with pytest.raises(PlanStructureError, match=match):
        check_value(value, "example_args[0]", LIMITS)
    # and decoding an unchecked plan's value is typed too (exit 4), never a raw error
    if case not in ("too deep", "too many dims", "shape beyond numpy", "negative size",
                    "numpy scalar with a shape"):
        with pytest.raises(ValueDecodeError) as ei:
            decode_value(value, "example_args[0]")
        assert ei.value.exit_code == 4 and "example_args[0]" in str(ei.value)


def test_bad_values_are_refused_where_the_plan_holds_them():
    base = cgc.compile_file(EXAMPLES / "echo.py").proto
    bad = pb.Value(bigint_value="1" * 5000)
    places = {
        "example_args[0]": lambda p: p.example_args[0].CopyFrom(bad),
        "actor ": lambda p: p.graph.actors[0].ctor_args.append(bad),
        "args[1]": lambda p: next(n for n in p.graph.nodes if n.kind == pb.CALL).args.add(
            constant=bad),
    }
    for where, put in places.items():
        plan = pb.Plan()
        plan.CopyFrom(base)
        put(plan)
        with pytest.raises(PlanLimitError, match="digits") as ei:
            check_structure(plan)
        assert where in str(ei.value)


GOOD = [None, True, -(2**70), 2**70, 1.5, math.inf, "é", b"\0", [1, (2, "x")], {(1, 2): {"a": None}},
        {1.5: 2, None: 3, b"k": 4}]


@pytest.mark.parametrize("i", range(len(GOOD)))
def test_what_check_accepts_decodes_back(i):
    value, _ = encode_value(GOOD[i])
    check_value(value, "v", LIMITS)
    assert decode_value(value) == GOOD[i]


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int8", "int16", "int32",
                                   "int64", "uint8", "uint16", "uint32", "uint64", "bool",
                                   "complex64", "complex128", "<M8[ns]", "<m8[s]", "<U3",
                                   "|S2", "|V4"])
def test_every_numpy_dtype_check_accepts_decodes(dtype):
    arr = NP.zeros((2, 3), dtype=dtype)
    value, _ = encode_value(arr)
    check_value(value, "v", LIMITS)
    assert NP.array_equal(decode_value(value), arr)
    scalar, _ = encode_value(arr[0, 0])
    check_value(scalar, "v", LIMITS)
    decode_value(scalar)


@pytest.mark.parametrize("dtype", sorted(TORCH_DTYPE_BYTES))
def test_every_torch_dtype_check_accepts_decodes(dtype):
    torch = pytest.importorskip("torch")
    if not isinstance(getattr(torch, dtype, None), torch.dtype):
        pytest.skip(f"this torch has no {dtype}")
    t = torch.zeros((2, 3), dtype=torch.float32).to(getattr(torch, dtype))
    value, _ = encode_value(t)
    check_value(value, "v", LIMITS)
    assert decode_value(value).dtype == t.dtype


def test_encode_refuses_what_a_plan_cannot_hold():
    nested: list = []
    for _ in range(LIMITS.value_depth + 1):
        nested = [nested]
    with pytest.raises(ValueEncodeError, match="nested more than"):
        encode_value(nested, path="example_inputs()[0]")
    with pytest.raises(ValueEncodeError, match="numpy dtype"):
        encode_value(NP.zeros(2, dtype=NP.longdouble) if NP.dtype(NP.longdouble).itemsize > 8
                     else NP.zeros(2, dtype=object))


# ---------------------------------------------------------------- actor options

OPTIONS = {
    "num_cpus inf": (lambda o: setattr(o, "num_cpus", math.inf), PlanLimitError, "resource_amount"),
    "num_cpus nan": (lambda o: setattr(o, "num_cpus", math.nan), PlanStructureError, ">= 0"),
    "num_gpus negative": (lambda o: setattr(o, "num_gpus", -1), PlanStructureError, ">= 0"),
    "memory huge": (lambda o: setattr(o, "memory", 1e300), PlanLimitError, "memory_bytes"),
    "tiny fraction": (lambda o: setattr(o, "num_cpus", 1e-9), PlanStructureError, "0.0001"),
    "resource CPU": (lambda o: o.resources.add(name="CPU", amount=1), PlanStructureError,
                     "Ray's own"),
    "resource twice": (lambda o: [o.resources.add(name="x", amount=1) for _ in range(2)],
                       PlanStructureError, "twice"),
    "resource inf": (lambda o: o.resources.add(name="x", amount=math.inf), PlanLimitError,
                     "resource_amount"),
    "max_concurrency 0": (lambda o: setattr(o, "max_concurrency", 0), PlanStructureError,
                          "max_concurrency"),
    "runtime_env not json": (lambda o: setattr(o, "runtime_env_json", "{"),
                             PlanStructureError, "JSON object"),
    "runtime_env deep": (lambda o: setattr(o, "runtime_env_json", "[" * 100_000),
                         PlanStructureError, "JSON object"),
}


@pytest.mark.parametrize("case", sorted(OPTIONS))
def test_actor_options_ray_refuses_are_refused_first(case):
    mutate, error, match = OPTIONS[case]
    plan = cgc.compile_file(EXAMPLES / "chain.py").proto
    mutate(plan.graph.actors[0].options)
    with pytest.raises(error, match=match):
        check_structure(plan)
