"""Every plan ``cgc check`` accepts starts, or fails typed (issue 20): a seeded fuzz.

Real plans compiled from ``examples/`` are mutated where the audit found plans that check
accepted and ``cgc run`` then failed on with "internal error": values (example inputs,
constructor arguments, constants: bigints, empty values, dtypes, shapes, dict keys,
nesting), actor options (resources, memory, concurrency, runtime_env), counts (inputs,
keyword fields, returns, capacity, slots). Each mutated plan goes through the file format
(written, read back) and ``verify_plan``; every plan it accepts then goes through what
``cgc run`` and ``Plan.start()`` do before the first actor exists: ``cgc.load``, the run
configuration, the example inputs decoded as ``cgc run`` decodes them and checked against
the graph's arguments as ``execute()`` checks them, the driver's endpoints and pickers, each
actor's constructor arguments and each call's constants decoded as the runtime decodes
them, and the local Ray's sizing (``ensure_ray``'s ``local_ray_sizing``) and placement
demand. Each must succeed or raise a ``CgcError`` with exit code 4 (an invalid plan); any
other exception, or another exit code, fails the test naming the seed and the mutation.

Deterministic (fixed seed), no GPU, no Ray: it stops where actors would be created.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from pathlib import Path

import pytest

import cgc
from cgc.plan_schema import CgcError, read_plan_bytes, write_plan_bytes
from cgc.plan_schema import plan_pb2 as pb
from cgc.plan_schema.defaults import RunConfig
from cgc.plan_schema.errors import EXIT_INVALID_PLAN
from cgc.plan_schema.inputs import input_problems
from cgc.plan_schema.values import decode_value
from cgc.plan_schema.verify import verify_plan

SEED = 20261202
CASES = 70  # mutated plans per example
EXAMPLES = ["echo", "chain", "fanout", "multi_return", "allreduce"]  # no torch, no ray import
ROOT = Path(__file__).resolve().parents[3] / "examples"


@pytest.fixture(scope="module")
def plans() -> dict[str, pb.Plan]:
    return {n: cgc.compile_file(ROOT / f"{n}.py").proto for n in EXAMPLES}


# ---------------------------------------------------------------- mutations


def _tensor(framework: str, dtype: str, shape: list[int], nbytes: int) -> pb.Value:
    return pb.Value(tensor_value=pb.TensorValue(framework=framework, dtype=dtype, shape=shape,
                                                data=b"\1" * nbytes))


def _values(rnd: random.Random, depth: int = 0) -> pb.Value:
    """A value, often one the runtime could not decode."""
    pick = rnd.randrange(16 if depth < 3 else 10)
    if pick == 0:
        return pb.Value(bigint_value=rnd.choice(["7" * 100_000, "7" * 4300, "-" + "7" * 4301,
                                                 "12a", "", "-", "+5", "0" * 30]))
    if pick == 1:
        return pb.Value()  # no kind
    if pick == 2:
        dtype = rnd.choice(["<f4", "|O", "O", "<f16", "<U0", "|S0", "f4x", "<M8[ns]", "|b1",
                            "<c8", "<V4", "|V0", ">i2", "=u8", "<m8[xs]"])
        shape = rnd.choice([[], [0], [3], [2, 2], [2**40], [-1], [2**62, 0], [1] * 40])
        framework = rnd.choice(["numpy", "numpy", "numpy-scalar", "jax"])
        return _tensor(framework, dtype, shape, rnd.choice([0, 1, 4, 8, 12, 16]))
    if pick == 3:
        dtype = rnd.choice(["float32", "Tensor", "qint8", "uint16", "complex32", "bool",
                            "bfloat16", "float8_e4m3fn", "__class__"])
        shape = rnd.choice([[], [2], [2**40], [-2], [0, 2**62]])
        return _tensor("torch", dtype, shape, rnd.choice([0, 2, 4, 8]))
    if pick == 4:
        return pb.Value(float_value=rnd.choice([math.nan, math.inf, -0.0, 1e308]))
    if pick == 5:
        return pb.Value(str_value=rnd.choice(["", "é", "x" * 1000]))
    if pick == 6:
        return pb.Value(bytes_value=rnd.randbytes(rnd.randrange(40)))
    if pick == 7:
        return pb.Value(int_value=rnd.choice([0, -1, 2**63 - 1, -(2**63)]))
    if pick == 8:
        return pb.Value(null=pb.NULL_VALUE)
    if pick == 9:
        return pb.Value(bool_value=True)
    if pick in (10, 11):
        v = pb.Value()
        items = (v.list_value if pick == 10 else v.tuple_value)
        items.SetInParent()
        items.items.extend(_values(rnd, depth + 1) for _ in range(rnd.randrange(4)))
        return v
    if pick == 12:  # deep
        v = pb.Value(int_value=1)
        for _ in range(rnd.choice([5, 31, 32, 33, 45])):
            w = pb.Value()
            w.list_value.items.add().CopyFrom(v)
            v = w
        return v
    v = pb.Value()
    v.map_value.SetInParent()
    for _ in range(rnd.randrange(1, 3)):
        v.map_value.entries.add(key=_values(rnd, depth + 1), value=_values(rnd, depth + 1))
    return v


def _some_value(plan: pb.Plan, rnd: random.Random) -> str:
    """Replace or add one value: an example input, a constructor argument, a constant."""
    where = rnd.randrange(4)
    new = _values(rnd)
    if where == 0 and plan.example_args:
        i = rnd.randrange(len(plan.example_args))
        plan.example_args[i].CopyFrom(new)
        return f"example_args[{i}] = {str(new)[:60]!r}"
    if where == 1:
        a = rnd.choice(plan.graph.actors)
        a.ctor_args.append(new)
        return f"actor {a.name} ctor_args += {str(new)[:60]!r}"
    calls = [n for n in plan.graph.nodes if n.kind == pb.CALL]
    n = rnd.choice(calls)
    consts = [a for a in n.args if a.WhichOneof("kind") == "constant"]
    if consts and rnd.random() < 0.5:
        consts[0].constant.CopyFrom(new)
        return f"node {n.name} constant = {str(new)[:60]!r}"
    n.kwargs.add(name=rnd.choice(["z", "k"]), arg=pb.Arg(constant=new))
    return f"node {n.name} kwarg constant {str(new)[:60]!r}"


_AMOUNTS = [0.0, 0.5, 1.0, 3.0, 1e-9, -1.0, math.inf, -math.inf, math.nan, 1e300, 2.0**53,
            65_536.0, 65_537.0]


def _some_option(plan: pb.Plan, rnd: random.Random) -> str:
    a = rnd.choice(plan.graph.actors)
    o = a.options
    what = rnd.randrange(7)
    if what in (0, 1, 2):
        name = ("num_cpus", "num_gpus", "memory")[what]
        v = rnd.choice(_AMOUNTS + [2.0**60])
        setattr(o, name, v)
        return f"actor {a.name} {name} = {v}"
    if what == 3:
        name = rnd.choice(["", "CPU", "GPU", "memory", "object_store_memory", "foo", "node:x"])
        v = rnd.choice(_AMOUNTS)
        o.resources.add(name=name, amount=v)
        return f"actor {a.name} resource {name!r} = {v}"
    if what == 4:
        v = rnd.choice([0, 1, 2, 2**32 - 1])
        o.max_concurrency = v
        return f"actor {a.name} max_concurrency = {v}"
    if what == 5:
        v = rnd.choice(["{", "[]", "{}", "null", '{"env_vars": {"A": "1"}}', "[" * 5000])
        o.runtime_env_json = v
        return f"actor {a.name} runtime_env_json = {v[:20]!r}"
    o.actor_name = rnd.choice(["", "x", "é"])
    return f"actor {a.name} actor_name = {o.actor_name!r}"


def _some_count(plan: pb.Plan, rnd: random.Random) -> str:
    g, low = plan.graph, plan.lowered
    what = rnd.randrange(8)
    if what == 0:
        plan.example_args.add(int_value=1)
        return "one example argument more"
    if what == 1 and plan.example_args:
        del plan.example_args[-1]
        return "one example argument fewer"
    if what == 2:
        plan.example_kwargs.add(name=rnd.choice(["k", "z", ""]), value=pb.Value(int_value=2))
        return "an example keyword argument"
    if what == 3:
        plan.has_example_inputs = not plan.has_example_inputs
        return f"has_example_inputs = {plan.has_example_inputs}"
    if what == 4:
        g.num_positional = rnd.choice([0, 2, 4096, 4097, 2**32 - 1])
        return f"num_positional = {g.num_positional}"
    if what == 5:
        g.keyword_fields.append(rnd.choice(["k", "a", "zz"]))
        return f"keyword field {g.keyword_fields[-1]!r}"
    if what == 6:
        plan.config.capacity = rnd.choice([1, 2, 3, 1024, 1025])
        for cid in {*low.input_channels, *low.output_channels}:
            if rnd.random() < 0.8:
                low.channels[cid - 1].slots = max(plan.config.capacity, 1)
        return f"capacity {plan.config.capacity}"
    n = rnd.choice([n for n in g.nodes if n.kind == pb.CALL])
    n.num_returns = rnd.choice([0, 1, 2, 4097])
    return f"node {n.name} num_returns = {n.num_returns}"


MUTATIONS = (_some_value, _some_value, _some_option, _some_count)


# ---------------------------------------------------------------- what start() does


def _start_paths(data: bytes) -> None:
    """What ``cgc run`` and ``Plan.start()`` do before the first actor is created."""
    from cgc.cli.run_cmd import _inputs
    from cgc.runtime.actor.host import ctor_arguments
    from cgc.runtime.driver.cluster import RayInfo, actor_demand, gpu_notice, local_ray_sizing
    from cgc.runtime.driver.graph import CompiledGraph
    from cgc.runtime.driver.graph_ends import input_label, input_picker
    from cgc.runtime.driver.plan import Plan

    proto = read_plan_bytes(data, "fuzz.cgplan", trust=True)
    verify_plan(proto)  # start() checks again
    cfg = RunConfig.from_plan(proto.config)
    plan = Plan(proto)  # what cgc.load returns once trust is decided (trust is item 1's)
    args: list = []
    kwargs: dict = {}
    if proto.has_example_inputs:  # cgc run's inputs (else it asks for --input)
        args, kwargs = _inputs(plan, None)
        problems = input_problems(proto.graph, len(args), kwargs.keys())
        assert not problems, f"execute() would refuse the example inputs: {problems}"
    graph = CompiledGraph(plan, "fuzz", "cgc-fuzz-", cfg)
    nodes = proto.graph.nodes
    for cid in proto.lowered.input_channels:
        node = nodes[proto.lowered.channels[cid - 1].source.node]
        input_label(node)
        if proto.has_example_inputs:
            input_picker(node)(tuple(args), kwargs)
    del graph
    for actor in proto.graph.actors:
        ctor_arguments(actor)
        actor_demand(actor, False)
    for n in nodes:  # the executor decodes each call's constants in its actor
        for i, a in enumerate(n.args):
            if a.WhichOneof("kind") == "constant":
                decode_value(a.constant, f"node %{n.id} args[{i}]")
        for kw in n.kwargs:
            if kw.arg.WhichOneof("kind") == "constant":
                decode_value(kw.arg.constant, f"node %{n.id} kwargs[{kw.name!r}]")
    for gpus_here in (0, 1):
        sizing = local_ray_sizing(proto, gpus_here)
        assert isinstance(sizing["num_cpus"], int) and sizing["num_cpus"] >= 1
    gpu_notice(proto, RayInfo(True, False, True, "node"), "auto")


def _outcome(data: bytes) -> str:
    """"refused" / "started" / what went wrong."""
    try:
        verify_plan(read_plan_bytes(data, "fuzz.cgplan", trust=True))
    except CgcError:
        return "refused"
    try:
        _start_paths(data)
    except CgcError as exc:
        if exc.exit_code != EXIT_INVALID_PLAN:
            return f"accepted, then {type(exc).__name__} with exit {exc.exit_code}: {exc}"
        return "refused at start"
    except Exception as exc:  # noqa: BLE001 - the point of the test
        return f"accepted, then {type(exc).__name__}: {str(exc)[:300]}"
    return "started"


_FINE = ("refused", "started", "refused at start")


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_plan_check_accepts_starts_or_fails_typed(plans, name, tmp_path):
    base = plans[name]
    rnd = random.Random(f"{SEED}:{name}")
    seen: dict[str, int] = {}
    problems = []
    for k in range(CASES):
        plan = pb.Plan()
        plan.CopyFrom(base)
        whats = [rnd.choice(MUTATIONS)(plan, rnd) for _ in range(1 + k % 2)]
        data = write_plan_bytes(plan)
        got = _outcome(data)
        key = got if got in _FINE else "bad"
        seen[key] = seen.get(key, 0) + 1
        if key == "bad":
            problems.append(f"{name} case {k}: {'; '.join(whats)}: {got}")
        if k < 3 and got == "started":  # the same through cgc.load, from a file
            path = tmp_path / f"{k}.cgplan"
            path.write_bytes(data)
            try:
                cgc.load(path, trust=True)
            except CgcError as exc:
                assert exc.exit_code == EXIT_INVALID_PLAN, str(exc)
    assert not problems, "\n".join(problems[:10])
    # the fuzz has teeth: it makes plans the check refuses and plans that start
    assert seen.get("refused", 0) > 5 and seen.get("started", 0) > 5, seen


def _mutated(fn: Callable[[pb.Plan], None]) -> bytes:
    plan = cgc.compile_file(ROOT / "echo.py").proto
    fn(plan)
    return write_plan_bytes(plan)


# The audit's seven plans that check accepted and start failed on, one by one.
AUDIT = {
    "bigint of 100,000 digits": lambda p: p.example_args[0].__setattr__("bigint_value",
                                                                       "9" * 100_000),
    "empty Value": lambda p: p.example_args[0].Clear(),
    "numpy dtype O": lambda p: p.example_args[0].CopyFrom(_tensor("numpy", "|O", [1], 8)),
    "shape [2**40]": lambda p: p.example_args[0].CopyFrom(_tensor("numpy", "<f4", [2**40], 4)),
    "torch dtype Tensor": lambda p: p.example_args[0].CopyFrom(
        _tensor("torch", "Tensor", [1], 4)),
    "dict with a list key": lambda p: p.example_args[0].CopyFrom(pb.Value(
        map_value=pb.ValueMap(entries=[pb.MapEntry(key=pb.Value(list_value=pb.ValueList()),
                                                   value=pb.Value(int_value=1))]))),
    "num_cpus inf": lambda p: setattr(p.graph.actors[0].options, "num_cpus", math.inf),
}


@pytest.mark.parametrize("case", sorted(AUDIT))
def test_the_audits_plans_are_refused_by_check(case):
    assert _outcome(_mutated(AUDIT[case])) == "refused"


GENERIC = 60  # mutations of any field (test_fuzz_plans' mutator), per example


@pytest.mark.parametrize("name", EXAMPLES)
def test_any_field_mutated_still_starts_or_fails_typed(plans, name):
    """The same through the field-by-field mutator of ``test_fuzz_plans``: a broken pickle
    (which only the trust decision lets through) is the one thing left to decoding."""
    from test_fuzz_plans import _mutate

    rnd = random.Random(f"{SEED}:generic:{name}")
    problems = []
    for k in range(GENERIC):
        plan = pb.Plan()
        plan.CopyFrom(plans[name])
        whats = [_mutate(plan, rnd) for _ in range(1 + k % 3)]
        got = _outcome(write_plan_bytes(plan))
        if got not in _FINE:
            problems.append(f"{name} case {k}: {'; '.join(whats)}: {got}")
    assert not problems, "\n".join(problems[:10])
